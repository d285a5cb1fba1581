"""The LLVM-CPU backend: x86/ARM CPUs through TVM's LLVM code generator."""

from __future__ import annotations

from collections.abc import Sequence

from ...cost_models.hardware import DeviceKind, HardwareSpec
from ...legality import TemplateLimits
from ..base import Backend, ScheduleRule, register_backend
from .attention import Attention
from .conv2d import Conv2d
from .efficiency import EFFICIENCY
from .elementwise import Elementwise
from .fallback import Fallback
from .matmul import Matmul
from .reduction import Reduction


@register_backend("llvm")
class LLVMCPUBackend(Backend):
    """CPU backend: schedule templates sized from the :class:`HardwareSpec`."""

    default_hardware = "host"

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.CPU

    @property
    def template_limits(self) -> TemplateLimits:
        """One contraction per group, or an attention chain (see ``attention.py``)."""
        return TemplateLimits(attention=True)

    @property
    def rule_efficiency(self) -> dict[str, float]:
        """Measured fraction of the roofline each rule reaches (see ``efficiency.py``)."""
        return dict(EFFICIENCY)

    def schedule_rules(self, hw: HardwareSpec) -> Sequence[ScheduleRule]:
        """Most specific first; :class:`Fallback` matches anything."""
        return (Attention(), Matmul(), Conv2d(), Reduction(), Elementwise(), Fallback())
