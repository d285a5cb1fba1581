"""TVM's dlight GPU rules wrapped as :class:`~fusion_tvm.targets.base.ScheduleRule`.

dlight's rules take ``(func, target, tunable)`` and answer a schedule, a list of them or
None; ours take ``(func, target, hw)``. The wrapper keeps dlight's "None means not mine"
and takes the first schedule of a list.
"""

from __future__ import annotations

import logging

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from .verify import lowers

logger = logging.getLogger(__name__)


class DlightRule(ScheduleRule):
    """One dlight GPU rule under our rule name.

    Parameters
    ----------
    name : str
        Our rule name (also the cost model's efficiency key).
    rule : tvm.s_tir.dlight.ScheduleRule
        The dlight rule instance.
    """

    def __init__(self, name: str, rule, verify: bool = True, catch_all: bool = False):
        self.name = name
        self.catch_all = catch_all
        self.rule = rule
        self.verify = verify

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        # TIR nodes are immutable: dlight schedules a copy-on-write module of ``func``.
        space = self.rule.apply(func, target, False)
        if isinstance(space, (list, tuple)):
            space = space[0] if space else None
        if space is None:
            return None
        if self.verify:
            # dlight can return schedules TVM cannot lower (a matmul whose epilogue feeds
            # several sliced outputs: "reindex_pad used before its definition"): decline.
            error = lowers(space, target)
            if error is not None:
                logger.debug("dlight %s schedule does not lower: %s", self.name, error)
                return None
        return space

    def __repr__(self) -> str:
        return f"DlightRule({self.name!r}, {type(self.rule).__name__})"


def dlight_matmul() -> DlightRule:
    """Tiled shared-memory matmul (batched, with prologue / epilogue inlining)."""
    return DlightRule("matmul", dl.gpu.Matmul())


def dlight_gemv() -> DlightRule:
    """Matrix-vector products (batch-1 fully connected layers, decode steps)."""
    return DlightRule("gemv", dl.gpu.GEMV())


def dlight_reduction() -> DlightRule:
    """One reduction with an elementwise epilogue, cross-thread reduced."""
    return DlightRule("reduction", dl.gpu.Reduction())


def dlight_general_reduction() -> DlightRule:
    """Chains of row reductions (softmax, layer norm), one thread block per row."""
    return DlightRule("general_reduction", dl.gpu.GeneralReduction())


def dlight_transpose() -> DlightRule:
    """Shared-memory tiled transposes."""
    return DlightRule("transpose", dl.gpu.Transpose())


class _SpatialOnly(DlightRule):
    """A dlight rule applied only to functions whose blocks are all data-parallel."""

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        if not all_spatial(func):
            return None
        return super().apply(func, target, hw)


def all_spatial(func: tirx.PrimFunc) -> bool:
    """Whether every block of ``func`` has only data-parallel iters (no reduction)."""
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: an opaque function
        return False
    return all(
        iv.iter_type == tirx.IterVar.DataPar for b in blocks for iv in sch.get(b).iter_vars
    )


def elementwise() -> DlightRule:
    """Injective kernels: inline into the output block, bind its fused loop to threads."""
    return _SpatialOnly("elementwise", dl.gpu.Fallback())


def dlight_fallback() -> DlightRule:
    """Inline everything, bind the spatial loops of what is left."""
    return DlightRule("fallback", dl.gpu.Fallback(), catch_all=True)
