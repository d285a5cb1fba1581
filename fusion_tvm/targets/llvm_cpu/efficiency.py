"""Measured efficiency of each LLVM-CPU schedule rule on this project's machine.

The roofline cost model multiplies a rule's efficiency into the peak FLOP/s of the work it
schedules (``RooflineCostModel.efficiency`` looks up ``backend.rule_efficiency``), so the
figures are *fractions of the HardwareSpec roofline*: roofline time (peak FLOP/s per op
class, bandwidth of the memory level holding the data) over the measured median time.

How they were measured
----------------------
``python benchmarks/kernels.py --reps 11`` on the 2-core AMD EPYC (znver4, AVX-512) CI
machine, ``host`` hardware preset (its peak assumes ~2.6 GHz x 2 FMA x 8 fp32 lanes x 2 per
core = 83 GFLOP/s per core; the core turbos above that, so a GEMM can exceed 1.0). One
thread per kernel, interleaved with numpy/OpenBLAS, median of 11; the machine was shared
with other jobs (load average 3-10), so single-thread figures are used: two-thread runs
were dominated by the neighbours. One case per rule (``CALIBRATES`` in the benchmark):

=============  ===================================  ========================================
rule           case                                 measured (1 thread)
=============  ===================================  ========================================
matmul         fp32 GEMM 1024^3                     ~105 GFLOP/s, 1.0-1.1x OpenBLAS
conv2d         ResNet 3x3, 64->64 ch, 56x56         ~100 GFLOP/s, >1x im2col + OpenBLAS
reduction      softmax 256x1024 (exp-bound)         scalar libm expf dominates
elementwise    bias + ReLU 1024x1024 (8 MB)         memory-bound
fallback       GEMM 512^3 with the fallback only    ~0.2-1 GFLOP/s (untemplated contraction)
=============  ===================================  ========================================

Narrow-row convolutions (14x14, 7x7 maps) use the channel-vector kernel, which repacks the
weights on every call: ~20-35 GFLOP/s (0.25-0.4), not separately calibrated.
"""

from __future__ import annotations

#: Rule name -> fraction of the roofline reached (see the module docstring).
EFFICIENCY: dict[str, float] = {
    "matmul": 1.2,
    "conv2d": 1.1,
    "reduction": 0.14,
    "elementwise": 0.1,
    "fallback": 0.005,
}
