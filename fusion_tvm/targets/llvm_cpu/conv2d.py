"""Conv2d rule: NCHW direct convolution (dense, grouped, depthwise) with fused epilogue.

The convolution is computed as an implicit GEMM whose rows are output channels and whose
columns are output pixels of one row: each parallel task owns ``fr`` output channels times
``xr`` output columns of one output row, held in vector registers across the whole
reduction (input channels x kernel window). Per reduction step the kernel loads ``xr /
lanes`` input vectors (contiguous along the row for stride 1) and broadcasts ``fr``
weights: ``fr * xr / lanes`` FMAs for ``fr + xr / lanes`` loads. The fused epilogue (bias,
batch-norm arithmetic, ReLU, residual add) runs on the finished tile. The zero-padded input
is materialised once per call, in parallel, outside the kernel.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import ScheduleError

from ...attrs import PREPACK_ATTR
from ...hardware import HardwareSpec
from ..base import ScheduleRule
from ._util import (
    buffer_nbytes,
    constant_param,
    epilogue_at,
    inline_spatial,
    is_spatial,
    lanes,
    loop_map,
    nest_flops,
    parallel_vectorize,
    pick_vector_width,
    sole_contraction,
    static_extent,
)
from .efficiency import NCHW_PENALTY
from .parallel import conv_parallel_pays, repack_pays


@dataclass(frozen=True)
class ConvTiles:
    """Register tile: ``fr`` output channels x ``xvecs`` vectors of ``vec`` output columns."""

    fr: int
    xvecs: int
    vec: int


def _divisor_at_most(extent: int | None, cap: int) -> int:
    if extent is None:
        return 1
    return max(d for d in range(1, max(1, min(cap, extent)) + 1) if extent % d == 0)


def derive_tiles(hw: HardwareSpec, dtype_bits: int, channels: int | None,
                 width: int | None) -> ConvTiles | None:
    """Register tile for ``hw``; None when the output row is too narrow to vectorise.

    The accumulators ``fr * xvecs``, the ``xvecs`` input vectors and one broadcast weight
    must fit the vector registers; within that the tile maximises FMAs per load. Both factors
    divide their extents so there is no scalar tail.
    """
    vec = pick_vector_width(width, lanes(hw, dtype_bits))
    if vec < 4:
        return None
    regs = hw.num_vector_registers
    x_choices = [1] if width is None else [
        d for d in range(1, 9) if (width // vec) % d == 0
    ]
    f_choices = list(range(1, regs))
    # Maximise FMAs per load (fr * xv / (fr + xv)) with accumulators, the xv input vectors
    # and one broadcast weight all in registers (LLVM loads the whole input row first). A
    # channel tile that does not divide the channels costs its padded share of the work.
    def score(fr: int, xv: int) -> tuple:
        waste = 1.0 if channels is None else -(-channels // fr) * fr / channels
        return (fr * xv / (fr + xv) / waste, xv)

    best = max(
        ((fr, xv) for fr in f_choices for xv in x_choices if fr * xv + xv + 1 <= regs),
        key=lambda t: score(*t),
    )
    return ConvTiles(fr=best[0], xvecs=best[1], vec=vec)


def _var_of(expr) -> tirx.Var | None:
    return expr if isinstance(expr, tirx.Var) else None


class Conv2d(ScheduleRule):
    """Register-tiled direct NCHW convolution with tile-level epilogue."""

    name = "conv2d"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = sole_contraction(sch, 4)
        if found is None:
            return None
        main, stmt, out_vars = found
        iter_of = {iv.var: iv for iv in stmt.iter_vars}
        if any(v is None or v not in iter_of for v in out_vars):
            return None
        reduce_vars = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        # The data operand is read through a window: row/column index = spatial + reduction.
        windowed = [
            read
            for read in stmt.reads
            if len(read.region) == 4
            and all(
                {v for v in tirx.analysis.undefined_vars(r.min)} & set(reduce_vars)
                and {v for v in tirx.analysis.undefined_vars(r.min)} & set(out_vars[2:])
                for r in read.region[2:]
            )
        ]
        if len(windowed) != 1:
            return None
        loop_of = loop_map(sch, main)
        if loop_of is None:
            return None
        loops = list(loop_of.values())
        bits = int(stmt.writes[0].source.dtype.bits)
        flops = nest_flops(sch, loops)

        n_var, f_var, y_var, x_var = out_vars
        channels, width = static_extent(sch, loop_of[f_var]), static_extent(sch, loop_of[x_var])
        tiles = derive_tiles(hw, bits, channels, width)
        weight = 1 - list(stmt.reads).index(windowed[0])
        if tiles is None:
            # Rows too narrow for row vectors (14, 7 columns): vectorise output channels.
            weight_region = stmt.reads[weight].region
            dense = _var_of(weight_region[0].min) is not None and _var_of(
                weight_region[0].min
            ).same_as(f_var)
            ctiles = derive_channel_tiles(hw, bits, channels, width) if dense else None
            if ctiles is None:
                return None
            inline_spatial(sch, keep=(main,))
            return _schedule_channel_vector(sch, main, loop_of, out_vars, reduce_vars, weight,
                                            ctiles, hw, flops)
        inline_spatial(sch, keep=(main,))
        producers = [b for b in sch.get_producers(main) if is_spatial(sch, b)]
        # A grouped (depthwise) conv reads input channels by output channel: off the fast
        # path, NCHW_PENALTY times slower per FLOP, so its rows pay for the fork/join sooner.
        if f_var in set(tirx.analysis.undefined_vars(windowed[0].region[1].min)):
            flops = flops and flops * NCHW_PENALTY
        fo, fi = sch.split(loop_of[f_var], [None, tiles.fr])
        xo, xd, xv = sch.split(loop_of[x_var], [None, tiles.xvecs, tiles.vec])
        reds = [loop_of[v] for v in reduce_vars]
        sch.reorder(loop_of[n_var], fo, loop_of[y_var], xo, *reds, fi, xd, xv)
        outer = sch.fuse(loop_of[n_var], fo, loop_of[y_var])
        if conv_parallel_pays(hw, flops, static_extent(sch, outer),
                              buffer_nbytes(stmt.reads[weight].source) or 0.0):
            sch.parallel(outer)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, tiles.vec])[1])
        epilogue_at(sch, acc, xo, tiles.vec, hw)
        sch.unroll(fi)
        sch.unroll(xd)
        sch.vectorize(xv)
        sch.decompose_reduction(main, reds[0])
        for block in producers:  # zero padding, prologue: one parallel pass each
            with contextlib.suppress(ScheduleError):
                parallel_vectorize(sch, block, hw)
        return sch


@dataclass(frozen=True)
class ChannelTiles:
    """Register tile of the channel-vector kernel: ``fr`` channels x ``xr`` columns."""

    fr: int
    xr: int
    vec: int


def derive_channel_tiles(hw: HardwareSpec, dtype_bits: int, channels: int | None,
                         width: int | None) -> ChannelTiles | None:
    """Tile for narrow rows: output channels in vectors, ``xr`` columns broadcast.

    The ``xr * fr / vec`` accumulators take at most half the vector registers (LLVM
    hoists the broadcast inputs into the rest; a fuller tile measured 2.5x slower from
    spills); the tile maximises FMAs per load, ``fr`` divides the channels and ``xr`` the
    row so nothing is predicated.
    """
    vec = lanes(hw, dtype_bits)
    if channels is None or width is None or channels % vec:
        return None
    regs = hw.num_vector_registers
    cands = [
        (fv * vec, xr)
        for fv in (1, 2, 4)
        if channels % (fv * vec) == 0
        for xr in range(1, width + 1)
        if width % xr == 0 and xr * fv <= regs // 2
    ]
    if not cands:
        return None
    fr, xr = max(cands, key=lambda t: (t[0] // vec * t[1] / (t[0] // vec + t[1]), t[1]))
    return ChannelTiles(fr=fr, xr=xr, vec=vec)


def _schedule_channel_vector(sch, main, loop_of, out_vars, reduce_vars, weight, tiles, hw,
                             flops):
    """Channel-vector kernel: packed weights ``[f // fr, c, kh, kw, f % fr]``."""
    n_var, f_var, y_var, x_var = out_vars
    producers = [b for b in sch.get_producers(main) if is_spatial(sch, b)]
    fr, vec = tiles.fr, tiles.vec
    source = sch.get(main).reads[weight].source
    packed = sch.cache_read(main, weight, "global")
    sch.transform_layout(packed, ("write", 0), lambda o, i, h, w: (o // fr, i, h, w, o % fr))
    p_loops = sch.get_loops(packed)
    weights = nest_flops(sch, p_loops)
    p_fo, p_fi = sch.split(p_loops[0], [None, fr])
    sch.reorder(p_fo, *p_loops[1:], p_fi)
    if constant_param(sch.mod["main"], source) and len(sch.get(packed).reads) == 1:
        # PrepackWeights runs it at compile time: repacked on every call, MixNet-S's SE
        # expand convs (1200 x 100 weights, serial scatter) took 59 us for 0.24 MFLOP.
        sch.annotate(packed, PREPACK_ATTR, 1)
    elif repack_pays(hw, weights and weights / 2, static_extent(sch, p_fo)):
        sch.parallel(p_fo)

    fo, fv_o, fv = sch.split(loop_of[f_var], [None, fr // vec, vec])
    xo, xi = sch.split(loop_of[x_var], [None, tiles.xr])
    reds = [loop_of[v] for v in reduce_vars]
    sch.reorder(loop_of[n_var], fo, loop_of[y_var], xo, *reds, xi, fv_o, fv)
    outer = sch.fuse(loop_of[n_var], fo, loop_of[y_var])
    if conv_parallel_pays(hw, flops, static_extent(sch, outer), buffer_nbytes(source) or 0.0):
        sch.parallel(outer)
    acc = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
    # Channels innermost in the register tile so each accumulator is one whole vector.
    sch.transform_layout(acc, ("read", 0), lambda n, f, y, x: (n, y, x, f))
    epilogue_at(sch, acc, xo, vec, hw)
    sch.unroll(xi)
    sch.unroll(fv_o)
    sch.vectorize(fv)
    sch.decompose_reduction(main, reds[0])
    for block in producers:
        with contextlib.suppress(ScheduleError):
            parallel_vectorize(sch, block, hw)
    return sch
