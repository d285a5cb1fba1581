"""Target backends; importing this package registers the built-in ones."""

from . import (
    cuda,  # noqa: F401
    hls,  # noqa: F401
    llvm_cpu,  # noqa: F401  (registers "llvm")
)
from .base import Backend, ScheduleRule, get_backend, list_backends, register_backend

__all__ = ["Backend", "ScheduleRule", "get_backend", "list_backends", "register_backend"]
