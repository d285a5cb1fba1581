"""Matmul rule: dense / matmul / batch-matmul with fused prologue and epilogue.

Schedule (a GotoBLAS-style register kernel expressed in TIR):

* the einsum is normalised to ``C[s, i, j] += A[s, i, k] * B[s, j, k]`` (dlight's index maps);
* B is packed once into ``Bp[s, j // nr, k, j % nr]`` so the micro-kernel streams one
  contiguous ``k x nr`` panel (producers of B, e.g. a transpose or cast, run inside the pack);
  a row-major B is read in place when M is small or symbolic (the pack would not pay off);
* a symbolic or ragged M is padded to whole ``mr`` tiles (one copy of A), so the hot loop
  has no row guard; with a fused ``N * S`` row axis the epilogue iterates fused rows;
* each parallel task owns an ``mr x nr`` tile of C held in registers (``cache_write`` to
  ``local``, ``mr`` rows unrolled, ``nr`` columns vectorised) over the whole K loop;
* the epilogue (bias, activation, residual...) runs on the tile right after it is finished,
  while it is still in registers / L1: no intermediate C ever reaches memory;
* row stages: a norm computing A (layer norm / RMSNorm before a projection) runs as the
  reduction rule's parallel row loop before the GEMM, and reductions of C (a softmax of
  scores, a norm after a projection) with what follows them as one after it, in the same
  kernel; the rows between the two go through cache.

Tile sizes come from the :class:`HardwareSpec`: ``nr`` is two SIMD vectors, ``mr`` makes the
``mr * nr / lanes`` accumulators fill half of the vector register file (the rest holds the B
vectors, the A broadcast and what LLVM keeps live), and the whole ``mr x K`` A strip plus a
``K x nr`` B panel are meant to stay in L2 (K blocking for K beyond that is not done yet).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import IterKind, detect_iter_traits, get_index_map
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ...attrs import PREPACK_ATTR
from ...hardware import HardwareSpec
from ..base import ScheduleRule
from ..tir_writer import static_int
from ._util import (
    constant_param,
    inline_spatial,
    is_cheap,
    is_reduction,
    is_spatial,
    knob_choices,
    lanes,
    parallel_vectorize,
    pick_vector_width,
    reads_along_reduction,
    root_blocks,
    static_extent,
    vector_friendly,
)
from .parallel import ROW_PASS_OPS, gemv_panel, gemv_pays, matmul_tile_pays, pack_pays
from .reduction import schedule_row_chain

#: Row tiles that must share each packed B panel for packing a row-major B to pay off.
PACK_MIN_ROW_TILES = 12


@dataclass(frozen=True)
class MatmulTiles:
    """Register tile of the micro-kernel and whether B is packed."""

    mr: int
    nr: int
    pack_b: bool


def derive_tiles(
    hw: HardwareSpec,
    dtype_bits: int,
    m: int | None,
    n: int | None,
    b_j_contiguous: bool,
    b_constant: bool = False,
) -> MatmulTiles:
    """Micro-kernel tile for ``hw``; ``m``/``n`` are None when symbolic.

    ``nr`` = two vectors (one broadcast of A feeds two FMAs); ``mr`` = the power of two
    whose accumulators take half the vector registers. Static ``n`` shrinks ``nr`` to the
    widest power of two that divides it (no scalar tail), static ``m`` caps ``mr``. A
    constant B is always packed: the packing runs once, at compile time.
    """
    vec = lanes(hw, dtype_bits)
    nr_vectors = 2 if hw.num_vector_registers >= 16 else 1
    nr = nr_vectors * vec
    budget = max(1, hw.num_vector_registers // 2 // nr_vectors)
    mr = 1
    while mr * 2 <= budget:
        mr *= 2
    if n is not None:
        # Narrow to a divisor of n while it stays a whole vector; below that pad N.
        narrowed = pick_vector_width(n, nr)
        nr = narrowed if narrowed >= vec else nr
    if m is not None:
        mr = max(1, min(mr, m))
    # Packing B costs a pass over K x N (read + write) on every call and pays off only when
    # many row tiles reuse each panel; a row-major B (contiguous along j) is otherwise read
    # in place. Measured (768x2304 and 3072x768, znver4, 1 thread), in place / packed:
    # 0.15-0.30 at M = 1, 0.55-0.73 at M = 16, 0.80 at M = 77, 1.04-1.11 at M = 128. A
    # symbolic M reads in place: small M is where packing costs most. A static N that no
    # whole tile divides is padded: read in place, every B load of the hot loop goes
    # through the padding guard; packed panels are padded once (pointwise convs as GEMMs,
    # N = 196 / 200 pixels, M = 64-95: packed 0.40-0.54 of the in-place time, 2 threads).
    pack_b = (
        b_constant or not b_j_contiguous or (m is not None and m >= PACK_MIN_ROW_TILES * mr)
        or (n is not None and n % nr != 0)
    )
    return MatmulTiles(mr=mr, nr=nr, pack_b=pack_b)


def _panel_stationary(
    hw: HardwareSpec, k: int | None, mr: int, nr: int, bits: int, packed: bool = True
) -> bool:
    """Whether row tiles should be the inner tile loop (each ``K x nr`` B panel stays in L2).

    Row tiles outer keep an ``mr x K`` A strip in L1 and stream all of B per row tile;
    column panels outer keep a B panel in L2 and stream A per panel, ``nr / mr`` times less
    traffic from beyond L2. A packed panel pays off once the A strip no longer fits L1;
    a B read in place (``K`` rows ``N`` apart) always. Measured (znver4, 1 thread, panels
    outer / rows outer), packed: 0.77 on 512x4096x1024, 0.92 on 2048x3072x768, 1.0 on
    128x3072x768, but 1.05 on 1024^3 and 1.18 on 512^3 (A strip in L1); in place, M
    symbolic = 128: 0.69 on K=768 N=3072, 0.86 on 768x768 (0.95 at M = 16).
    """
    l1, l2 = hw.level("L1"), hw.level("L2")
    if k is None or l1 is None or l2 is None:
        return False
    elem = bits // 8
    panel_fits = k * nr * elem <= l2.capacity_bytes // 2
    return panel_fits and (not packed or mr * k * elem > l1.capacity_bytes)


def _main_block(sch: s_tir.Schedule, blocks: list[SBlockRV]) -> SBlockRV | None:
    """The GEMM block: the one reduction of two buffers with a dlight index map. Other
    reductions are allowed only as a row stage feeding its A operand (:func:`_row_stage`)."""
    reductions = [b for b in blocks if not is_spatial(sch, b)]
    if not reductions or not all(is_reduction(sch, b) for b in reductions):
        return None
    candidates = reductions if len(reductions) == 1 else [
        b for b in reductions
        if len({r.source for r in sch.get(b).reads}) == 2 and reads_along_reduction(sch.get(b))]
    if len(candidates) != 1:
        return None
    main = candidates[0]
    stmt = sch.get(main)
    # Operands indexed by plain iterators only: a window (y + ry) is a convolution, which
    # dlight's index maps would otherwise accept as an implicit GEMM.
    for region in (*stmt.reads, *stmt.writes):
        for r in region.region:
            if not isinstance(r.min, (tirx.Var, tirx.IntImm)):
                return None
    if get_index_map(stmt) is None:
        return None
    if len(reductions) > 1:
        others = [sch.get(r) for r in reductions if r != main]
        for stage in (_row_stage(sch, main), _row_tail(sch, main)):
            staged = {sch.get(b) for b in stage or ()}
            if stage and all(r in staged for r in others):
                return main
        return None
    return main


def _reached(sch: s_tir.Schedule, starts: list[SBlockRV], step) -> set:
    """Statements of the blocks reached from ``starts`` by repeated ``step``
    (``sch.get_producers`` or ``sch.get_consumers``), ``starts`` excluded."""
    seen = set()
    pending = list(starts)
    while pending:
        for block in step(pending.pop()):
            if sch.get(block) not in seen:
                seen.add(sch.get(block))
                pending.append(block)
    return seen


def _row_stage(sch: s_tir.Schedule, main: SBlockRV) -> list[SBlockRV] | None:
    """The root blocks computing the GEMM's A operand (its producer and that producer's
    ancestors, in dataflow order) when they include a reduction: a layer / RMS norm
    feeding the matmul. None without such a reduction."""
    a_source = sch.get(main).reads[0].source
    feeding = [p for p in sch.get_producers(main)
               if any(w.source.same_as(a_source) for w in sch.get(p).writes)]
    if len(feeding) != 1:
        return None
    seen = {sch.get(feeding[0])} | _reached(sch, feeding, sch.get_producers)
    stage = [b for b in root_blocks(sch) if sch.get(b) in seen]
    if len(stage) != len(seen) or all(is_spatial(sch, b) for b in stage):
        return None
    return stage


def _row_tail(sch: s_tir.Schedule, main: SBlockRV) -> list[SBlockRV] | None:
    """The reductions downstream of the GEMM and what follows them (root blocks in dataflow
    order): a softmax of the scores, a norm of the projection. The spatial blocks before
    them (a scale) stay the GEMM's tile epilogue. None without such a reduction."""
    below = [b for b in root_blocks(sch) if sch.get(b) in _reached(sch, [main],
                                                                    sch.get_consumers)]
    reductions = [b for b in below if not is_spatial(sch, b)]
    if not reductions:
        return None
    tail = {sch.get(b) for b in reductions} | _reached(sch, reductions, sch.get_consumers)
    return [b for b in below if sch.get(b) in tail]


