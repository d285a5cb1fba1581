"""Assumed efficiency of each CUDA schedule rule (fraction of the HardwareSpec roofline).

Not yet measured on a GPU (``benchmarks/gpu_check.sh`` prints the figures to calibrate
them). The roofline's contraction peak is the *tensor-core* FP16 rate of the preset
(989 TFLOP/s on an H100); dlight's matmul template runs FP32 on the SIMT cores, which
peak at 67 TFLOP/s, and reaches about half of that: 0.5 * 67 / 989 ~ 0.035. The other
rules are memory-bound on every zoo model; their figures are the fraction of HBM
bandwidth well-formed CUDA kernels of that shape usually reach.

The ``gpu`` cost model prices the generic templates at the raw roofline (these figures are
not applied to them). A kernel the backend describes itself (``CUDABackend.gpu_kernel``,
today ``flash_attention``) has its contraction FLOPs priced at its figure relative to
``matmul``'s, on the footing of the matmul kernels it replaces: ``flash_attention`` runs
``Q K^T`` and ``P V`` as FP32 FMAs on the SIMT cores with no register tiling across rows,
each FMA (or four, when nvcc vectorises the loads) fed by one shared-memory broadcast load,
so about 0.3 of the 67 TFLOP/s: 0.3 * 67 / 989 ~ 0.02, 0.57 of ``matmul``. Assumed, not
measured.
"""

from __future__ import annotations

#: Rule name -> fraction of the roofline reached.
EFFICIENCY: dict[str, float] = {
    "matmul": 0.035,
    "contraction": 0.008,
    "flash_attention": 0.02,
    "gemv": 0.7,
    "reduction": 0.6,
    "row_reduction": 0.6,
    "general_reduction": 0.6,  # dlight's GeneralReduction: the other row template
    "transpose": 0.6,
    "elementwise": 0.8,
    "fallback": 0.02,
    "bind_threads": 0.02,  # our catch-all after dlight's Fallback
}
