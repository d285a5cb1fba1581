"""Producers of a conv's input computed per task of its parallel row loop.

A producer the conv rules do not inline into the convolution (the zero padding, a concat,
a slice, a layout change) either runs as a parallel pass of its own over the whole input
before the conv, or is computed inside the conv's row loop for just the rows each task
reads, into a buffer that stays in cache (TVM compacts it to the task's region). The
second recomputes the rows neighbouring tasks share and, for a dense conv, the input once
per output-channel group; :func:`row_staging_pays` weighs that factor.
"""

from __future__ import annotations

import contextlib
import math

from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ._util import static_extent

#: Recompute factors up to which a producer of the conv's input is computed per row task
#: (:func:`row_staging_pays`): one that copies whole lane vectors, any other.
MAX_ROW_RECOMPUTE_LANES = 12.0
MAX_ROW_RECOMPUTE = 4.0


def row_staging_pays(recompute: float, lanes_kept: bool) -> bool:
    """Whether a producer of the conv's input that is not inlined into it (the zero
    padding, a concat, a slice, a layout change) is computed per task of the parallel row
    loop, into a buffer the conv then reads from cache, rather than in a parallel pass of
    its own over the whole input before the conv.

    ``recompute``: how many times per row the producer's elements are then computed
    (output-channel groups x input rows each output row reads / input rows per output
    row). Measured on the 2-core Zen 4, kernel alone, per row against one pass: concat
    + 1 x 1 conv 1.3-2.8x faster at 1-4 (SqueezeNet's fire modules, YOLOv8n's C2f), the
    padded copy of a 3 x 3 conv 1.15-1.6x at 2.7-10 (YOLOv8n), equal at 5-34 (GoogLeNet,
    a slice and ReLU), 0.64-0.77x at 29 when the producer gathers across lanes
    (ShuffleNetV2's channel shuffle into NCHW8c). A producer that keeps the lanes
    innermost copies whole vectors and pays at up to :data:`MAX_ROW_RECOMPUTE_LANES`; any
    other at up to :data:`MAX_ROW_RECOMPUTE`.

    For dense convs only: a depthwise conv does only ``kh * kw`` MACs per input element,
    and per row its prologue (an SE scale, a hard-swish) measured 0.74-3.4x kernel by
    kernel and DeepLabV3-MobileNetV3 0.97x as a whole (interleaved A/B).
    """
    return recompute <= (MAX_ROW_RECOMPUTE_LANES if lanes_kept else MAX_ROW_RECOMPUTE)


def _iterations(sch: s_tir.Schedule, block: SBlockRV) -> int:
    return math.prod(static_extent(sch, lp) or 1 for lp in sch.get_loops(block))


def _lanes_kept(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether every read of ``block`` indexes its last axis by the lane its write does."""
    stmt = sch.get(block)
    lane = stmt.writes[0].region[-1].min if len(stmt.writes) == 1 else None
    return isinstance(lane, tirx.Var) and all(
        r.region and r.region[-1].min.same_as(lane) for r in stmt.reads)


def stage_per_row(sch: s_tir.Schedule, producers: list[SBlockRV], outer) \
        -> tuple[s_tir.Schedule, list[SBlockRV]]:
    """Compute each producer per task of ``outer`` where :func:`row_staging_pays`; return
    the schedule and the producers left for a pass of their own. A trial on a copy of the
    schedule reads the recompute factor from the loops the producer gets."""
    kept = []
    for producer in producers:
        before = _iterations(sch, producer)
        lanes_kept = _lanes_kept(sch, producer)
        trial = sch.copy()
        try:
            trial.compute_at(producer, outer, preserve_unit_loops=True)
        except ScheduleError:
            kept.append(producer)
            continue
        if not row_staging_pays(_iterations(trial, producer) / max(1, before), lanes_kept):
            kept.append(producer)
            continue
        sch = trial
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.get_loops(producer)[-1])
    return sch, kept
