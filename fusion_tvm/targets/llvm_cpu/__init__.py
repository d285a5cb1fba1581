"""LLVM-CPU backend: schedule rules for fused kernels on CPUs."""

from .backend import LLVMCPUBackend
from .conv2d import Conv2d
from .conv2d_nchwc import Conv2dNCHWc
from .elementwise import Elementwise
from .fallback import Fallback
from .matmul import Matmul
from .reduction import Reduction

__all__ = [
    "LLVMCPUBackend", "Conv2d", "Conv2dNCHWc", "Elementwise", "Fallback", "Matmul", "Reduction",
]
