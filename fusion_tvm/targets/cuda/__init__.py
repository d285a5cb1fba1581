"""CUDA backend: dlight's GPU templates plus rules for fused kernels on NVIDIA GPUs.

``fusion_tvm.compile(model, target="cuda", hw="h100")`` fuses with the ``gpu`` cost model
(roofline + occupancy, waves, launch overhead, per-block capacity) and schedules every
fused PrimFunc with the first rule that takes it:

=================  =====================================================================
rule               what
=================  =====================================================================
flash_attention    ours (:class:`FlashAttention`): the whole ``softmax(Q K^T) V`` chain as
                   one online-softmax kernel, a thread per query row, K / V tiles in
                   shared memory
matmul             dlight ``Matmul``: shared-memory tiled matmul / conv, fused epilogue
gemv               dlight ``GEMV``
reduction          dlight ``Reduction`` (also batch-1 fully connected layers)
row_reduction      dlight ``GeneralReduction``, then ours (:class:`RowReduction`) for
                   chains with prologues it declines (``add`` + ``layer_norm``, ...)
contraction        ours (:class:`SimtContraction`): a contraction with prologue /
                   epilogue dlight's ``Matmul`` declines, accumulators in registers
transpose          dlight ``Transpose``
elementwise        dlight ``Fallback`` on all-spatial functions
fallback           dlight ``Fallback``, then ours (:class:`BindThreads`), which always
                   binds threads so the kernel verifies
=================  =====================================================================

No GPU is needed to build: :func:`fusion_tvm.api.build_cuda` lowers a model and
:func:`build.nvcc_compile` compiles its CUDA source for an ``sm_XY`` (this TVM compiles
CUDA modules only when the runtime loads them). ``benchmarks/gpu_check.sh`` runs the zoo on
a GPU against onnxruntime, TVM's default CUDA pipeline and PyTorch.
"""

from .backend import CUDABackend, cuda_target
from .contraction import SimtContraction
from .dlight_rules import DlightRule
from .fallback import BindThreads
from .flash_attention import FlashAttention
from .reduction import RowReduction

__all__ = ["BindThreads", "CUDABackend", "DlightRule", "FlashAttention", "RowReduction",
           "SimtContraction", "cuda_target"]
