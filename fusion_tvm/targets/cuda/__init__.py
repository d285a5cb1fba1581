"""CUDA backend: dlight's GPU templates plus rules for fused kernels on NVIDIA GPUs."""

from .backend import CUDABackend, cuda_target
from .dlight_rules import DlightRule
from .fallback import BindThreads

__all__ = ["BindThreads", "CUDABackend", "DlightRule", "cuda_target"]
