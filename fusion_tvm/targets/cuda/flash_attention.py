"""FlashAttention rule for CUDA: ``softmax(score(Q K^T)) V`` with an online softmax.

The fused attention PrimFunc is matched to its :class:`~fusion_tvm.online_softmax.
AttentionForm` and replaced by an equivalent kernel written out loop by loop, as the
LLVM-CPU rule does (schedule primitives cannot turn a softmax into its running-max form).
One thread block per (batch dims, tile of query rows), on ``blockIdx.x``; one thread per
query row of the tile, on ``threadIdx.x``, or, when the grid has too few rows to fill the
GPU (short sequences, few heads), up to four threads per row (*key lanes*), each taking
its part of every tile of keys. A thread keeps its row of Q (``dk`` floats), its output
accumulator (``dv`` floats), running max and sum and its scores of one tile in registers.
For each tile of keys the block

* loads the tile's K ``[keys, dk]`` and V ``[keys, dv]`` rows cooperatively into shared
  memory, through the form's ``k_term`` / ``v_term`` (transposes in the group are absorbed
  into these loads; the thread order follows the contiguous global axis);
* then each thread computes its scores ``q . k_j`` (every thread of a warp reads the same
  shared element: a broadcast), the score function (scale, mask), the tile's max, the
  rescale ``exp(m_old - m_new)`` of its sum and accumulator, the exponentials and their
  sum, and ``acc += p_j * v_j``.

Key lanes then merge into lane 0 through shared memory (``m = max``, sums and accumulators
rescaled), and ``out = acc / l`` is stored through the form's output indices.

Every statement under the block is its own ``threadIdx.x`` loop (a *phase*): TVM inserts
the barriers between the shared-memory writes of one phase and the reads of the next, and
the schedule check on the CPU (:mod:`.emulate`, thread loops run one after another) sees
the same program. State that lives across phases is a ``local`` buffer indexed by the
thread, which TVM compacts to the thread's own row: per-thread arrays that nvcc keeps in
registers (every loop over them is unrolled, ``#pragma unroll``).

A partial last tile of query rows reads clamped rows and skips the store; a partial last
tile of keys reads clamped keys and gives keys past the end a score of ``-inf``. Symbolic
sequence lengths give symbolic grid and key-loop extents (and one thread per row: the
rule cannot tell the grid is small). An output transpose after ``P V`` (one block reading
the result at a permutation of its iters) is folded into the final store; other blocks
after ``P V`` run as their own thread-bound pass. Tiles are chosen so that the buffers fit
the static shared memory and the per-thread state the register file (:func:`flash_tiles`);
the rule declines heads too wide for that (``dk + dv + 8 > REGISTER_FLOATS``: head dims of
128 and more). The ``gpu`` cost model prices the kernel through
:func:`flash_kernel` (``CUDABackend.gpu_kernel``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ...hardware import HardwareSpec
from ...kernel_model import GpuKernel, LaunchShape
from ...online_softmax import AttentionForm, match_attention
from ...tir_expr import equal, free_vars, loads, replace_loads, substitute
from ..base import ScheduleRule
from ..tir_writer import AttentionWriter, block_name, seq, static_int
from .limits import STATIC_SMEM_BYTES
from .verify import lowers

logger = logging.getLogger(__name__)

#: Query rows per block (fewer, down to a warp, for short static queries).
ROWS = 64
#: Keys per shared-memory tile (halved, down to ``MIN_KEY_TILE``, until the tiles fit).
KEY_TILE = 32
MIN_KEY_TILE = 8
#: Floats a thread may keep live (its Q row, accumulator and scores) out of the 255
#: registers of sm_80 / sm_90, leaving the rest for indices, the running max / sum and the
#: score function.
REGISTER_FLOATS = 224
#: Most threads sharing one query row's keys (key lanes), and the rows of a block then.
MAX_KEY_LANES = 4
LANE_ROWS = 32
#: Resident warps per SM the grid should give the device before rows are split into lanes
#: (the ``gpu`` cost model's ``WARPS_FOR_PEAK_COMPUTE``).
WARPS_PER_SM = 8
#: Threads per block of an epilogue pass (blocks after ``P V`` not folded into its store).
EPILOGUE_THREADS = 256

_SERIAL, _UNROLL = tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED


@dataclass(frozen=True)
class FlashTiles:
    """The launch shape of one flash kernel.

    Attributes
    ----------
    rows : int
        Query rows per block.
    lanes : int
        Threads per query row (key lanes): lane ``s`` takes the ``s``-th part of every
        tile of keys with its own running max, sum and accumulator, merged at the end.
    keys : int
        Keys per shared-memory tile (a multiple of ``lanes``).
    smem_bytes : int
        Shared memory the block declares (K and V tiles, the lanes' merge buffer).
    live_floats : int
        Floats each thread keeps in registers (Q row, accumulator, its scores of a tile).
    """

    rows: int
    lanes: int
    keys: int
    smem_bytes: int
    live_floats: int

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.rows * self.lanes

    @property
    def registers(self) -> int:
        """Registers per thread ptxas allocates, about (``-Xptxas -v``, nvcc 13, sm_80 /
        sm_90: 70 - 79 at 40 live floats, 122 - 136 at 64 - 72, 161 at 88, 168 - 202 at
        136, 255 at 160; no spills)."""
        return min(255, 24 + 3 * self.live_floats // 2)


def flash_tiles(dk: int, dv: int, smem_bytes: int, sq: int | None = None,
                sk: int | None = None, query_rows: int | None = None, sm_count: int = 0,
                rows: int = ROWS, key_tile: int = KEY_TILE) -> FlashTiles | None:
    """Tiles for head dims ``dk`` / ``dv``, static (else None) query / key lengths and
    static count of query rows of the grid (batch dims x ``sq``).

    When the grid's rows give the ``sm_count`` SMs fewer than ``WARPS_PER_SM`` warps each,
    each row's keys are split among up to ``MAX_KEY_LANES`` threads of ``LANE_ROWS``-row
    blocks; else one thread per row of ``rows``-row blocks (fewer rows, down to one warp,
    for a shorter static query). Tiles of the largest power of two of keys from
    ``key_tile`` down (at most ``sk`` rounded up to the lanes) whose buffers fit
    ``smem_bytes`` and whose per-thread state (``dk + dv + keys / lanes`` floats) fits
    ``REGISTER_FLOATS``. None when no tile of ``MIN_KEY_TILE`` keys fits.
    """
    lanes = 1
    if query_rows is not None and sm_count:
        while lanes < MAX_KEY_LANES and query_rows * lanes < sm_count * WARPS_PER_SM * 32:
            lanes *= 2
    if lanes > 1:
        rows = LANE_ROWS
    if sq is not None:
        rows = min(rows, max(32, 1 << max(0, sq - 1).bit_length()))
    bc = key_tile
    while bc >= MIN_KEY_TILE:
        keys = bc if sk is None or sk >= bc else -(-sk // lanes) * lanes
        smem = shared_bytes(dk, dv, keys, rows if lanes > 1 else 0)
        live = dk + dv + keys // lanes
        if smem <= smem_bytes and live <= REGISTER_FLOATS:
            return FlashTiles(rows, lanes, keys, smem, live)
        bc //= 2
    return None


def shared_bytes(dk: int, dv: int, keys: int, merge_rows: int = 0) -> int:
    """Shared memory of tiles of ``keys`` keys (upper bound: a tile filled along the keys
    gets one float of padding per row) and of the lanes' merge buffer of ``merge_rows``."""
    return (keys * (dk + 1 + dv + 1) + merge_rows * _merge_width(dv)) * 4


def _merge_width(dv: int) -> int:
    """Floats per row of the merge buffer: accumulator, max and sum, padded to an odd
    count (rows on distinct banks)."""
    return dv + 2 + (dv + 3) % 2


def smem_limit(target: tvm.target.Target | None, hw: HardwareSpec) -> int:
    """Static shared memory one block may declare: the target's limit (CUDA's 48 KiB
    without the dynamic opt-in), at most the device's per-block maximum."""
    limit = STATIC_SMEM_BYTES
    if target is not None and "max_shared_memory_per_block" in target.attrs:
        limit = int(target.attrs["max_shared_memory_per_block"])
    return min(limit, hw.gpu.shared_memory_per_block) if hw.gpu is not None else limit


class FlashAttention(ScheduleRule):
    """Online-softmax attention: one thread per query row, K / V tiles in shared memory."""

    name = "flash_attention"

    def __init__(self, rows: int = ROWS, key_tile: int = KEY_TILE):
        self.rows = rows
        self.key_tile = key_tile

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        form = match_attention(func)
        if form is None:
            return None
        tiles = flash_tiles(form.red_extent, form.col_extent, smem_limit(target, hw),
                            static_int(form.row_extents[-1]), static_int(form.key_extent),
                            form.static_rows,
                            hw.gpu.sm_count if hw.gpu else 0, self.rows, self.key_tile)
        if tiles is None:
            logger.debug("flash_attention: head dims %d / %d do not fit one thread",
                         form.red_extent, form.col_extent)
            return None
        kernel = _Kernel(form, tiles)
        sch = s_tir.Schedule(kernel.build())
        loops = sch.get_loops(sch.get_sblock(_Kernel.CORE))
        bx = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        sch.bind(bx, "blockIdx.x")
        # Unrolled loops stay loops under ``#pragma unroll`` (nvcc unrolls them, so the
        # per-thread arrays become registers) instead of being copied out by TVM.
        sch.annotate(bx, "pragma_unroll_explicit", 0)
        for name in kernel.epilogue_names:
            _bind_spatial(sch, sch.get_sblock(name))
        error = lowers(sch, target)
        if error is not None:
            logger.debug("flash_attention schedule does not lower: %s", error)
            return None
        return sch


def _bind_spatial(sch: s_tir.Schedule, block) -> None:
    """A spatial root block as one thread per element."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else (loops[0] if loops else
                                                      sch.add_unit_loop(block))
    bx, tx = sch.split(fused, factors=[None, EPILOGUE_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _along(term, var) -> bool:
    """Whether ``term`` is a plain load whose last index is ``var`` (and no other uses it):
    consecutive threads should then take consecutive values of ``var``."""
    if not isinstance(term, tvm.ir.expr.TensorLoad):
        return False
    *lead, last = term.indices
    return last.same_as(var) and not any(var in free_vars(i) for i in lead)


def _fold_epilogue(form: AttentionForm):
    """``store(out_indices, value)`` writing the epilogue's result directly, when the
    epilogue is one block that reads ``out`` (an intermediate) once per element at a
    permutation of its iters over ``out``'s shape (an output transpose, with elementwise
    ops after it); None otherwise (the epilogue then runs as its own pass)."""
    if len(form.epilogue) != 1 or any(p.same_as(form.out) for p in form.func.params):
        return None
    stmt, loops = form.epilogue[0], []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, s_tir.SBlockRealize) or not _true(stmt.predicate):
        return None
    block = stmt.block
    store = block.body
    if block.init is not None or block.alloc_buffers or not isinstance(store, tirx.BufferStore):
        return None
    ivs = list(block.iter_vars)
    # Every iter runs over its whole domain once: bound to its own loop of that extent.
    if len(loops) != len(ivs) or any(
            iv.iter_type != tirx.IterVar.DataPar or not _zero(iv.dom.min)
            or not value.same_as(lp.loop_var) or not _zero(lp.min)
            or not equal(lp.extent, iv.dom.extent)
            for iv, value, lp in zip(ivs, stmt.iter_values, loops, strict=True)):
        return None
    reads = [ld for ld in loads(store.value) if ld.source.same_as(form.out)]
    if not reads or any(ld.source.same_as(store.buffer) for ld in loads(store.value)):
        return None
    first = list(reads[0].indices)
    if any(not all(equal(a, b) for a, b in zip(ld.indices, first, strict=True))
           for ld in reads[1:]):
        return None
    position = {}
    for p, idx in enumerate(first):
        iv = next((iv for iv in ivs if idx.same_as(iv.var)), None)
        if iv is None or iv.var in position or not equal(iv.dom.extent, form.out.shape[p]):
            return None
        position[iv.var] = p
    if len(position) != len(ivs):
        return None

    def fold(out_index, value):
        mapping = {var: out_index[p] for var, p in position.items()}
        new = replace_loads(store.value, form.out, lambda _: value)
        return tirx.BufferStore(store.buffer, substitute(new, mapping),
                                [substitute(i, mapping) for i in store.indices])
    return fold


def _true(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 1


def _zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 0


class _Kernel(AttentionWriter):
    """Writes the CUDA online-softmax PrimFunc of one :class:`AttentionForm`.

    Thread ``tx`` of a block serves query row ``tx % rows`` of the block's tile as key
    lane ``tx // rows``: the lanes of a row take disjoint parts of each tile of keys (a
    warp's threads share their lane, so their shared-memory reads stay broadcasts).
    """

    CORE = "flash_attention"

    def __init__(self, form: AttentionForm, tiles: FlashTiles):
        super().__init__(form)
        sq, sk = static_int(self.sq), static_int(self.sk)
        self.br, self.lanes, self.bc = tiles.rows, tiles.lanes, tiles.keys
        self.nt = tiles.threads
        self.sub = self.bc // self.lanes  # keys of a tile per lane
        self.clamp_rows = sq is None or sq % self.br != 0
        self.masked = sk is None or sk % self.bc != 0
        self.fold = _fold_epilogue(form)
        self.epilogue = () if self.fold is not None else form.epilogue
        self.epilogue_names = [n for n in map(block_name, self.epilogue) if n]
        # A tile filled along the keys (K read transposed): the threads store down its
        # columns; one float of padding per row keeps those stores off a single bank.
        self.k_along_keys = _along(form.k_term, form.key)
        self.v_along_keys = _along(form.v_term, form.key)
        f32, nt = self.dtype, self.nt
        # Shared buffers are flat with explicit row strides: TVM compacts a 2-D buffer to
        # the columns it reads, which would drop the padding.
        self.k_stride = self.dk + int(self.k_along_keys)
        self.v_stride = self.dv + int(self.v_along_keys)
        self.m_stride = _merge_width(self.dv)
        self.k_tile = tirx.decl_buffer([self.bc * self.k_stride], f32, "k_tile", scope="shared")
        self.v_tile = tirx.decl_buffer([self.bc * self.v_stride], f32, "v_tile", scope="shared")
        self.merge = tirx.decl_buffer([self.br * self.m_stride], f32, "lane_merge",
                                      scope="shared") if self.lanes > 1 else None
        # Per-thread state, one row per thread (compacted to the thread's own row).
        self.q_reg = tirx.decl_buffer([nt, self.dk], f32, "q_reg", scope="local")
        self.acc = tirx.decl_buffer([nt, self.dv], f32, "acc_o", scope="local")
        self.scores = tirx.decl_buffer([nt, self.sub], f32, "scores", scope="local")
        # 0: running max, 1: running sum, 2: new max, 3: rescale, 4: tile sum / 1 / sum
        self.state = tirx.decl_buffer([nt, 5], f32, "row_state", scope="local")
        self.bvars = [tirx.Var(f"vb{k}", self.ity) for k in range(len(self.batch))]
        self.vq = tirx.Var("vq", self.ity)

    # -------------------------------------------------------------------------- helpers
    def loop(self, name: str, extent, body_fn, kind=_UNROLL):
        """A loop, unrolled unless said otherwise (per-thread register arrays)."""
        return super().loop(name, extent, body_fn, kind)

    def threads(self, body_fn):
        """One phase: ``body_fn(tx)`` on every thread of the block."""
        var = self.var("tx")
        dom = tvm.ir.Range.from_min_extent(self.c(0), self.c(self.nt))
        binding = tirx.IterVar(dom, var, tirx.IterVar.ThreadIndex, "threadIdx.x")
        return tirx.For(var, self.c(0), self.c(self.nt), tirx.ForKind.THREAD_BINDING,
                        body_fn(var), thread_binding=binding)

    def local_row(self, tx):
        """Row of the block's tile thread ``tx`` serves."""
        return tirx.floormod(tx, self.c(self.br)) if self.lanes > 1 else tx

    def lane(self, tx):
        return tirx.floordiv(tx, self.c(self.br))

    def row(self, tx, clamp: bool = True):
        """The query row of thread ``tx`` (clamped to the last row)."""
        q = self.vq * self.c(self.br) + self.local_row(tx)
        return tirx.Min(q, self.sq - self.c(1)) if clamp and self.clamp_rows else q

    def row_vars(self, tx):
        return {**dict(zip(self.batch, self.bvars, strict=True)), self.query: self.row(tx)}

    def key(self, j):
        """Key ``j``, clamped to the last key when a tile can be partial."""
        return tirx.Min(j, self.sk - self.c(1)) if self.masked else j

    def s(self, tx, k):
        return [tx, self.c(k)]

    def at(self, stride: int, row, col):
        """Index of ``[row, col]`` in a flat shared buffer of row ``stride``."""
        col = self.c(col) if isinstance(col, int) else col
        return [row * self.c(stride) + col]

    # ----------------------------------------------------------------------- the phases
    def _init(self):
        form, st, c = self.form, self.st, self.c
        # The lowest float, not the form's start (it may be -inf): a lane whose keys are
        # all masked then rescales by exp(lowest - m) = 0, never by exp(-inf + inf).
        lowest = tirx.max_value(self.dtype) * self.f(-1.0)

        def body(tx):
            q = self.loop("k", self.dk, lambda k: st(
                self.q_reg, substitute(form.q_term, {**self.row_vars(tx), form.red: k}),
                [tx, k]))
            zero = self.loop("d", self.dv, lambda d: st(self.acc, self.f(0.0), [tx, d]))
            start = form.max_init if self.lanes == 1 else tirx.Max(form.max_init, lowest)
            return seq(q, zero, st(self.state, start, [tx, c(0)]),
                        st(self.state, self.f(0.0), [tx, c(1)]))
        return self.threads(body)

    def _load_tile(self, j0, tile, stride: int, term, width: int, along_keys: bool, var):
        """Cooperative copy of ``term`` for keys ``j0 ..`` into ``tile[key, var]``; thread
        ``tx`` takes elements ``tx, tx + threads, ...`` in the order of the contiguous
        global axis (keys first when ``along_keys``)."""
        form, c, nt = self.form, self.c, self.nt
        total = self.bc * width
        bmap = dict(zip(self.batch, self.bvars, strict=True))

        def body(tx):
            def element(i):
                e = i * c(nt) + tx
                if along_keys:
                    jj, x = tirx.floormod(e, c(self.bc)), tirx.floordiv(e, c(self.bc))
                else:
                    jj, x = tirx.floordiv(e, c(width)), tirx.floormod(e, c(width))
                value = substitute(term, {**bmap, form.key: self.key(j0 + jj), var: x})
                store = self.st(tile, value, self.at(stride, jj, x))
                return store if total % nt == 0 else tirx.IfThenElse(e < c(total), store, None)
            return self.loop("e", -(-total // nt), element)
        return body

    def _loads(self, j0):
        form = self.form
        k_body = self._load_tile(j0, self.k_tile, self.k_stride, form.k_term, self.dk,
                                 self.k_along_keys, form.red)
        v_body = self._load_tile(j0, self.v_tile, self.v_stride, form.v_term, self.dv,
                                 self.v_along_keys, form.col)
        return self.threads(lambda tx: seq(k_body(tx), v_body(tx)))

    def _compute(self, j0):
        form, ld, st, c = self.form, self.ld, self.st, self.c
        sc, state, sub = self.scores, self.state, self.sub
        neg_inf = self.f(float("-inf"))

        def body(tx):
            first = self.lane(tx) * c(sub) if self.lanes > 1 else c(0)  # the lane's keys

            def qk(jj):
                t = first + jj
                dot = self.loop("k", self.dk, lambda k: st(
                    sc, ld(sc, [tx, jj]) + ld(self.q_reg, [tx, k])
                    * ld(self.k_tile, self.at(self.k_stride, t, k)),
                    [tx, jj]))
                s = substitute(form.score, {**self.row_vars(tx), form.key: self.key(j0 + t),
                                            form.acc: ld(sc, [tx, jj])})
                if self.masked:
                    s = tirx.Select(j0 + t < self.sk, s, neg_inf)
                return seq(st(sc, self.f(0.0), [tx, jj]), dot, st(sc, s, [tx, jj]))
            m_old, m_new, alpha, total = (ld(state, self.s(tx, i)) for i in (0, 2, 3, 4))
            tile_max = seq(
                st(state, m_old, self.s(tx, 2)),
                self.loop("j", sub, lambda jj: st(
                    state, tirx.Max(ld(state, self.s(tx, 2)), ld(sc, [tx, jj])),
                    self.s(tx, 2))))
            rescale = seq(st(state, form.exp(m_old - m_new), self.s(tx, 3)),
                           st(state, m_new, self.s(tx, 0)))
            exps = seq(
                st(state, self.f(0.0), self.s(tx, 4)),
                self.loop("j", sub, lambda jj: seq(
                    st(sc, ld(sc, [tx, jj]) - m_new, [tx, jj]),
                    st(sc, form.exp(ld(sc, [tx, jj])), [tx, jj]),
                    st(state, total + ld(sc, [tx, jj]), self.s(tx, 4)))))
            update = seq(
                st(state, ld(state, self.s(tx, 1)) * alpha + total, self.s(tx, 1)),
                self.loop("d", self.dv, lambda d: st(
                    self.acc, ld(self.acc, [tx, d]) * alpha, [tx, d])))
            pv = self.loop("j", sub, lambda jj: self.loop("d", self.dv, lambda d: st(
                self.acc, ld(self.acc, [tx, d])
                + ld(sc, [tx, jj]) * ld(self.v_tile, self.at(self.v_stride, first + jj, d)),
                [tx, d])))
            return seq(self.loop("j", sub, qk), tile_max, rescale, exps, update, pv)
        return self.threads(body)

    def _merge_lanes(self):
        """Lane 0 of each row takes in lanes 1, 2, ... one at a time through shared memory:
        ``m = max(m, m'), l = l a + l' b, acc = acc a + acc' b`` with ``a = exp(m_old - m)``,
        ``b = exp(m' - m)``."""
        form, ld, st, c, dv = self.form, self.ld, self.st, self.c, self.dv
        mg, state = self.merge, self.state
        phases = []

        def at(r, col):
            return self.at(self.m_stride, r, col)
        for lane in range(1, self.lanes):
            def publish(tx, lane=lane):
                r = self.local_row(tx)
                body = seq(
                    self.loop("d", dv, lambda d: st(mg, ld(self.acc, [tx, d]), at(r, d))),
                    st(mg, ld(state, self.s(tx, 0)), at(r, dv)),
                    st(mg, ld(state, self.s(tx, 1)), at(r, dv + 1)))
                return tirx.IfThenElse(self.lane(tx) == c(lane), body, None)

            def take(tx):
                r = self.local_row(tx)
                m_old, m_in = ld(state, self.s(tx, 0)), ld(mg, at(r, dv))
                m_new, a, b = (ld(state, self.s(tx, i)) for i in (2, 3, 4))
                body = seq(
                    st(state, tirx.Max(m_old, m_in), self.s(tx, 2)),
                    st(state, form.exp(m_old - m_new), self.s(tx, 3)),
                    st(state, form.exp(m_in - m_new), self.s(tx, 4)),
                    st(state, m_new, self.s(tx, 0)),
                    st(state, ld(state, self.s(tx, 1)) * a + ld(mg, at(r, dv + 1)) * b,
                       self.s(tx, 1)),
                    self.loop("d", dv, lambda d: st(
                        self.acc, ld(self.acc, [tx, d]) * a + ld(mg, at(r, d)) * b, [tx, d])))
                return tirx.IfThenElse(self.lane(tx) == c(0), body, None)
            phases += [self.threads(publish), self.threads(take)]
        return seq(*phases) if phases else None

    def _write(self):
        form, ld, st, c = self.form, self.ld, self.st, self.c

        def body(tx):
            inv = st(self.state, self.f(1.0) / ld(self.state, self.s(tx, 1)), self.s(tx, 4))

            def col(d):
                index = [substitute(i, {**self.row_vars(tx), form.col: d})
                         for i in form.out_indices]
                value = ld(self.acc, [tx, d]) * ld(self.state, self.s(tx, 4))
                if self.fold is not None:
                    return self.fold(index, value)
                return st(form.out, value, index)
            store = self.loop("d", self.dv, col)
            cond = None
            if self.clamp_rows:
                cond = self.row(tx, clamp=False) < self.sq
            if self.lanes > 1:
                first = self.lane(tx) == c(0)
                cond = first if cond is None else tirx.And(first, cond)
            return seq(inv, store if cond is None else tirx.IfThenElse(cond, store, None))
        return self.threads(body)

    def _core_body(self):
        c = self.c
        tiles = tirx.floordiv(self.sk + c(self.bc - 1), c(self.bc))
        if isinstance(self.sk, tirx.IntImm):
            tiles = c(-(-int(self.sk.value) // self.bc))

        def tile(kt):
            j0 = kt * c(self.bc)
            return seq(self._loads(j0), self._compute(j0))
        return seq(self._init(), self.loop("kt", tiles, tile, _SERIAL), self._merge_lanes(),
                    self._write())

    def build(self) -> tirx.PrimFunc:
        """The kernel: the tiles of query rows, then the epilogue not folded into it."""
        c, form = self.c, self.form
        body = self._core_body()
        nq = tirx.floordiv(self.sq + c(self.br - 1), c(self.br))
        if isinstance(self.sq, tirx.IntImm):
            nq = c(-(-int(self.sq.value) // self.br))
        extents = [*self.batch_ext, nq]
        ivs = self.iter_vars(extents, [*self.bvars, self.vq])
        local = [self.k_tile, self.v_tile, *([self.merge] if self.merge is not None else []),
                 self.q_reg, self.acc, self.scores, self.state]
        core = s_tir.SBlock(ivs, [], [], self.CORE, body, alloc_buffers=local)
        allocs = [b for b in form.allocs if self.fold is None or not b.same_as(form.out)]
        buffers = {b: b for b in [*form.func.params, *allocs]}
        root = s_tir.SBlock([], [], [], "root",
                            seq(self.nest(core, extents, buffers), *self.epilogue),
                            alloc_buffers=allocs)
        return form.func.with_body(s_tir.SBlockRealize([], True, root))


# ------------------------------------------------------------------ the graph's view
def _int(dim) -> int | None:
    if isinstance(dim, int):
        return dim
    return int(dim.value) if isinstance(dim, tirx.IntImm) else None


def flash_group(graph, group: frozenset[int]) -> tuple[int, int] | None:
    """Head dims ``(dk, dv)`` when ``group`` is what this rule takes, as far as the graph
    tells: the whole ``softmax(Q K^T) V`` chain (two activation matmuls, a row reduction
    between them, float32 from the scores on, nothing published before the second), with
    static head dims that fit one thread (:func:`flash_tiles` at the static shared-memory
    limit)."""
    from ...legality import attention_chain, reachable
    nodes = [graph.nodes[i] for i in sorted(group)]
    contractions = [n for n in nodes if n.is_contraction]
    if len(contractions) != 2 or not any(n.is_reduction for n in nodes):
        return None
    if not attention_chain(graph, group):
        return None
    first, second = contractions
    # float32 from the scores on (a prologue may cast an integer mask); nothing but what
    # follows P V published (the match wants the softmax private to the kernel)
    scores = {first.id} | reachable(graph.succs, first.id, group)
    tail = {second.id} | reachable(graph.succs, second.id, group)
    for n in group:
        t = graph.tensors[graph.nodes[n].outputs[0]]
        if n in scores and t.dtype != "float32":
            return None
        if n not in tail and (t.escapes or any(c not in group for c in t.consumers)):
            return None
    dk = _int(graph.tensors[first.inputs[0]].shape[-1])
    dv = _int(graph.tensors[second.outputs[0]].shape[-1])
    if dk is None or dv is None or flash_tiles(dk, dv, STATIC_SMEM_BYTES) is None:
        return None
    return dk, dv


def flash_kernel(graph, group: frozenset[int], rule: str, hw: HardwareSpec):
    """The :class:`~fusion_tvm.kernel_model.GpuKernel` of ``group`` under ``rule``.

    For this rule: one block per (batch dims, tile of query rows) with the tiles' shared
    memory; no intermediate but a tile of scores per query row, in registers; K and V read
    once more per further tile of query rows (from L2); a second launch when the ops after
    ``P V`` cannot be folded into its store. Any other attention chain (a part of one,
    ``Q K^T`` and the softmax; a float16 one) has no CUDA template: infeasible. Other
    groups: None.
    """
    from ...legality import attention_chain, reachable
    from ...ops import PatternKind
    from ...tir_analysis import evaluate, shape_elems

    dims = flash_group(graph, group) if rule == FlashAttention.name else None
    if dims is None:
        nodes = [graph.nodes[i] for i in group]
        if any(n.is_reduction for n in nodes) and attention_chain(graph, group):
            return GpuKernel(None, reason=(
                "no CUDA template runs this attention chain as one kernel (flash_attention "
                "takes the whole softmax(Q K^T) V, float32 from the scores on, with "
                f"dk + dv + {MIN_KEY_TILE} <= {REGISTER_FLOATS} floats per thread)"))
        return None
    dk, dv = dims
    first, second = (graph.nodes[i] for i in sorted(group) if graph.nodes[i].is_contraction)
    scores = graph.tensors[first.outputs[0]].shape
    static_rows = [_int(d) for d in scores[:-1]]
    limit = smem_limit(None, hw)
    tiles = flash_tiles(dk, dv, limit, _int(scores[-2]), _int(scores[-1]),
                        None if None in static_rows else math.prod(static_rows),
                        hw.gpu.sm_count)
    if tiles is None:
        need = shared_bytes(dk, dv, MIN_KEY_TILE)
        return GpuKernel(None, reason=(
            f"flash_attention: K / V tiles of {MIN_KEY_TILE} keys for head dims {dk} / {dv} "
            f"need {need / 1024:.1f} KiB of shared memory, over {limit / 1024:.0f} KiB per "
            f"block on {hw.name}"))
    batch = shape_elems(scores[:-2], graph.dims)
    sq, sk = evaluate(scores[-2], graph.dims), evaluate(scores[-1], graph.dims)
    query_tiles = math.ceil(sq / tiles.rows)
    size = shape_elems(graph.tensors[second.outputs[0]].shape, graph.dims)
    folded = all(  # what _fold_epilogue takes, as far as the graph tells
        n.pattern <= PatternKind.INJECTIVE and not n.is_view
        and shape_elems(graph.tensors[n.outputs[0]].shape, graph.dims) == size
        for n in (graph.nodes[i] for i in reachable(graph.succs, second.id, group)))
    shape = LaunchShape(int(max(1, batch * query_tiles)), tiles.threads, tiles.registers,
                        tiles.smem_bytes)
    return GpuKernel(shape, onchip_bytes=batch * sq * tiles.keys * 4,
                     reread_bytes=max(0, query_tiles - 1) * batch * sk * (dk + dv) * 4,
                     launches=1 if folded else 2)
