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

from ...cost_models.hardware import HardwareSpec
from ..base import ScheduleRule
from ._util import (
    inline_spatial,
    is_reduction,
    is_spatial,
    lanes,
    parallel_vectorize,
    pick_vector_width,
    root_blocks,
    static_extent,
)


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
        blocks = root_blocks(sch)
        reductions = [b for b in blocks if not is_spatial(sch, b)]
        if len(reductions) != 1 or not is_reduction(sch, reductions[0]):
            return None
        main = reductions[0]
        stmt = sch.get(main)
        if len(stmt.reads) != 2 or len(stmt.writes) != 1 or len(stmt.writes[0].region) != 4:
            return None
        out_vars = [_var_of(r.min) for r in stmt.writes[0].region]
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
        # Loops must still be the plain nest, one per block iter, in iter order.
        loops = sch.get_loops(main)
        if len(loops) != len(stmt.iter_vars):
            return None
        loop_of = dict(zip((iv.var for iv in stmt.iter_vars), loops, strict=True))
        bits = int(stmt.writes[0].source.dtype.bits)

        n_var, f_var, y_var, x_var = out_vars
        tiles = derive_tiles(
            hw, bits, static_extent(sch, loop_of[f_var]), static_extent(sch, loop_of[x_var])
        )
        if tiles is None:
            return None
        inline_spatial(sch, keep=(main,))
        producers = [b for b in sch.get_producers(main) if is_spatial(sch, b)]

        fo, fi = sch.split(loop_of[f_var], [None, tiles.fr])
        xo, xd, xv = sch.split(loop_of[x_var], [None, tiles.xvecs, tiles.vec])
        reds = [loop_of[v] for v in reduce_vars]
        sch.reorder(loop_of[n_var], fo, loop_of[y_var], xo, *reds, fi, xd, xv)
        outer = sch.fuse(loop_of[n_var], fo, loop_of[y_var])
        if hw.num_cores > 1:
            sch.parallel(outer)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.split(sch.get_loops(acc)[-1], [None, tiles.vec])[1])
        frontier = list(sch.get_consumers(acc))
        while frontier:
            block = frontier.pop(0)
            try:
                sch.reverse_compute_at(block, xo, preserve_unit_loops=True)
            except ScheduleError:
                parallel_vectorize(sch, block, hw)
                continue
            with contextlib.suppress(ScheduleError):
                sch.vectorize(sch.split(sch.get_loops(block)[-1], [None, tiles.vec])[1])
            frontier.extend(sch.get_consumers(block))
        sch.unroll(fi)
        sch.unroll(xd)
        sch.vectorize(xv)
        sch.decompose_reduction(main, reds[0])
        for block in producers:  # zero padding, prologue: one parallel pass each
            with contextlib.suppress(ScheduleError):
                parallel_vectorize(sch, block, hw)
        return sch
