"""Cost models, hardware specs and presets."""

# importing registers "roofline"; the targets register their own ("gpu", "fpga")
from ..hardware import DeviceKind, FpgaResources, GpuLimits, HardwareSpec, MemoryLevel, OpClass
from ..presets import get_hardware, list_hardware, register_hardware
from . import roofline  # noqa: F401
from .base import Cost, CostModel, get_cost_model, list_cost_models, register_cost_model

__all__ = [
    "Cost",
    "CostModel",
    "DeviceKind",
    "FpgaResources",
    "GpuLimits",
    "HardwareSpec",
    "MemoryLevel",
    "OpClass",
    "get_cost_model",
    "get_hardware",
    "list_cost_models",
    "list_hardware",
    "register_cost_model",
    "register_hardware",
]
