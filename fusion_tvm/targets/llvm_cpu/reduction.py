"""Row-wise reduction rule: softmax, layer norm, RMS norm, pooling, reduce-sum/mean.

The whole fused chain of a row (e.g. max -> exp -> sum -> divide, or mean -> variance ->
normalise -> affine -> GELU) runs inside one parallel loop over rows, every block
``compute_at`` that loop, so a row is read from memory once and every later pass over it
hits L1/L2. Reductions along a row whose length is a multiple of the SIMD width are
``rfactor``-ed into ``lanes`` partial accumulators updated with vector instructions (an
IEEE-exact scalar reduction chain otherwise runs at one add per FMA latency).
"""

from __future__ import annotations

import contextlib
import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from ..tir_writer import static_int
from ._util import (
    dtype_bits,
    inline_spatial,
    is_contraction,
    is_reduction,
    is_spatial,
    iter_kinds,
    lanes,
    parallel_vectorize,
    pick_vector_width,
    reads_along_reduction,
    root_blocks,
    static_extent,
    static_flops,
    vector_friendly,
)
from .parallel import parallel_pays, reduction_pays, row_kernel_pays
from .row_schedule import (
    rfactor_rows,
    row_local,
    shared_rows,
    vectorize_innermost,
    vectorize_partials,
)

#: A reduction at most this long per output is a window (pooling), not a row.
MAX_WINDOW = 64


def _schedule_window(sch: s_tir.Schedule, blocks: list[SBlockRV], hw: HardwareSpec):
    """Pooling: a small window per output. Parallel rows, the window loop left to LLVM.

    Measured on max-pool 3x3/2 (1x64x112x112, znver4): a register-tiled, vectorised row
    (stride-2 gathers) ran 1.9x slower and a scalar register tile 1.5x slower than the
    plain (x, window) nest LLVM optimises itself, so only the rows are parallelised.
    Returns None when the single reduction is not a small window.
    """
    reductions = [b for b in blocks if not is_spatial(sch, b)]
    if len(reductions) != 1:
        return None
    main = reductions[0]
    loops = sch.get_loops(main)
    kinds = iter_kinds(sch, main)
    if len(loops) != len(kinds) or "R" in kinds.rstrip("R") or not kinds.startswith("S"):
        return None  # need plain (spatial..., reduction...) order
    n_spatial = len(kinds) - kinds.count("R")
    extents = [static_extent(sch, lp) for lp in loops]
    window = 1
    for ext in extents[n_spatial:]:
        window = window * ext if ext is not None and window is not None else None
    if window is None or n_spatial < 2:
        return None
    if window > MAX_WINDOW and not _lane_window(sch, main, loops[n_spatial - 1:],
                                                extents[n_spatial - 1], hw):
        # A long reduction is a row, except over a blocked tensor's lanes (a global pool
        # of NCHW[b]c: vectors of channels accumulated over the pixels, where the row
        # schedule ran a scalar chain per channel over stride-b loads).
        return None
    total = 1
    for ext in extents[:n_spatial]:
        total = total * ext if ext is not None and total is not None else None
    rows = None
    if None not in extents[: n_spatial - 1]:
        rows = math.prod(extents[: n_spatial - 1])
    row = loops[: n_spatial - 1]
    if reduction_pays(hw, None if total is None else total * window, rows):
        row = [sch.fuse(*row)]
        sch.parallel(row[0])
    last, extent = loops[n_spatial - 1:], extents[n_spatial - 1]  # last spatial + window
    moved = [] if _vectorize_lanes(sch, main, last, extent, hw) else \
        _vectorize_columns(sch, main, row, last, extent, hw)
    # Every other block (padding, epilogue, a second output) stays a root-level pass: an
    # epilogue of another shape moved under the pooled rows would only cover the rows the
    # pool produces. (The padding may have been inlined.)
    placed = [sch.get(b) for b in (main, *moved)]
    rest = [b for b in root_blocks(sch) if not any(sch.get(b).same_as(p) for p in placed)]
    for block in moved:  # a vector that divides the row, else whole vectors and a tail
        inner = sch.get_loops(block)[-1]
        part = pick_vector_width(static_extent(sch, inner), lanes(hw, dtype_bits(sch, block)))
        if part >= 8 and vector_friendly(sch, block):
            sch.vectorize(sch.split(inner, [None, part])[1])
        else:
            vectorize_innermost(sch, block, lanes(hw, dtype_bits(sch, block)), 1)
    for block in rest:
        with contextlib.suppress(ScheduleError):
            parallel_vectorize(sch, block, hw)
    return sch


def _unit_stride_window(stmt, column) -> bool:
    """Whether every access of a window block indexes its last axis at the output column
    itself (the window offset added): a stride-1 window along the row."""
    analyzer = tvm.sym.Analyzer()
    for access in (*stmt.reads, *stmt.writes):
        offset = analyzer.simplify(access.region[-1].min - column)
        if any(v.same_as(column) for v in tirx.analysis.undefined_vars(offset)):
            return False
    return True