def _row_pass(sch: s_tir.Schedule, blocks: list[SBlockRV], hw: HardwareSpec, chain) -> bool:
    """Schedule ``blocks`` as the reduction rule's row loop (``chain()``: its blocks after
    an rfactor), its parallel decision on :data:`ROW_PASS_OPS` per element of the last."""
    extents = [static_extent(sch, lp) for lp in sch.get_loops(blocks[-1])]
    work = None if None in extents else ROW_PASS_OPS * math.prod(extents)
    return schedule_row_chain(sch, blocks, hw, work, chain)


def _stage_tail(sch: s_tir.Schedule, names: set[str], hw: HardwareSpec) -> bool:
    """Schedule the blocks called ``names`` (still at the root, after the GEMM) as a row
    pass: a softmax of the GEMM's rows read back from cache."""
    gemm = {sch.get(b).name_hint for b in root_blocks(sch)} - names
    blocks = [b for b in root_blocks(sch) if sch.get(b).name_hint in names]
    return bool(blocks) and _row_pass(
        sch, blocks, hw, lambda: [b for b in root_blocks(sch) if sch.get(b).name_hint not in gemm])


def _stage_rows(sch: s_tir.Schedule, main: SBlockRV, hw: HardwareSpec) -> bool | None:
    """Compute a norm feeding A as a row-wise pass before the GEMM, inside this kernel
    (the reduction rule's row loop): the normalised A is materialised once and the GEMM
    reads it from cache. Inlined into the GEMM's loads instead, the normalisation would run
    once per column panel. None when there is no such stage, False when it cannot be
    scheduled."""
    stage = _row_stage(sch, main)
    if stage is None:
        return None
    anchor = sch.get(stage[-1])

    def chain() -> list[SBlockRV]:
        blocks = _row_stage(sch, main) or []
        # the anchor stays last (rfactor's write-back blocks come after it in root order)
        return [*(b for b in blocks if not sch.get(b).same_as(anchor)),
                *(b for b in blocks if sch.get(b).same_as(anchor))]

    return _row_pass(sch, stage, hw, chain)


