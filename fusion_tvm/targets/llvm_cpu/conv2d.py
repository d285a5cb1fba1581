"""Conv2d rule (placeholder until the NCHW template lands)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...cost_models.hardware import HardwareSpec
from ..base import ScheduleRule


class Conv2d(ScheduleRule):
    """NCHW / depthwise conv2d with fused epilogue."""

    name = "conv2d"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        return None
