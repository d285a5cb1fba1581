"""Fallback rule: matches any PrimFunc; parallel outer loops, vectorized inner loops."""

from __future__ import annotations

import contextlib

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import ScheduleError

from ...hardware import HardwareSpec
from ...ops import OpClass
from ..base import ScheduleRule
from ._util import inline_spatial, is_spatial, parallel_vectorize
from .parallel import parallel_pays, serial_seconds


class Fallback(ScheduleRule):
    """Last rule of the list: always returns a schedule, however plain.

    Spatial blocks get :func:`parallel_vectorize`; blocks with reductions get their
    leading spatial loops fused into one parallel loop. Any primitive the IR refuses is
    skipped, so the rule never fails on a valid PrimFunc.
    """

    name = "fallback"
    catch_all = True

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        try:
            blocks = inline_spatial(sch)
        except ScheduleError:  # no root block (opaque or already-lowered function)
            return sch
        for block in blocks:
            # A primitive that half-applies leaves a valid schedule; go on with the next block.
            with contextlib.suppress(ScheduleError):
                if is_spatial(sch, block):
                    parallel_vectorize(sch, block, hw)
                else:
                    _parallel_leading_spatial(sch, block, hw)
        return sch


def _parallel_leading_spatial(sch: s_tir.Schedule, block, hw: HardwareSpec) -> None:
    """Fuse the loops above the first reduction loop and run them in parallel."""
    if hw.num_cores <= 1:
        return
    spatial_vars = {
        iv.var for iv in sch.get(block).iter_vars if iv.iter_type == tirx.IterVar.DataPar
    }
    iter_vars = [iv.var for iv in sch.get(block).iter_vars]
    bindings = dict(zip(iter_vars, _block_bindings(sch, block), strict=True))
    lead = []
    for loop in sch.get_loops(block):
        loop_var = sch.get(loop).loop_var
        users = [v for v, b in bindings.items() if _uses(b, loop_var)]
        if not users or any(v not in spatial_vars for v in users):
            break
        lead.append(loop)
    if not lead:
        return
    def product(loops):
        total = 1
        for loop in loops:
            ext = sch.get(loop).extent
            if not isinstance(ext, tirx.IntImm):
                return None
            total *= int(ext.value)
        return total

    # The whole iteration space, one reduction step per point, at the fallback's efficiency.
    work = product(sch.get_loops(block))
    work_s = None if work is None else \
        serial_seconds(hw, {OpClass.REDUCTION: work}, 4.0 * work, "fallback")
    if not parallel_pays(hw, work_s, product(lead)):
        return
    with contextlib.suppress(ScheduleError):
        fused = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        sch.parallel(fused)


def _block_bindings(sch: s_tir.Schedule, block):
    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    return list(realize.iter_values)


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))
