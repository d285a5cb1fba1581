"""Conv2dNCHWc rule: blocked ``NCHW[b]c`` convolutions (dense and depthwise), fused epilogue.

The output-channel block ``b`` is the vector: each parallel task (batch item, ``fo`` output
channel blocks, one output row) walks the row in tiles of ``xr`` columns and keeps
``fo * xr`` accumulators of ``b`` lanes in registers across the whole reduction. A dense
step (input channel, kernel row, kernel column) loads ``fo`` weight vectors and broadcasts
``xr`` input elements for ``fo * xr`` FMAs; a depthwise step loads ``xr`` input vectors and
one weight vector for ``xr`` FMAs. The row length no longer limits the vector (7- and
14-wide rows vectorise as well as 56-wide ones). Epilogue ops (bias, BN arithmetic, ReLU,
residual add) run on the finished tile; the zero-padded input is materialised once per
call, in parallel, for a stride-1 dense conv and read inline (guarded loads) by a
depthwise or strided one.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ...hardware import HardwareSpec, OpClass
from ...tir_analysis import count_ops
from ..base import ScheduleRule
from ._util import (
    buffer_nbytes,
    epilogue_at,
    inline_spatial,
    is_spatial,
    knob_choices,
    lanes,
    loop_map,
    nest_flops,
    parallel_vectorize,
    sole_contraction,
    static_extent,
)
from .parallel import conv_parallel_pays
from .row_staging import stage_per_row

#: Ops per element of a prologue a depthwise conv recomputes inline with its padding
#: (a clip, a bias and ReLU, BN's multiply-add); a SiLU's polynomial sigmoid is not one.
MAX_INLINE_PROLOGUE_OPS = 4
#: Tensors that prologue may read: a concat along the channel blocks reads two (GhostNet's
#: ghost halves: concat + 3 x 3 / 2 depthwise 67 -> 13 us inline, against 9 + 12 us as two
#: kernels; the padded pass was serial-slow with the concat's select in it). Only a select
#: reads more than one: arithmetic on two tensors loads both on every tap (LCNet's
#: hard-swish multiply inlined into the depthwise: the model 3.6-5% slower).
MAX_INLINE_PROLOGUE_SOURCES = 2


#: Output columns of a depthwise register tile. Each column is one FMA per loaded vector
#: (no reuse across columns to gain), and with the padding read inline every column
#: carries its own bounds guards: the tuner's measurements on MobileNetV2 (znver4, 2
#: threads) picked 1-4 columns on every depthwise layer, 1.2-2.5x faster than 14-16.
DEPTHWISE_MAX_XR = 4


@dataclass(frozen=True)
class BlockedTiles:
    """``fo`` output-channel blocks x ``xr`` output columns of accumulators."""

    fo: int
    xr: int


def _divisors(extent: int | None, cap: int) -> list[int]:
    if extent is None:
        return [1]
    return [d for d in range(1, min(cap, extent) + 1) if extent % d == 0]


def derive_blocked_tiles(hw: HardwareSpec, dtype_bits: int, block: int, chan_blocks: int | None,
                         width: int | None, depthwise: bool,
                         weight_block_bytes: int = 0) -> BlockedTiles:
    """Register tile for ``hw``.

    Accumulators (``ceil(block / lanes)`` registers each) take at most half the vector
    registers: LLVM keeps the step's operands in the rest (a 2 x 14 tile filling all 32
    zmm registers measured 3.5x slower than 2 x 7 from spills). Dense: the ``fo`` output
    channel blocks' weights (``weight_block_bytes`` each) stay within half the private cache
    (8 blocks of a 256-channel 3x3 conv, 1.2 MB, measured 1.4x slower than 2), and the tile
    maximises FMAs per load, ``fo * xr / (fo + xr)``. Depthwise: ``xr`` input vectors and
    one weight vector per step, ``xr`` at most :data:`DEPTHWISE_MAX_XR`. Both factors
    divide their extents: no tail.
    """
    regs = hw.num_vector_registers
    per_acc = max(1, -(-block // lanes(hw, dtype_bits)))
    max_acc = max(1, regs // (2 * per_acc))
    if depthwise:
        return BlockedTiles(fo=1, xr=max(_divisors(width, min(max_acc, DEPTHWISE_MAX_XR))))
    private = [lvl.capacity_bytes for lvl in hw.memory[:-1] if not lvl.shared]
    budget = max(private) // 2 if private else 1 << 18
    max_fo = max(1, budget // weight_block_bytes) if weight_block_bytes else 8
    cands = [
        (fo, xr)
        for fo in _divisors(chan_blocks, min(8, max_fo))
        for xr in _divisors(width, max_acc)
        if fo * xr <= max_acc
    ]
    fo, xr = max(cands, key=lambda t: (t[0] * t[1] / (t[0] + t[1]), t[1]))
    return BlockedTiles(fo=fo, xr=xr)


def _var_of(expr) -> tirx.Var | None:
    return expr if isinstance(expr, tirx.Var) else None


def _depends(expr, variables) -> bool:
    return bool({v for v in tirx.analysis.undefined_vars(expr)} & set(variables))


def _pad_ops(sch: s_tir.Schedule, block, sources: int = 1) -> int | None:
    """Arithmetic ops per element of ``block`` when it zero-pads (an elementwise function
    of) function parameters with lanes kept innermost, at most ``sources`` of them (a
    concat along the channel blocks reads two); None for any other block."""
    stmt = sch.get(block)
    if not 1 <= len(stmt.reads) <= sources or len(stmt.writes) != 1:
        return None
    params = sch.mod["main"].params
    if not all(any(p.same_as(r.source) for p in params) for r in stmt.reads):
        return None
    lane = stmt.writes[0].region[-1].min
    if not isinstance(lane, tirx.Var) or \
            not all(r.region[-1].min.same_as(lane) for r in stmt.reads):
        return None
    value = stmt.body.value if isinstance(stmt.body, tirx.BufferStore) else None
    if value is None:
        return None
    if _is_select(value):
        value = value.args[1]  # the padding's guard is not the prologue's work
    if len(stmt.reads) > 1 and not _selects_loads(value):
        return None  # arithmetic on two tensors: both loaded on every tap
    ops = count_ops(value)
    if ops.get(OpClass.TRANSCENDENTAL):
        return None
    return ops.get(OpClass.ELEMENTWISE, 0)


def _is_select(expr) -> bool:
    return getattr(getattr(expr, "op", None), "name", "").endswith("if_then_else")


def _selects_loads(expr) -> bool:
    """Whether ``expr`` picks one load by conditions (a concat): every element then
    loads one tensor."""
    if _is_select(expr):
        return _selects_loads(expr.args[1]) and _selects_loads(expr.args[2])
    return isinstance(expr, tirx.BufferLoad)


@dataclass
class _Match:
    """What the rule learnt of a blocked conv before scheduling it."""

    main: SBlockRV
    out_vars: list
    reduce_vars: list
    loop_of: dict
    weight: tirx.Buffer
    block: int
    depthwise: bool
    tiles: BlockedTiles
    chan_blocks: int | None
    width: int | None
    max_acc: int


def _match(sch: s_tir.Schedule, hw: HardwareSpec) -> _Match | None:
    found = sole_contraction(sch, 5)
    if found is None:
        return None
    main, stmt, out_vars = found
    spatial = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    reduce_vars = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if any(v is None or v not in spatial for v in out_vars) or len(spatial) != 5:
        return None
    lane_var = out_vars[4]
    # data[n, c, y * s + ry, x * s + rx, ci]: windowed rows and columns.
    data = [
        r for r in stmt.reads
        if len(r.region) == 5
        and all(_depends(d.min, reduce_vars) and _depends(d.min, out_vars[2:4])
                for d in r.region[2:4])
    ]
    if len(data) != 1:
        return None
    weight = [r for r in stmt.reads if not r.source.same_as(data[0].source)]
    if len(weight) != 1 or _var_of(weight[0].region[-1].min) is None \
            or not weight[0].region[-1].min.same_as(lane_var):
        return None
    data_lane = _var_of(data[0].region[-1].min)
    depthwise = data_lane is not None and data_lane.same_as(lane_var)
    if not depthwise and len(weight[0].region) != 6:
        return None
    loop_of = loop_map(sch, main)
    if loop_of is None:
        return None
    bits = int(stmt.writes[0].source.dtype.bits)
    block = static_extent(sch, loop_of[lane_var])
    vec = lanes(hw, bits)
    if block is None or block < 4 or block % min(block, vec):
        return None
    reduce_extents = [static_extent(sch, loop_of[v]) for v in reduce_vars]
    weight_bytes = 0 if None in reduce_extents else \
        math.prod(reduce_extents) * block * bits // 8
    chan_blocks = static_extent(sch, loop_of[out_vars[1]])
    width = static_extent(sch, loop_of[out_vars[3]])
    tiles = derive_blocked_tiles(hw, bits, block, chan_blocks, width, depthwise, weight_bytes)
    per_acc = max(1, -(-block // vec))
    max_acc = max(1, hw.num_vector_registers // per_acc - 4)
    return _Match(main, out_vars, reduce_vars, loop_of, weight[0].source, block, depthwise,
                  tiles, chan_blocks, width, max_acc)


class Conv2dNCHWc(ScheduleRule):
    """Register-tiled blocked convolution, output-channel lanes vectorised.

    Knobs: ``fo`` (output-channel blocks) and ``xr`` (output columns) of the register
    tile, each a divisor of its extent.
    """

    name = "conv2d_nchwc"

    def knobs(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> dict[str, tuple]:
        m = _match(s_tir.Schedule(func), hw)
        if m is None:
            return {}
        fos = [1] if m.depthwise else _divisors(m.chan_blocks, 8)
        xrs = _divisors(m.width, m.max_acc)
        return {"fo": knob_choices(fos, m.tiles.fo), "xr": knob_choices(xrs, m.tiles.xr)}

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec,
        knobs: dict | None = None,
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        m = _match(sch, hw)
        if m is None:
            return None
        knobs = dict(knobs or {})
        tiles = BlockedTiles(fo=int(knobs.pop("fo", m.tiles.fo)),
                             xr=int(knobs.pop("xr", m.tiles.xr)))
        if knobs:
            raise ValueError(f"unknown conv2d_nchwc knobs: {sorted(knobs)}")
        if tiles.fo * tiles.xr > m.max_acc:
            raise ValueError(f"a {tiles.fo} x {tiles.xr} tile needs more vector registers")
        main, reduce_vars, loop_of = m.main, m.reduce_vars, m.loop_of
        n_var, f_var, y_var, x_var, lane_var = m.out_vars
        block, depthwise = m.block, m.depthwise
        loops = sch.get_loops(main)
        flops = nest_flops(sch, loops)

        inline_spatial(sch, keep=(main,))
        producers = [b for b in sch.get_producers(main) if is_spatial(sch, b)]
        fo, fi = sch.split(loop_of[f_var], [None, tiles.fo])
        xo, xi = sch.split(loop_of[x_var], [None, tiles.xr])
        reds = [loop_of[v] for v in reduce_vars]
        sch.reorder(loop_of[n_var], fo, loop_of[y_var], xo, *reds, fi, xi, loop_of[lane_var])
        outer = sch.fuse(loop_of[n_var], fo, loop_of[y_var])
        if conv_parallel_pays(hw, flops, static_extent(sch, outer),
                              buffer_nbytes(m.weight) or 0.0):
            sch.parallel(outer)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.get_loops(acc)[-1])
        epilogue_at(sch, acc, xo, block, hw)
        sch.unroll(fi)
        sch.unroll(xi)
        sch.vectorize(loop_of[lane_var])
        sch.decompose_reduction(main, reds[0])
        sources = MAX_INLINE_PROLOGUE_SOURCES if depthwise else 1
        ops = _pad_ops(sch, producers[0], sources) if len(producers) == 1 else None
        if ops is not None and depthwise and ops <= MAX_INLINE_PROLOGUE_OPS:
            # A depthwise step is one FMA per loaded vector: a padded copy of the input
            # (a full extra write and read) costs more than guarded loads reading the zeros
            # inline (MobileNetV2's stride-2 96-channel depthwise layer 218 -> 64 us).
            # Inlined, a prologue runs once per tap: only a few cheap ops go along. A dense
            # conv keeps the copy (staged per row below): guarded loads, strided or not,
            # measured 0.93-0.99x the copy on ResNet-18's stride-2 3 x 3s and 2.1-2.3x
            # slower on 16-48-channel ones over 112-320 px (DLA-34, YOLOv8n, TinyViT,
            # RepVGG).
            with contextlib.suppress(ScheduleError):
                sch.compute_inline(producers[0])
                producers = []
        if not depthwise:  # see row_staging_pays for why not a depthwise conv
            sch, producers = stage_per_row(sch, producers, outer)
        # Zero padding / prologue: one parallel pass each, and so is a prologue output the
        # group publishes that they (or the inlined padding) read.
        for producer in producers + _published_upstream(sch, main, producers):
            with contextlib.suppress(ScheduleError):
                parallel_vectorize(sch, producer, hw)
        return sch


def _published_upstream(sch: s_tir.Schedule, main: SBlockRV,
                        shaped: list[SBlockRV]) -> list[SBlockRV]:
    """Spatial blocks upstream of ``main`` outside its loops and not in ``shaped``: the
    prologue outputs a kernel publishes (they cannot be inlined), which the padding, a
    prologue pass or the conv's guarded loads read. Upstream first."""
    top = sch.get(sch.get_loops(main)[0])
    shaped_stmts = [sch.get(b) for b in shaped]
    seen: list = []
    found: list[SBlockRV] = []
    pending = list(sch.get_producers(main))
    while pending:
        b = pending.pop()
        stmt = sch.get(b)
        if any(stmt.same_as(v) for v in seen):
            continue
        seen.append(stmt)
        loops = sch.get_loops(b)
        if loops and not sch.get(loops[0]).same_as(top) and is_spatial(sch, b) \
                and not any(stmt.same_as(v) for v in shaped_stmts):
            found.append(b)
        pending.extend(sch.get_producers(b))
    return found[::-1]
