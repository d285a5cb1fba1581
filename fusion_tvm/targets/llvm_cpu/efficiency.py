"""Measured efficiency of each LLVM-CPU schedule rule on this project's machine.

The roofline cost model multiplies a rule's efficiency into the peak FLOP/s of the work it
schedules (``RooflineCostModel.efficiency`` reads ``backend.rule_efficiency``), so each
figure is a *fraction of the HardwareSpec roofline*: roofline time (peak FLOP/s per op
class, bandwidth of the memory level holding the data) over the measured time.

How they were measured
----------------------
``python benchmarks/kernels.py --reps 15`` (2026-11-29, 22:58 UTC) on the 2-core AMD EPYC
(znver4, AVX-512) machine with the ``host`` preset, whose peak assumes 2.6 GHz x 2 FMA x 8
fp32 lanes x 2 = 83 GFLOP/s per core; the core turbos higher, so a GEMM exceeds 1.0. The
machine was shared (load average ~9 on 2 cores), so the table keeps the **single-thread
best of 15** interleaved repetitions (medians alongside); two-thread runs measured the
neighbours, not the kernels. One benchmark case per rule:

===========  ================================  =====================  ===========  =======
rule         case                              GFLOP/s best (median)  numpy best   eff.
===========  ================================  =====================  ===========  =======
matmul       fp32 GEMM 1024^3 (512^3: 108)     109 (101)              100 OpenBLAS 1.31
conv2d       ResNet 3x3 64->64 ch, 56x56       105 (47)               74 im2col    1.26
reduction    softmax 256x1024 (exp-bound)      2.2 (0.7)              4.1          0.15
elementwise  bias + ReLU 1024x1024 (8 MB)      11.5 (9.9)             3.0          0.57
fallback     GEMM 512^3, fallback rule only    0.5 (0.3)              66           0.006
===========  ================================  =====================  ===========  =======

Not calibrated separately: the matmul epilogue with GELU (erf is a scalar libm call:
45 GFLOP/s at 512^3), 14x14 convolutions (channel-vector kernel, weights repacked per call:
95 best / 46 median GFLOP/s), pooling windows (parallel rows only).
"""

from __future__ import annotations

#: Rule name -> fraction of the roofline reached (see the module docstring).
EFFICIENCY: dict[str, float] = {
    "matmul": 1.31,
    "conv2d": 1.26,
    "reduction": 0.5,  # with FastMathTransform (softmax 3.38 -> 0.12 ms); was 0.15 with libm
    "elementwise": 0.57,
    "fallback": 0.006,
    # Not calibrated separately: the cost model prices a blocked-layout conv as "conv2d"
    # and an attention chain as "matmul" (``roofline.rule_for_group``); these entries only
    # keep the table complete for code that looks rules up by their own name.
    "conv2d_nchwc": 1.26,
    "attention": 1.31,
    "flash_attention": 1.31,
    "staged_chain": 1.31,  # priced stage by stage (``RooflineCostModel._chained``)
}

#: Time of a depthwise or grouped conv's MAC left in NCHW (its channels, or each group's,
#: not whole blocks) against one in a full-rate block: the NCHW depthwise 3x3/2 of
#: MobileNetV3 (72 channels) ran at 12 GFLOP/s against 94-172 blocked, grouped 3x3 convs
#: (ResNeXt, RegNetY) at 23-76 against ~200 (2-core Zen 4); GhostNet's NCHW 5x5/2 depthwise
#: 16 GFLOP/s. ConvertToNCHWc's block choice, the conv rule's parallel decision and the
#: kernel model's price all use it. A dense conv left in NCHW runs as a matmul (1x1) or on
#: the row template, near the blocked rate: priced as full rate.
NCHW_PENALTY = 6.0