def _b_j_contiguous(block: tirx.stmt.SBlock) -> bool:
    """Whether B's innermost index is a J (output-column) iterator."""
    a_vars = {v for r in block.reads[0].region for v in tirx.analysis.undefined_vars(r.min)}
    c_vars = {v for r in block.writes[0].region for v in tirx.analysis.undefined_vars(r.min)}
    last = block.reads[1].region[-1].min
    return isinstance(last, tirx.Var) and last in c_vars and last not in a_vars


def _chain_keeps_last_axis(sch: s_tir.Schedule, block: SBlockRV, index: int) -> bool:
    """Whether the spatial chain feeding read ``index`` of ``block`` (the chain
    :func:`_inline_operand` would inline) reads every input along its own innermost axis.

    A transpose in the chain does not: inlined, it turns a contiguous row of B into a
    gather with a stride of a whole row (``fused_transpose1_transpose2_matmul1`` of ViT,
    29 us against 1 us predicted).
    """
    pending = [(block, sch.get(block).reads[index].source)]
    seen = 0
    while pending and seen < 16:
        consumer, source = pending.pop()
        feeding = [
            p
            for p in sch.get_producers(consumer)
            if any(w.source.same_as(source) for w in sch.get(p).writes)
        ]
        if len(feeding) != 1 or not is_spatial(sch, feeding[0]):
            continue
        seen += 1
        stmt = sch.get(feeding[0])
        if len(stmt.writes) != 1:
            return False
        last = stmt.writes[0].region[-1].min
        for read in stmt.reads:
            extent = read.source.shape[-1] if len(read.source.shape) else 1
            if isinstance(extent, tirx.IntImm) and extent.value == 1:
                continue  # a broadcast along the innermost axis reads one element
            if not read.region[-1].min.same_as(last):
                return False
            pending.append((feeding[0], read.source))
    return True


def _largest_divisor(extent: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(cap, extent)) + 1) if extent % d == 0)


def _fused_inner_extents(block: tirx.stmt.SBlock) -> tuple:
    """Extent of the innermost I and J iterators when several fuse into one axis.

    Returns ``(inner_i, inner_j)``; each is None when that axis is a single iterator, an
    ``int`` when static, or the symbolic extent.
    """
    traits = detect_iter_traits(block)
    if traits is None:
        return None, None
    c_traits = traits[2]
    result = []
    for kind in (IterKind.kIter_I, IterKind.kIter_J):
        of_kind = [t for t in c_traits if t.kind == kind]
        if len(of_kind) <= 1:
            result.append(None)
            continue
        ext = of_kind[-1].extent
        result.append(int(ext.value) if isinstance(ext, tirx.IntImm) else ext)
    return tuple(result)


