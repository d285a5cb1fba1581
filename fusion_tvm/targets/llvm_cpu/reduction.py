"""Row-wise reduction rule (placeholder)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...cost_models.hardware import HardwareSpec
from ..base import ScheduleRule


class Reduction(ScheduleRule):
    """Row-wise reductions."""

    name = "reduction"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        return None
