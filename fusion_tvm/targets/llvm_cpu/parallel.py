"""When a loop is worth the thread pool: the one parallel decision of the LLVM-CPU rules.

A parallel loop forks and joins TVM's thread pool (``HardwareSpec.parallel_overhead_s``:
the ``host`` spec measures it once per machine, 1.2-2.3 us on a 2-core Zen 4; presets
assume 10 us). A loop runs in parallel only when its
predicted serial time clearly exceeds that cost and it gives every thread a few chunks.
The schedule rules ask :func:`parallel_pays` with the work of the loop they shape; the
target's kernel model (``kernel_model.py``, which the roofline cost model asks through
``KernelModel.parallel_regions``) asks the same questions with the same work read off the
fusion graph, so the model charges exactly the fork/joins the rules emit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...hardware import HardwareSpec
from ...ops import OpClass
from .efficiency import EFFICIENCY

#: A loop runs in parallel only when its serial time exceeds this many fork/joins ...
PARALLEL_WORK_FACTOR = 3.0
#: ... and it has at least this many iterations per thread.
MIN_CHUNKS_PER_THREAD = 2


def rule_efficiency(hw: HardwareSpec, rule: str, shape_class: str | None = None) -> float:
    """The calibrated fraction of the roofline ``rule`` reaches (spec, then backend table)."""
    keys = ([f"{rule}:{shape_class}"] if shape_class else []) + [rule]
    for key in keys:
        if key in hw.efficiency:
            return float(hw.efficiency[key])
    return float(EFFICIENCY.get(rule, hw.default_efficiency))


def serial_seconds(
    hw: HardwareSpec,
    flops: Mapping[OpClass, float],
    nbytes: float = 0.0,
    rule: str = "elementwise",
    shape_class: str | None = None,
) -> float:
    """Predicted time of ``flops`` / ``nbytes`` on one core.

    Compute at one core's share of the spec's peak FLOP/s over the rule's calibrated
    efficiency; memory at one core's share of the bandwidth of the innermost level that
    holds ``nbytes`` in one core's share. The efficiency is not applied to memory: it was
    calibrated on multi-core runs, and a serial bias + ReLU streams several times faster
    than the efficiency-scaled bandwidth (64x256 to 1024x1024: 0.07-0.10 ns per element
    on znver4).
    """
    cores = max(1, hw.num_cores)
    compute = sum(f * cores / hw.peak_flops[c] for c, f in flops.items() if f > 0)
    bandwidth = hw.dram.bandwidth_bytes_per_s
    for lvl in hw.memory:
        if nbytes <= lvl.capacity_bytes:
            bandwidth = lvl.bandwidth_bytes_per_s
            break
    memory = nbytes * cores / bandwidth
    return max(compute / rule_efficiency(hw, rule, shape_class), memory)


def elementwise_seconds(
    hw: HardwareSpec, elements: float, bytes_per_element: float, calls_per_element: float = 0.0,
    rule: str = "elementwise",
) -> float:
    """Serial time of a spatial loop nest: one op, ``bytes_per_element`` moved and
    ``calls_per_element`` transcendental calls per output element."""
    flops = {OpClass.ELEMENTWISE: elements, OpClass.TRANSCENDENTAL: elements * calls_per_element}
    cls = "transcendental" if calls_per_element > 0 else "plain"
    return serial_seconds(hw, flops, elements * bytes_per_element, rule, cls)


def parallel_pays(hw: HardwareSpec, work_s: float | None, chunks: int | None = None) -> bool:
    """Whether a loop with ``work_s`` seconds of serial work in ``chunks`` iterations
    should run in parallel (None: symbolic, assumed large)."""
    if hw.num_cores <= 1:
        return False
    if chunks is not None and chunks < MIN_CHUNKS_PER_THREAD * hw.num_cores:
        return False
    if work_s is None:
        return True
    return work_s > PARALLEL_WORK_FACTOR * hw.parallel_overhead_s


def spatial_chunks(hw: HardwareSpec, extents: list[int], width: int) -> int:
    """Iterations of the parallel loop of a spatial nest with loop ``extents`` whose
    innermost loop runs in ``width``-lane vectors: the loops outside the innermost, joined
    by its whole vectors when those rows are too few for every thread's chunks (a
    ``(1, 1, 200704)`` reshape is one row of 12544 vectors, not one chunk)."""
    vectors = -(-int(extents[-1]) // max(1, width)) if extents else 1
    if len(extents) < 2:
        return vectors
    rows = int(math.prod(extents[:-1]))
    if rows < MIN_CHUNKS_PER_THREAD * hw.num_cores and extents[-1] > width:
        return rows * vectors
    return rows


def _contraction_pays(hw: HardwareSpec, cls: OpClass, rule: str, flops: float | None,
                      tasks: int | None) -> bool:
    if flops is None:
        return parallel_pays(hw, None, tasks)
    shape = "small" if flops < (1 << 21) else "large"
    return parallel_pays(hw, serial_seconds(hw, {cls: flops}, 0.0, rule, shape), tasks)


def matmul_tile_pays(hw: HardwareSpec, flops: float | None, tiles: int | None) -> bool:
    """Whether the register tiles of a GEMM (``flops`` in all) run in parallel."""
    return _contraction_pays(hw, OpClass.MATMUL, "matmul", flops, tiles)


def gemv_panel(hw: HardwareSpec, dtype_bits: int) -> int:
    """Columns per task of a one-row GEMV: two vectors, two accumulators in flight. A
    static ``n`` that is no multiple is padded to whole panels by the schedule: narrower
    panels run part-width vectors or one FMA chain (a 1000-class head 3x slower at 8
    columns, 1.6x at 16)."""
    return 2 * max(1, hw.simd_width_bits // dtype_bits)


def gemv_pays(hw: HardwareSpec, flops: float | None, weight_bytes: float | None,
              tasks: int | None) -> bool:
    """Whether the column panels of a one-row GEMV (``flops`` in all, streaming
    ``weight_bytes`` of B) run in parallel: the work is the stream of B, not its FLOPs
    (MobileNetV2's 1280 x 1000 classifier: 5 MB for 2.6 MFLOP)."""
    if flops is None or weight_bytes is None:
        return parallel_pays(hw, None, tasks)
    shape = "small" if flops < (1 << 21) else "large"
    work = serial_seconds(hw, {OpClass.MATMUL: flops}, weight_bytes, "matmul", shape)
    return parallel_pays(hw, work, tasks)


def conv_parallel_pays(hw: HardwareSpec, flops: float | None, tasks: int | None,
                       weight_bytes: float = 0.0) -> bool:
    """Whether the output rows of a convolution (``flops`` in all, ``tasks`` iterations of
    the fused batch x channel-tile x row loop, ``weight_bytes`` of filters streamed) run in
    parallel. A conv with a 1 x 1 or 2 x 2 output has too few tasks, a small depthwise
    layer too little work, for the fork/join. The work is the weight stream where that is
    longer than the arithmetic: a 960 -> 256 conv on a 1 x 1 image (DeepLabV3's pooled ASPP
    branch: 1 MB of filters for 0.5 MFLOP) is a GEMV, as :func:`gemv_pays` prices it."""
    if flops is None:
        return parallel_pays(hw, None, tasks)
    shape = "small" if flops < (1 << 21) else "large"
    work = serial_seconds(hw, {OpClass.CONV: flops}, weight_bytes, "conv2d", shape)
    return parallel_pays(hw, work, tasks)


def repack_pays(hw: HardwareSpec, weights: float | None, chunks: int | None) -> bool:
    """Whether repacking a conv weight (``weights`` elements, read and written once) runs in
    parallel over its ``chunks`` output-channel tiles."""
    if weights is None:
        return parallel_pays(hw, None, chunks)
    return parallel_pays(hw, elementwise_seconds(hw, weights, 8.0), chunks)


def reduction_pays(hw: HardwareSpec, elements: float | None, rows: int | None,
                   bytes_per_element: float = 8.0) -> bool:
    """Whether the rows of a reduction kernel (``elements`` iterations in all) run in
    parallel."""
    if elements is None:
        return parallel_pays(hw, None, rows)
    work = serial_seconds(hw, {OpClass.REDUCTION: elements}, elements * bytes_per_element,
                          "reduction")
    return parallel_pays(hw, work, rows)


#: Operations per element assumed for a matmul kernel's staged row pass (a norm: centre,
#: square, scale, shift; a softmax: subtract, exp, divide) in its parallel decision; the
#: matmul rule and the cost model's region count use the same figure.
ROW_PASS_OPS = 8.0


def row_kernel_pays(hw: HardwareSpec, flops: float | None, nbytes: float,
                    rows: int | None) -> bool:
    """Whether the rows of a row-wise (reduction rule) kernel run in parallel: all its
    arithmetic (``flops``, a softmax's polynomial exp included) and ``nbytes`` moved."""
    if flops is None:
        return parallel_pays(hw, None, rows)
    work = serial_seconds(hw, {OpClass.REDUCTION: flops}, nbytes, "reduction")
    return parallel_pays(hw, work, rows)


def pack_pays(hw: HardwareSpec, elements: float | None, bits: int, panels: int | None) -> bool:
    """Whether packing B (read and written once, ``elements`` in all) runs in parallel."""
    if elements is None:
        return parallel_pays(hw, None, panels)
    return parallel_pays(hw, elementwise_seconds(hw, elements, 2 * bits / 8), panels)