def _inline_operand(
    sch: s_tir.Schedule, block: SBlockRV, index: int, cheap_only: bool = False
) -> None:
    """Inline the chain (reindex, pad, transpose, cast...) feeding read ``index`` of ``block``.

    With ``cheap_only`` the chain stops at a producer calling a costly intrinsic.
    """
    while True:
        source = sch.get(block).reads[index].source
        feeding = [
            p
            for p in sch.get_producers(block)
            if any(w.source.same_as(source) for w in sch.get(p).writes)
        ]
        if len(feeding) != 1 or (cheap_only and not is_cheap(sch, feeding[0])):
            return
        if any(not is_spatial(sch, p) for p in sch.get_producers(feeding[0])):
            return  # it reads a row statistic: a staged norm (see _stage_rows) stays a pass
        try:
            sch.compute_inline(feeding[0])
        except ScheduleError:
            return


def _inline_producers(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """Inline the whole spatial producer chain of ``block`` into it."""
    changed = True
    while changed:
        changed = False
        for producer in sch.get_producers(block):
            if not is_spatial(sch, producer):
                continue
            try:
                sch.compute_inline(producer)
            except ScheduleError:
                continue
            changed = True
            break


def _row_fusion(block: tirx.stmt.SBlock):
    """Where several I iterators of the matmul ``block`` fuse into its row axis.

    Returns ``(first, last, extents)``: the first and last positions of the I axes among
    C's axes (consecutive) and C's extents; None when I is a single iterator.
    """
    traits = detect_iter_traits(block)
    if traits is None:
        return None
    c_traits = traits[2]
    pos = [p for p, t in enumerate(c_traits) if t.kind == IterKind.kIter_I]
    if len(pos) <= 1 or pos[-1] - pos[0] != len(pos) - 1:
        return None
    return pos[0], pos[-1], [t.extent for t in c_traits]


def _fuse_rows(sch: s_tir.Schedule, block: SBlockRV, rows: tuple) -> bool:
    """Rewrite ``block`` (an elementwise epilogue over C's shape) to iterate fused rows.

    A symbolic fused row axis (``N * S``) cannot be tiled by ``mr`` in ``(n, s)``
    coordinates: the region of a tile straddling a batch boundary is over-approximated
    to whole batches. Iterating ``n * S + s`` instead makes the tile region exact.
    """
    stmt = sch.get(block)
    first, last, extents = rows
    doms = [iv.dom.extent for iv in stmt.iter_vars]
    if len(doms) != len(extents) or any(
        not tvm_ffi.structural_equal(doms[p], extents[p]) for p in range(first, last + 1)
    ):
        return False

    def fuse(*iters):
        fused = iters[first]
        for p in range(first + 1, last + 1):
            fused = fused * doms[p] + iters[p]
        return (*iters[:first], fused, *iters[last + 1 :])

    index_map = tirx.IndexMap.from_func(fuse, ndim=len(doms))

    try:
        sch.transform_block_layout(block, index_map)
        for w in range(len(sch.get(block).writes)):
            if sch.get(block).writes[w].source.scope() == "global" and _is_alloc(
                sch, sch.get(block).writes[w].source
            ):
                sch.transform_layout(block, ("write", w), index_map)
    except ScheduleError:
        return False
    return True


def _placed_at_tile(sch: s_tir.Schedule, block: SBlockRV, tile,
                    tile_elems: int) -> s_tir.Schedule | None:
    """A copy of ``sch`` with ``block`` computed at ``tile``, or None when its region there
    is not the tile's own: not static, or not ``tile_elems`` elements (one per element of
    the ``mr x nr`` tile).

    An epilogue that reads a published output in unfused ``(n, s)`` coordinates while
    tiles run over fused rows ``n * S + s`` gets a per-tile region spanning batch
    boundaries: with the tiles in parallel it reads rows other tiles have not written yet
    (BERT-tiny with symbolic batch and sequence: wrong results on the first run after a
    shape change, 2 threads). So does a static region of another shape: a window reverse
    (``[49, C]`` rows reshaped to ``7 x 7`` and transposed to NCHW) after an 8-row tile
    got a ``32 x 2 x 1`` region, computed from rows of other tiles (TinyViT, Swin-T on a
    16-lane CPU: 0.4-0.9 relative error). Raises ``ScheduleError`` when the block cannot
    go there.
    """
    trial = sch.copy()
    trial.reverse_compute_at(block, tile, preserve_unit_loops=True)
    loops = trial.get_loops(block)
    anchor = trial.get(tile)
    inner = next((k for k, lp in enumerate(loops) if trial.get(lp).same_as(anchor)), None)
    if inner is None:
        return None
    extents = [static_extent(trial, lp) for lp in loops[inner + 1:]]
    if None in extents or math.prod(extents) != tile_elems:
        return None
    return trial


def _is_alloc(sch: s_tir.Schedule, buf) -> bool:
    """Whether ``buf`` is allocated inside the function (not a parameter)."""
    return any(b.same_as(buf) for b in sch.get(sch.get_sblock("root")).alloc_buffers)


@dataclass
class _Normalised:
    """A matmul PrimFunc normalised to ``C[s, i, j] += A[s, i, k] * B[s, j, k]``."""

    sch: s_tir.Schedule
    main: SBlockRV
    reindex_c: SBlockRV
    main_stmt: tirx.stmt.SBlock  # the block before normalisation
    prologue: list
    b_contiguous: bool
    b_constant: bool
    bits: int
    inner_i: object
    inner_j: object
    tiles: MatmulTiles
    tail: set  # names of the blocks of a row pass after the GEMM (a softmax of its rows)


def _normalise(func: tirx.PrimFunc, hw: HardwareSpec) -> _Normalised | s_tir.Schedule | None:
    """Step 1 of the rule; a row GEMV's schedule (or None) when there is no GEMM block."""
    sch = s_tir.Schedule(func)
    main = _main_block(sch, root_blocks(sch))
    if main is None:
        return _schedule_row_gemv(sch, hw)
    inline_spatial(sch, keep=(main,))
    staged = _stage_rows(sch, main, hw)
    if staged is False:
        return None
    tail = _row_tail(sch, main) if not staged else None
    tail_names = {sch.get(b).name_hint for b in tail or ()}
    # Producers of A stay materialised: inlining them would recompute them N times.
    a_buffer = sch.get(main).reads[0].source
    prologue = [] if staged else [
        b
        for b in sch.get_producers(main)
        if is_spatial(sch, b) and any(w.source.same_as(a_buffer) for w in sch.get(b).writes)
    ]
    main_stmt = sch.get(main)
    # B read in place must stay contiguous along j once its producers are inlined.
    b_contiguous = _b_j_contiguous(main_stmt) and _chain_keeps_last_axis(sch, main, 1)
    bits = int(main_stmt.writes[0].source.dtype.bits)
    b_constant = constant_param(sch.mod["main"], main_stmt.reads[1].source)
    inner_i, inner_j = _fused_inner_extents(main_stmt)

    reindex_a = sch.reindex(main, ("read", 0))
    reindex_b = sch.reindex(main, ("read", 1))
    reindex_c = sch.reindex(main, ("write", 0))
    block_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(reindex_a, ("write", 0), a_map)
    sch.transform_layout(reindex_b, ("write", 0), b_map)
    sch.transform_layout(reindex_c, ("read", 0), c_map)
    sch.transform_block_layout(main, block_map)
    _, i, j, _ = sch.get_loops(main)
    tiles = derive_tiles(
        hw, bits, static_extent(sch, i), static_extent(sch, j), b_contiguous, b_constant
    )
    return _Normalised(sch, main, reindex_c, main_stmt, prologue, b_contiguous, b_constant, bits,
                       inner_i, inner_j, tiles, tail_names)


class Matmul(ScheduleRule):
    """Register-tiled GEMM with packed B, tile-level epilogue and parallel tiles.

    Knobs: ``mr`` (rows of the register tile), ``nr`` (its columns, whole vectors),
    ``pack_b`` (pack B into panels or read it in place; a constant or strided B is always
    packed) and ``panel_outer`` (column panels as the outer tile loop).
    """

    name = "matmul"

    def knobs(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> dict[str, tuple]:
        norm = _normalise(func, hw)
        if not isinstance(norm, _Normalised):
            return {}
        sch, tiles = norm.sch, norm.tiles
        _, i, j, k = sch.get_loops(norm.main)
        m, n = static_extent(sch, i), static_extent(sch, j)
        vec = lanes(hw, norm.bits)
        regs = hw.num_vector_registers
        # Three-vector panels measured 10-30x slower (LLVM splits the odd vector width).
        nrs = [v * vec for v in (1, 2, 4) if n is None or v * vec <= max(n, vec)]
        mrs = [r for r in (1, 2, 4, 6, 8, 12, 16) if m is None or r <= m]
        space = {
            "mr": knob_choices([r for r in mrs if r * -(-tiles.nr // vec) <= regs - 4], tiles.mr),
            "nr": knob_choices([c for c in nrs if tiles.mr * (c // vec) <= regs - 4], tiles.nr),
            "panel_outer": knob_choices([False, True], _panel_stationary(
                hw, static_extent(sch, k), tiles.mr, tiles.nr, norm.bits, tiles.pack_b)),
        }
        if norm.b_contiguous and not norm.b_constant:
            space["pack_b"] = knob_choices([False, True], tiles.pack_b)
        return space

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec,
        knobs: dict | None = None,
    ) -> s_tir.Schedule | None:
        knobs = dict(knobs or {})
        norm = _normalise(func, hw)
        if not isinstance(norm, _Normalised):
            return norm
        sch, main, main_stmt, prologue = norm.sch, norm.main, norm.main_stmt, norm.prologue
        bits, b_constant = norm.bits, norm.b_constant
        inner_i, inner_j = norm.inner_i, norm.inner_j
        tiles = norm.tiles
        if knobs:
            pack = knobs.pop("pack_b", tiles.pack_b) or b_constant or not norm.b_contiguous
            tiles = MatmulTiles(mr=int(knobs.pop("mr", tiles.mr)),
                                nr=int(knobs.pop("nr", tiles.nr)), pack_b=bool(pack))
        panel_outer = knobs.pop("panel_outer", None)
        if knobs:
            raise ValueError(f"unknown matmul knobs: {sorted(knobs)}")
        reindex_c = norm.reindex_c
        batch, i, j, k = sch.get_loops(main)
        mr, nr = tiles.mr, tiles.nr
        # When several loops fuse into I (or J), e.g. a batched A times a shared B, a tile
        # must not straddle the inner extent, else the epilogue region is over-approximated.
        tile_epilogue = True
        if inner_i is not None:
            mr = _largest_divisor(inner_i, mr) if isinstance(inner_i, int) else mr
            tile_epilogue = isinstance(inner_i, int)
        if inner_j is not None:
            nr = _largest_divisor(inner_j, nr) if isinstance(inner_j, int) else nr
            tile_epilogue = tile_epilogue and isinstance(inner_j, int)

        # Step 2. Pad a ragged or symbolic M to whole register tiles and a ragged N to whole
        # vectors: the hot loop then runs without row guards or scalar tails. The padded
        # copy of A (the only extra pass) also computes A's cheap producers.
        m_static, n_static = static_extent(sch, i), static_extent(sch, j)
        pad_m = mr if m_static is None or m_static % mr else 1
        pad_n = nr if n_static is None or n_static % nr else 1
        a_pad = None
        for padding in ([1, pad_m, pad_n, 1], [1, 1, pad_n, 1]):
            if padding[1:3] == [1, 1]:
                break
            try:
                sch.pad_einsum(main, padding)
            except ScheduleError:
                continue
            if padding[1] > 1:
                a_source = sch.get(main).reads[0].source
                a_pad = next(
                    b
                    for b in sch.get_producers(main)
                    if any(w.source.same_as(a_source) for w in sch.get(b).writes)
                )
            n_static = static_extent(sch, sch.get_loops(main)[2])
            for block in sch.get_consumers(main):  # the padded-output copy joins the epilogue
                with contextlib.suppress(ScheduleError):
                    sch.compute_inline(block)
            break

        # Step 3. Operands: pack B once (its producers run inside the pack), read A in place.
        if tiles.pack_b:
            packed = sch.cache_read(main, 1, "global")
            _inline_producers(sch, packed)
            pad = None if n_static is not None and n_static % nr == 0 else 0.0
            sch.transform_layout(
                packed,
                ("write", 0),
                lambda s, jj, kk: (s, jj // nr, kk, jj % nr),
                pad_value=pad,
            )
            pack_loops = sch.get_loops(packed)
            if len(pack_loops) == 4:  # padded: the block now iterates the packed layout
                p_s, p_jo, p_k, p_ji = pack_loops
            else:
                p_s, p_j, p_k = pack_loops
                p_jo, p_ji = sch.split(p_j, [None, nr])
                sch.reorder(p_s, p_jo, p_k, p_ji)
            panels = sch.fuse(p_s, p_jo)
            sizes = [static_extent(sch, lp) for lp in (panels, p_k)]
            elements = None if None in sizes else sizes[0] * sizes[1] * nr
            if b_constant and len(sch.get(packed).reads) == 1:
                sch.annotate(packed, PREPACK_ATTR, 1)  # PrepackWeights runs it at compile time
            elif pack_pays(hw, elements, bits, sizes[0]):
                sch.parallel(panels)
            if vector_friendly(sch, packed, tiled=True):
                with contextlib.suppress(ScheduleError):
                    sch.vectorize(p_ji)
        else:
            _inline_operand(sch, main, 1)
        if a_pad is None:
            _inline_operand(sch, main, 0, cheap_only=True)
        else:
            _inline_operand(sch, a_pad, 0)
            parallel_vectorize(sch, a_pad, hw)
        with contextlib.suppress(ScheduleError):
            sch.reverse_compute_inline(reindex_c)

        # Step 4. Register tile over the full K loop; tiles are the parallel tasks.
        batch, i, j, k = sch.get_loops(main)
        io, ii = sch.split(i, [None, mr])
        jo, ji = sch.split(j, [None, nr])
        if panel_outer is None:
            panel_outer = _panel_stationary(hw, static_extent(sch, k), mr, nr, bits, tiles.pack_b)
        if panel_outer:
            sch.reorder(batch, jo, io, k, ii, ji)
            tile = sch.fuse(batch, jo, io)
        else:
            sch.reorder(batch, io, jo, k, ii, ji)
            tile = sch.fuse(batch, io, jo)
        extents = [static_extent(sch, lp) for lp in (tile, ii, ji, k)]
        flops = None if None in extents else 2 * extents[0] * extents[1] * extents[2] * extents[3]
        if matmul_tile_pays(hw, flops, extents[0]):
            sch.parallel(tile)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, tile, preserve_unit_loops=True)
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.get_loops(acc)[-1])

        # Step 5. Epilogue on the finished tile, consumers in dataflow order. A block that
        # cannot follow the tile runs at the root after the GEMM, and so do its consumers.
        symbolic = (isinstance(inner_i, tvm.ir.expr.Expr), isinstance(inner_j, tvm.ir.expr.Expr))
        rows = _row_fusion(main_stmt) if symbolic == (True, False) else None
        frontier = list(sch.get_consumers(acc))
        placed: list = []
        while frontier:
            block = frontier.pop(0)
            if any(sch.get(block).same_as(p) for p in placed) or \
                    sch.get(block).name_hint in norm.tail:
                continue
            placed.append(sch.get(block))
            try:
                if rows is not None:
                    if not _fuse_rows(sch, block, rows):
                        raise ScheduleError("epilogue rows do not fuse")
                elif not tile_epilogue:
                    raise ScheduleError("tile would straddle a fused axis")
                placed_sch = _placed_at_tile(sch, block, tile, mr * nr)
                if placed_sch is None:
                    raise ScheduleError("the block's region per tile is over-approximated")
                sch = placed_sch
            except ScheduleError:
                _schedule_at_root(sch, block, hw, placed, norm.tail)
                continue
            placed[-1] = sch.get(block)
            if vector_friendly(sch, block, tiled=True):
                with contextlib.suppress(ScheduleError):
                    sch.vectorize(sch.get_loops(block)[-1])
            frontier.extend(sch.get_consumers(block))

        sch.unroll(ii)
        sch.vectorize(ji)
        sch.decompose_reduction(main, k)
        if norm.tail and not _stage_tail(sch, norm.tail, hw):
            return None

        # Step 6. Prologue blocks left at the root (e.g. a costly op feeding A).
        for block in prologue:
            with contextlib.suppress(ScheduleError, ValueError):  # ValueError: inlined
                parallel_vectorize(sch, block, hw)
        return sch


def _schedule_at_root(
    sch: s_tir.Schedule, block: SBlockRV, hw: HardwareSpec, done: list, skip: set = frozenset()
) -> None:
    """Schedule ``block`` and, transitively, its consumers as root-level loop nests (not
    the blocks named in ``skip``: the row pass after the GEMM)."""
    pending = [block]
    while pending:
        block = pending.pop(0)
        parallel_vectorize(sch, block, hw)
        for consumer in sch.get_consumers(block):
            if sch.get(consumer).name_hint in skip:
                continue
            if not any(sch.get(consumer).same_as(d) for d in done):
                done.append(sch.get(consumer))
                pending.append(consumer)


def _pad_einsum(sch: s_tir.Schedule, main: SBlockRV, padding: list[int]) -> bool:
    """Pad the iterators of einsum ``main`` to multiples of ``padding`` (its inputs copied
    with zeros, its output's unpadding copy inlined into a consumer where it has one);
    False when the block cannot be padded."""
    try:
        sch.pad_einsum(main, padding)
    except (ScheduleError, tvm.TVMError):
        return False
    for unpad in sch.get_consumers(main):
        with contextlib.suppress(ScheduleError):
            sch.compute_inline(unpad)
    return True


def _schedule_row_gemv(sch: s_tir.Schedule, hw: HardwareSpec) -> s_tir.Schedule | None:
    """One row of A times a row-major B (``y[j] = sum_k x[k] * B[k, j]``): vectorise j.

    The fc layer of a batch-1 CNN. Each task owns ``nr`` consecutive outputs kept in
    registers while it streams its ``K x nr`` column panel of B, contiguous along j. (With
    B stored ``[N, K]`` the Reduction rule's dot-product form applies instead.)
    """
    blocks = root_blocks(sch)
    reductions = [b for b in blocks if not is_spatial(sch, b)]
    if len(reductions) != 1 or not is_reduction(sch, reductions[0]):
        return None
    main = reductions[0]
    stmt = sch.get(main)
    if len(stmt.reads) != 2 or len(stmt.writes) != 1:
        return None
    iters = list(stmt.iter_vars)
    loops = sch.get_loops(main)
    reduce_iters = [iv for iv in iters if iv.iter_type == tirx.IterVar.CommReduce]
    if len(loops) != len(iters) or len(reduce_iters) != 1:
        return None
    out_last = stmt.writes[0].region[-1].min
    if not isinstance(out_last, tirx.Var):
        return None
    k_var = reduce_iters[0].var
    lasts = [r.region[-1].min for r in stmt.reads]
    if not any(isinstance(v, tirx.Var) and v.same_as(out_last) for v in lasts):
        return None  # B is not contiguous along the output axis
    # Every other spatial iter must be a unit / batch dim, not a second matrix axis.
    for iv in iters:
        if iv.iter_type == tirx.IterVar.DataPar and not iv.var.same_as(out_last):
            extent = iv.dom.extent
            if not (isinstance(extent, tirx.IntImm) and extent.value == 1):
                return None
    if not any(k_var in tirx.analysis.undefined_vars(r.region[-1].min) for r in stmt.reads):
        return None
    inline_spatial(sch, keep=(main,))
    bits = int(stmt.writes[0].source.dtype.bits)
    n = static_int(next(iv for iv in iters if iv.var.same_as(out_last)).dom.extent)
    nr = gemv_panel(hw, bits)
    # Columns padded to whole panels (zeros in B, the pad of C dropped): a tail panel
    # would put a predicate in the vector loop, and the vectoriser runs it scalar
    # (TinyViT's 320 x 21841 classifier at 6 GB/s, 17x slower than 21856 columns).
    padded = n is not None and n % nr != 0
    if padded and not _pad_einsum(sch, main, [nr if iv.var.same_as(out_last) else 1
                                              for iv in iters]):
        return None
    stmt = sch.get(main)
    loop_of = dict(zip((iv.var for iv in stmt.iter_vars), sch.get_loops(main), strict=True))
    j_loop, k_loop = loop_of[out_last], loop_of[k_var]
    others = [lp for v, lp in loop_of.items() if not v.same_as(out_last) and not v.same_as(k_var)]
    k_extent = static_extent(sch, k_loop)
    # A constant B [K, N] is repacked at compile time into [N / nr, K, nr]: each task then
    # streams one contiguous panel instead of K rows of nr columns N apart (MobileNetV2's
    # classifier, cold in the model: half of every cache line fetched went unused).
    b_index = next(
        i for i, r in enumerate(stmt.reads)
        if isinstance(r.region[-1].min, tirx.Var) and r.region[-1].min.same_as(out_last)
    )
    b_buf, b_pad = stmt.reads[b_index].source, None
    if padded:  # B's zero-padded copy: the block writing it, and B it reads
        b_pad = next((b for b in sch.get_producers(main)
                      if sch.get(b).writes[0].source.same_as(b_buf)), None)
        if b_pad is None:
            return None
        b_buf = sch.get(b_pad).reads[0].source
    if len(b_buf.shape) == 2 and n is not None and constant_param(sch.mod["main"], b_buf):
        packed = sch.cache_read(main, b_index, "global")
        if b_pad is not None:
            sch.compute_inline(b_pad)  # the packing stage reads B itself, zeros past n
        sch.transform_layout(packed, ("write", 0), lambda kk, jj: (jj // nr, kk, jj % nr))
        p_k, p_j = sch.get_loops(packed)
        p_jo, p_ji = sch.split(p_j, [None, nr])
        sch.reorder(p_jo, p_k, p_ji)
        sch.annotate(packed, PREPACK_ATTR, 1)
    jo, ji = sch.split(j_loop, [None, nr])
    sch.reorder(*others, jo, k_loop, ji)
    tile = sch.fuse(*others, jo) if others else jo
    flops = None if n is None or k_extent is None else 2 * n * k_extent
    weight_bytes = None if flops is None else n * k_extent * bits // 8
    if gemv_pays(hw, flops, weight_bytes, static_extent(sch, tile)):
        sch.parallel(tile)
    acc = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(acc, tile, preserve_unit_loops=True)
    with contextlib.suppress(ScheduleError):
        sch.vectorize(sch.get_loops(acc)[-1])
    for block in list(sch.get_consumers(acc)):
        try:
            sch.reverse_compute_at(block, tile, preserve_unit_loops=True)
            if vector_friendly(sch, block, tiled=True):
                sch.vectorize(sch.get_loops(block)[-1])
        except ScheduleError:
            parallel_vectorize(sch, block, hw)
    sch.vectorize(ji)
    sch.decompose_reduction(main, k_loop)
    return sch