def _vectorize_columns(sch: s_tir.Schedule, main: SBlockRV, row: list, loops,
                       extent: int | None, hw: HardwareSpec) -> list[SBlockRV]:
    """A stride-1 window over a plain ``NCHW`` row: the output columns become the vector,
    inside the window loops, each row's padding computed at the row and an elementwise
    epilogue of the same shape applied to the row while it is in L1 (max-pool 3x3/1 + add,
    TVM #20401's case, 1x64x56x56: 53 us as a scalar (x, window) nest and two passes, 44 us
    so). Returns the blocks moved under the row loop (vectorised by the caller); nothing
    changes when the window is strided or the row is too short."""
    stmt = sch.get(main)
    column = stmt.iter_vars[len(stmt.iter_vars) - len(loops)].var
    width = pick_vector_width(extent, lanes(hw, dtype_bits(sch, main)))
    if extent is None or width < 4 or not _unit_stride_window(stmt, column):
        return []
    row = sch.fuse(*row) if len(row) > 1 else row[0]
    sch.reorder(*loops[1:], loops[0])
    _, vec = sch.split(loops[0], [None, width])
    sch.vectorize(vec)  # before any decompose: the init stays in the block (see above)
    domain = [iv.dom.extent for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    if not sch.get_consumers(main):
        # The window accumulates in a row buffer, copied out once: updated in place nine
        # times, the output row ran 2.7x slower (121 vs 45 us, same nest) than a row
        # intermediate TVM compacts to the row.
        sch.cache_write(main, 0, "global")
    moved = []
    for producer in sch.get_producers(main):
        if is_spatial(sch, producer) and len(sch.get_consumers(producer)) == 1:
            with contextlib.suppress(ScheduleError):
                sch.compute_at(producer, row, preserve_unit_loops=True)
                moved.append(producer)
    consumers = list(sch.get_consumers(main))
    while len(consumers) == 1 and _same_domain(sch, consumers[0], domain):
        (consumer,) = consumers
        try:
            sch.reverse_compute_at(consumer, row, preserve_unit_loops=True)
        except ScheduleError:
            break
        moved.append(consumer)
        consumers = list(sch.get_consumers(consumer))
    return moved


def _same_domain(sch: s_tir.Schedule, block: SBlockRV, domain: list) -> bool:
    """Whether a spatial ``block`` iterates exactly ``domain`` (extents, in order)."""
    if not is_spatial(sch, block):
        return False
    extents = [iv.dom.extent for iv in sch.get(block).iter_vars]
    return len(extents) == len(domain) and all(
        tvm_ffi.structural_equal(a, b) for a, b in zip(extents, domain, strict=True))


def _lane_window(sch: s_tir.Schedule, main: SBlockRV, loops, extent: int | None,
                 hw: HardwareSpec) -> bool:
    """Whether the last spatial loop of ``main`` (``loops[0]``, extent ``extent``) indexes
    the innermost axis of every access: the channel lanes of a blocked tensor."""
    stmt = sch.get(main)
    lane = stmt.iter_vars[len(stmt.iter_vars) - len(loops)].var
    width = lanes(hw, dtype_bits(sch, main))
    if extent is None or extent > 4 * width or extent < 4:
        return False
    return all(access.region[-1].min.same_as(lane) for access in (*stmt.reads, *stmt.writes))


def _vectorize_lanes(sch: s_tir.Schedule, main: SBlockRV, loops, extent: int | None,
                     hw: HardwareSpec) -> bool:
    """A window over a blocked ``NCHW[b]c`` tensor: the channel lanes (the last spatial
    loop, the innermost index of every access) become the vector, inside the window loops,
    the padding inlined (max-pool 3x3/2 over 1x4x112x112x16: 305 us as a scalar nest after
    a padding pass, 67 us so)."""
    if not _lane_window(sch, main, loops, extent, hw):
        return False
    # The padding is read in the window instead of materialised: a separate pass over the
    # padded tensor took 3.5x the pooling itself (its guard is uniform across the lanes).
    for producer in sch.get_producers(main):
        if is_spatial(sch, producer) and len(sch.get_consumers(producer)) == 1:
            with contextlib.suppress(ScheduleError):
                sch.compute_inline(producer)
    with contextlib.suppress(ScheduleError):
        # The init stays in the block (the first window step): a decomposed reduction is
        # no longer a "reduction block", which vectorize refuses.
        sch.reorder(*loops[1:], loops[0])
        sch.vectorize(loops[0])
    return True


def _gemm(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """``acc += A[i, k] * B[k, j]``: a matrix product (not a matrix-vector one), not a sum
    of squares or of a centred value (a norm's variance)."""
    if not is_contraction(sch, block):
        return False
    stmt = sch.get(block)
    if not reads_along_reduction(stmt):
        return False
    wide = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar
            and not (isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value == 1)}
    used = [{v for rng in r.region for v in tirx.analysis.undefined_vars(rng.min)}
            for r in stmt.reads]
    # Each operand with output axes of its own: rows of A times columns of B. A
    # matrix-vector product (a 1 x 1 conv on a 1 x 1 image) is one row per output, which
    # the row loop runs well.
    return all((u - o) & wide for u, o in ((used[0], used[1]), (used[1], used[0])))


class Reduction(ScheduleRule):
    """One parallel loop over rows; the fused chain of each row computed inside it."""

    name = "reduction"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not blocks or all(is_spatial(sch, b) for b in blocks):
            return None
        if not all(is_spatial(sch, b) or is_reduction(sch, b) for b in blocks):
            return None
        if any(sch.get_child_blocks(b) for b in blocks):
            return None
        if len(blocks) > 1 and any(_gemm(sch, b) for b in blocks):
            # A GEMM fused with ops the matmul rule refused (EdgeNeXt's projection split
            # into q, k, v: three outputs): row by row it runs untiled, 1.8 ms against 0.07
            # for the same GEMM alone. Left to the catch-all, the group is split again.
            return None
        blocks = inline_spatial(sch)
        window = _schedule_window(sch, blocks, hw)
        if window is not None:
            return window
        reductions = [sch.get(b) for b in blocks if not is_spatial(sch, b)]
        if len(reductions) > 1 and any(
                len({r.source for r in stmt.reads}) > 1 and reads_along_reduction(stmt)
                for stmt in reductions):
            return None  # a GEMM with a row chain: row by row it would re-read B per row
        flops = static_flops(func)  # all the kernel's arithmetic (a softmax's exp too)
        work = None if flops is None else max(1.0, sum(flops.values()))
        if _rows_too_few(sch, blocks, hw, work):
            anchored = _schedule_anchored(sch.copy(), blocks, hw, work)
            if anchored is not None:
                return anchored
        return sch if schedule_row_chain(sch, blocks, hw, work) else None


def _rows_too_few(sch: s_tir.Schedule, blocks: list[SBlockRV], hw: HardwareSpec,
                  work: float | None) -> bool:
    """Whether the rows the chain shares are too few for the thread pool while its work
    would pay for it: a pooled chain of another shape than its producers (ResNeSt's
    split-attention sum feeding a 3 x 3 / 2 average pool) shares only the batch."""
    rows = shared_rows(sch, blocks)
    extents = [static_extent(sch, lp) for lp in sch.get_loops(blocks[-1])[:rows]]
    if None in extents or work is None:
        return False
    return (not parallel_pays(hw, None, math.prod(extents))
            and row_kernel_pays(hw, work, 8.0 * work, None))


#: Most a block may be recomputed under the anchored row loop (iterations over its domain).
MAX_RECOMPUTE = 1.05


def _schedule_anchored(sch: s_tir.Schedule, blocks: list[SBlockRV], hw: HardwareSpec,
                       work: float | None) -> s_tir.Schedule | None:
    """The chain computed per iteration of its last block's leading spatial loops.

    Each earlier block is ``compute_at`` the fused outer loops of the last block (the
    fewest that give every thread a few chunks, the innermost kept for the vector), TVM
    deriving the region each iteration needs: the channels of a pool whose producers index
    them at another position. Declined (None) when a block would be recomputed (a window
    over the fused axes) or the group publishes more than the last block. ``sch`` (its
    spatial blocks inlined, ``blocks`` left) is changed either way: pass a copy.
    """
    anchor = blocks[-1]
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    if len(outputs) != 1 or not sch.get(outputs[0]).same_as(sch.get(anchor)):
        return None
    kinds = iter_kinds(sch, anchor)
    loops = sch.get_loops(anchor)[:len(kinds) - len(kinds.lstrip("S"))]
    extents = [static_extent(sch, lp) for lp in loops]
    prefix = next((k for k in range(1, len(loops))  # the innermost loop stays: the vector
                   if None not in extents[:k] and parallel_pays(hw, None, math.prod(extents[:k]))),
                  None)
    domains = [math.prod(static_int(iv.dom.extent) or 0 for iv in sch.get(b).iter_vars)
               for b in blocks]
    if prefix is None or 0 in domains:
        return None
    row = sch.fuse(*loops[:prefix]) if prefix > 1 else loops[0]
    chunks = math.prod(extents[:prefix])
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_at(block, row, preserve_unit_loops=True)
    except ScheduleError:
        return None
    for block, domain in zip(blocks, domains, strict=True):
        inner = [static_extent(sch, lp) or 0 for lp in sch.get_loops(block)[1:]]
        if chunks * math.prod(inner) > MAX_RECOMPUTE * domain or 0 in inner:
            return None
    if row_kernel_pays(hw, work, 8.0 * (work or 0.0), chunks):
        sch.parallel(row)
    width = lanes(hw, dtype_bits(sch, anchor))
    for block in blocks:
        if is_spatial(sch, block):
            vectorize_innermost(sch, block, width, 1)
    return sch


def _partial_width(sch: s_tir.Schedule, block: SBlockRV, width: int) -> int | None:
    """The widest vector of partial sums, ``width`` halved down to 4 lanes, whose multiple
    the row's reduction length is (its trailing reduction loops together): a 14 x 14
    pool of swish outputs (196 = 49 x 4) runs 4-lane partials, not one scalar chain."""
    kinds = iter_kinds(sch, block)
    extents = [static_extent(sch, lp) for lp in sch.get_loops(block)]
    if "R" not in kinds or len(extents) != len(kinds):
        return None
    reduce = extents[kinds.index("R"):]
    if None in reduce:
        return None
    n = math.prod(reduce)
    w = width
    while w >= 4 and (n % w or n < 2 * w):
        w //= 2
    return w if w >= 4 else None


def schedule_row_chain(sch: s_tir.Schedule, blocks: list[SBlockRV], hw: HardwareSpec,
                       work: float | None, chain=None) -> bool:
    """Schedule ``blocks`` (root blocks in dataflow order) as one parallel loop over their
    shared rows, every block computed inside it; False (``sch`` unusable) when they do not
    share row-local rows.

    ``work`` is the chain's arithmetic (None: symbolic), for the parallel decision;
    ``chain()`` lists the chain's root blocks in dataflow order after an ``rfactor`` added
    some (default: every root block — the whole function is the chain). The matmul rule
    stages a layer norm feeding its A operand with it.
    """
    chain = chain or (lambda: root_blocks(sch))
    rows = shared_rows(sch, blocks)
    if rows == 0 or not row_local(sch, blocks, rows):
        return False
    width = lanes(hw, dtype_bits(sch, blocks[-1]))
    rfactored = {}
    for block in blocks:
        if is_reduction(sch, block):
            w = _partial_width(sch, block, width)
            rf = rfactor_rows(sch, block, w) if w else None
            if rf is not None:  # by name: inlining a producer into it makes a new stmt
                rfactored[sch.get(rf).name_hint] = w
    blocks = chain()

    # Anchor the row loop at the last block and pull every producer under it. A
    # spatial block before it that publishes an output (a residual sum used by the
    # next layer norm and by the next residual) cannot be computed at the row loop:
    # its consumers recompute it inline, as they do every other spatial producer, and
    # a copy of it (now a block with no producer in the group) publishes the output
    # inside the row loop. (Anchoring at the first block and reverse_compute_at-ing
    # the rest mis-derives regions: fuzz seeds 100 and 158.)
    outputs = [sch.get(b) for b in sch.get_output_blocks(sch.get_sblock("root"))]
    copies = []
    for block in blocks[:-1]:
        if not any(sch.get(block).same_as(o) for o in outputs):
            continue
        if not is_spatial(sch, block) or len(sch.get(block).writes) != 1:
            return False
        consumers = list(sch.get_consumers(block))
        copy = sch.cache_write(block, 0, "global", consumer_blocks=consumers)
        sch.compute_inline(block)
        members = [sch.get(b) for b in chain()]
        if any(sch.get(p) in members for p in sch.get_producers(copy)):
            # It reads a row statistic (centred rows published next to their norm):
            # no order of compute_at / reverse_compute_at places it; decline. (A producer
            # before the chain, the GEMM of a matmul's row pass, is complete already.)
            return False
        copies.append(copy)
    copy_stmts = [sch.get(c) for c in copies]
    blocks = [b for b in chain()
              if not any(sch.get(b).same_as(c) for c in copy_stmts)]
    anchor = blocks[-1]
    loops = sch.get_loops(anchor)
    extents = [static_extent(sch, lp) for lp in loops]
    elements = None if None in extents else math.prod(extents)
    row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=True)
    for copy in copies:  # its row loop joins the kernel's: one pass, one parallel loop
        copy_loops = sch.get_loops(copy)
        copy_row = sch.fuse(*copy_loops[:rows]) if rows > 1 else copy_loops[0]
        row = sch.merge(copy_row, row)
    if row_kernel_pays(hw, work, 8.0 * (elements or 0), static_extent(sch, row)):
        sch.parallel(row)

    for block in blocks + copies:
        w = rfactored.get(sch.get(block).name_hint)
        if w is not None:
            vectorize_partials(sch, block, w)
        elif is_spatial(sch, block):
            vectorize_innermost(sch, block, width, 1)
    return True
