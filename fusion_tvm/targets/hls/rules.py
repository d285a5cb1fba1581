"""HLS schedule rules: they restructure little and annotate loops for the emitter.

* :class:`HlsPipeline` inlines elementwise intermediates into their consumers (an FPGA
  pipeline computes them on the fly; no BRAM buffer), then marks the innermost loop of
  every leaf block for ``#pragma HLS PIPELINE`` with the unroll factor the FPGA cost
  model picks under the group's DSP share.
* :class:`HlsAnnotateOnly` does the same without inlining; it matches anything.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..base import ScheduleRule
from .analysis import (
    PIPELINE_ATTR,
    UNROLL_ATTR,
    alloc_buffers,
    children,
    leaf_blocks,
    stream_bound_blocks,
)
from .cost_model import FpgaConfig, choose_unroll, interchange_pays


def _annotate(sch: s_tir.Schedule, hw, config: FpgaConfig) -> s_tir.Schedule:
    func = sch.mod["main"]
    leaves = leaf_blocks(func)
    bound = stream_bound_blocks(func)
    nests = choose_unroll([lb.nest(lb.name in bound) for lb in leaves],
                          config.fixed_bits is not None,
                          hw.fpga.dsp * config.dsp_share, config.max_unroll)
    for lb, nest in zip(leaves, nests, strict=True):
        if not lb.loops:
            continue
        loops = sch.get_loops(sch.get_sblock(lb.name))
        inner = loops[-1]
        sch.annotate(inner, PIPELINE_ATTR, int(nest.ii))
        if nest.unroll > 1:
            sch.annotate(inner, UNROLL_ATTR, int(nest.unroll))
    return sch


def _spatial_innermost(sch: s_tir.Schedule, lb, dsp_budget: float, max_unroll: int) -> None:
    """Move a spatial loop inside the reduction loops of an fp32 accumulation.

    ``C[i, j] += A[i, k] * B[k, j]`` pipelined over ``k`` waits for the adder each
    iteration (II = adder latency); with ``j`` innermost consecutive iterations update
    different elements, at II = 1 while ``extent / unroll`` covers the adder latency --
    the usual HLS interchange. Done when the FPGA model says it is faster.
    """
    if not lb.has_reduce or len(lb.loops) < 2:
        return
    kinds = []
    for lp in lb.loops:
        kind = None
        for iv, val in zip(lb.block.iter_vars, lb.realize.iter_values, strict=True):
            if _uses(val, lp.loop_var):
                kind = "reduce" if int(iv.iter_type) == 2 else (kind or "spatial")
        kinds.append(kind)
    if kinds[-1] != "reduce":
        return
    spatial = [k for k, kind in enumerate(kinds) if kind == "spatial"]
    if not spatial:
        return
    k = spatial[-1]
    if not interchange_pays(lb.nest(), int(lb.loops[k].extent.value), False, dsp_budget,
                            max_unroll):
        return
    loops = sch.get_loops(sch.get_sblock(lb.name))
    order = [loops[i] for i in range(k + 1, len(loops))] + [loops[k]]
    try:
        sch.reorder(*order)
    except Exception:  # noqa: BLE001 - keep the original order when TVM refuses
        return


def _uses(expr, var) -> bool:
    if type(expr).__name__ == "Var":
        return expr.same_as(var)
    return any(_uses(c, var) for c in children(expr))


class HlsPipeline(ScheduleRule):
    """Inline elementwise intermediates, then pipeline and unroll every leaf loop nest."""

    name = "hls.pipeline"

    def __init__(self, config: FpgaConfig | None = None):
        self.config = config or FpgaConfig()

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, hw) -> s_tir.Schedule | None:
        if hw.fpga is None:
            return None
        sch = s_tir.Schedule(func)
        outputs = {p.name for p in func.params}
        intermediates = {b.name for b in alloc_buffers(func)}
        for lb in leaf_blocks(sch.mod["main"]):
            written = getattr(lb.block.body.buffer, "name", "")
            if lb.has_reduce or written in outputs or written not in intermediates:
                continue
            try:
                sch.compute_inline(sch.get_sblock(lb.name))
            except Exception:  # noqa: BLE001 - TVM refuses what it cannot inline; keep it
                continue
        if self.config.fixed_bits is None:
            budget = hw.fpga.dsp * self.config.dsp_share
            for lb in leaf_blocks(sch.mod["main"]):
                _spatial_innermost(sch, lb, budget, self.config.max_unroll)
        return _annotate(sch, hw, self.config)


class HlsAnnotateOnly(ScheduleRule):
    """Pipeline and unroll annotations only (matches every function)."""

    name = "hls.annotate"

    def __init__(self, config: FpgaConfig | None = None):
        self.config = config or FpgaConfig()

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, hw) -> s_tir.Schedule | None:
        if hw.fpga is None:
            return None
        return _annotate(s_tir.Schedule(func), hw, self.config)
