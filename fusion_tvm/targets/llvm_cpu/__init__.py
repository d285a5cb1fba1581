"""LLVM-CPU backend: schedule rules for fused kernels on CPUs."""

from .backend import LLVMCPUBackend
from .conv2d import Conv2d
from .elementwise import Elementwise
from .fallback import Fallback
from .matmul import Matmul
from .reduction import Reduction

__all__ = ["LLVMCPUBackend", "Conv2d", "Elementwise", "Fallback", "Matmul", "Reduction"]
