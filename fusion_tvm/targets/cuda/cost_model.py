"""A GPU cost model: the roofline plus occupancy, wave quantisation and capacity.

For one candidate group (one CUDA kernel) the roofline gives the compute and memory
times at full-device rates. A GPU reaches those rates only with enough resident warps
and enough thread blocks, so this model prices the kernel's *launch shape*:

* **per-block footprint** — threads, registers per thread and shared memory per block
  of the template that will run the group (tiled matmul, one block per row for
  reduction chains, one thread per element for elementwise), plus the group's on-chip
  intermediates (what the roofline keeps in cache: reduction rows, contraction outputs
  re-read) divided among the blocks;
* **feasibility** — a block whose shared memory exceeds ``shared_memory_per_block``, or
  whose registers exceed ``max_registers_per_thread`` or the SM's register file, cannot
  launch: the group is infeasible and the reason says which resource overflowed;
* **occupancy** — resident blocks per SM = min over threads, registers and shared
  memory; memory-bound kernels need about half the SM's warps to saturate HBM, so the
  memory time is divided by ``min(1, occupancy / OCCUPANCY_FOR_PEAK_BW)`` (occupancy over
  all SMs: a grid of fewer blocks than SMs leaves the others idle);
* **wave quantisation** — ``waves = ceil(blocks / (resident * SMs))``; the last wave is
  partly idle, a kernel with fewer blocks than SMs leaves SMs idle outright, and an SM
  with fewer than 8 warps cannot fill its pipelines, so the compute time is divided by
  the product of those fractions (:func:`compute_utilization`);
* **launch overhead** — ``hw.launch_overhead_s`` (~4 us per CUDA launch), once per group,
  plus one per published producer a row-reduction template must launch apart
  (:func:`split_launches`).

time = launch + max(compute / util, memory / occupancy factor) + intermediates

A target whose rule makes a kernel these generic template guesses do not describe (the
CUDA online-softmax attention) answers ``KernelModel.gpu_kernel(graph, group, rule, hw)``
with a :class:`~fusion_tvm.kernel_model.GpuKernel`: its launch shape, on-chip
intermediates, cache re-reads (added to the memory time at L2 bandwidth) and launches
replace the guesses, and its contraction FLOPs are priced at the rule's efficiency
relative to the matmul template's (:meth:`GpuCostModel.relative_efficiency`: the generic
templates' contractions are priced at the raw tensor-core roofline, their efficiencies
not applied). A :class:`GpuKernel`
without a shape makes the group infeasible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...cost_models.base import Cost, register_cost_model
from ...cost_models.roofline import RooflineCostModel
from ...errors import InvalidHardwareSpecError
from ...graph import FusionGraph
from ...hardware import GpuLimits, HardwareSpec, OpClass
from ...kernel_model import GpuKernel, LaunchShape
from ...legality import GroupKind, classify
from ...tir_analysis import shape_elems

__all__ = ["GpuCostModel", "GpuKernel", "GpuTemplateConfig", "LaunchShape"]

#: Occupancy (resident threads / max threads per SM) at which a streaming kernel reaches
#: its peak bandwidth; below it, too few loads are in flight to hide HBM latency.
OCCUPANCY_FOR_PEAK_BW = 0.5
#: Resident warps per SM that keep its FP32 / SFU pipelines busy (4 schedulers x 2).
WARPS_FOR_PEAK_COMPUTE = 8
#: Most blocks one SM holds at once (sm_80 / sm_90: 32).
MAX_BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class GpuTemplateConfig:
    """Per-template launch parameters the model assumes (the schedule rules' defaults).

    Attributes
    ----------
    elementwise_threads : int
        Threads per block of elementwise kernels (one element per thread).
    reduction_threads : int
        Threads per block of row reductions (one block per row).
    matmul_tile : tuple of int
        (M, N, K) tile of one matmul block; A and B tiles live in shared memory.
    matmul_threads : int
        Threads per matmul block.
    base_registers : dict
        Registers per thread of the bare template, by group kind.
    registers_per_op : int
        Extra registers per fused op (its operands and results stay live).
    """

    elementwise_threads: int = 256
    reduction_threads: int = 256
    matmul_tile: tuple[int, int, int] = (64, 64, 16)
    matmul_threads: int = 256
    base_registers: tuple[tuple[str, int], ...] = (
        (GroupKind.ELEMENTWISE.value, 16),
        (GroupKind.REDUCTION.value, 24),
        (GroupKind.CONTRACTION.value, 64),
        (GroupKind.OPAQUE.value, 32),
    )
    registers_per_op: int = 4

    def registers_for(self, kind: GroupKind) -> int:
        """Registers per thread of the bare template for ``kind``."""
        return dict(self.base_registers)[kind.value]


def is_true_contraction(node) -> bool:
    """A matmul / conv node: exactly one reduction block, and that block is ``C += A * B``.

    The graph's op class also calls ``layer_norm`` a contraction (its variance block sums
    ``(x - mean) * (x - mean)``), but its two row reductions run on the row template.
    """
    if not node.is_contraction or node.info is None:
        return False
    reductions = [b for b in node.info.blocks if b.num_reduce_axes]
    return len(reductions) == 1 and reductions[0].is_contraction


def template_kind(graph: FusionGraph, group: frozenset[int]) -> GroupKind:
    """The GPU template family of ``group`` (``classify`` with row reductions that only
    look like contractions sent to REDUCTION)."""
    kind = classify(graph, group)
    if kind is GroupKind.CONTRACTION and not any(
            is_true_contraction(graph.nodes[n]) for n in group):
        return GroupKind.REDUCTION
    return kind


def reduction_blocks(graph: FusionGraph, group: frozenset[int]) -> int:
    """TIR blocks with reduction iters over the group's members (softmax alone has two)."""
    return sum(
        1 for n in group if graph.nodes[n].info is not None
        for b in graph.nodes[n].info.blocks if b.num_reduce_axes
    )


def launch_shape(graph: FusionGraph, group: frozenset[int], onchip_bytes: float,
                 cfg: GpuTemplateConfig) -> LaunchShape:
    """The grid and per-block resources of the template that will run ``group``."""
    dims = graph.dims
    kind = template_kind(graph, group)
    out_elems = max(
        1.0, max(shape_elems(graph.tensors[graph.nodes[n].outputs[0]].shape, dims)
                 for n in group)
    )
    registers = cfg.registers_for(kind) + cfg.registers_per_op * (len(group) - 1)
    smem = 0.0
    if kind is GroupKind.CONTRACTION:
        tm, tn, tk = cfg.matmul_tile
        anchor = next(graph.nodes[n] for n in sorted(group)
                      if is_true_contraction(graph.nodes[n]))
        out = shape_elems(graph.tensors[anchor.outputs[0]].shape, dims)
        blocks = math.ceil(max(1.0, out) / (tm * tn))
        threads = cfg.matmul_threads
        smem = (tm + tn) * tk * 4
    elif kind is GroupKind.REDUCTION:
        # One block per row of the (first) reduction: rows = its output elements.
        red = next(graph.nodes[n] for n in sorted(group)
                   if graph.nodes[n].is_reduction or graph.nodes[n].is_contraction)
        rows = shape_elems(graph.tensors[red.outputs[0]].shape, dims)
        blocks = max(1, math.ceil(rows))
        threads = cfg.reduction_threads
    else:
        threads = cfg.elementwise_threads
        blocks = math.ceil(out_elems / threads)
    smem += onchip_bytes / max(1, blocks)
    return LaunchShape(int(max(1, blocks)), threads, registers, int(math.ceil(smem)))


def split_launches(graph: FusionGraph, group: frozenset[int]) -> int:
    """Extra launches the row-reduction template needs for ``group``.

    A non-reduction member of a reduction chain whose output the group publishes *and*
    reads itself (a residual ``add`` before ``layer_norm``) writes a function output: TVM
    cannot move it under the row loop, so it runs as its own launch first.
    """
    if template_kind(graph, group) is not GroupKind.REDUCTION:
        return 0
    extra = 0
    for n in group:
        node = graph.nodes[n]
        if node.is_reduction or node.is_contraction:
            continue
        t = graph.tensors[node.outputs[0]]
        inside = any(c in group for c in t.consumers)
        published = t.escapes or any(c not in group for c in t.consumers)
        if inside and published:
            extra += 1
    return extra


def compute_utilization(shape: LaunchShape, resident: int, gpu: GpuLimits) -> tuple[int, float]:
    """Waves of the grid and the fraction of the device's arithmetic it keeps busy.

    Three losses multiply: SMs with no block at all (a grid smaller than the GPU); busy
    SMs with too few warps to keep their pipelines full (``WARPS_FOR_PEAK_COMPUTE``); and
    the partly idle last wave of a grid larger than one wave.
    """
    slots = resident * gpu.sm_count
    waves = math.ceil(shape.blocks / slots)
    sm_fraction = min(shape.blocks, gpu.sm_count) / gpu.sm_count
    warps = min(resident, math.ceil(shape.blocks / gpu.sm_count)) \
        * math.ceil(shape.threads / gpu.warp_size)
    saturation = min(1.0, warps / WARPS_FOR_PEAK_COMPUTE)
    tail = shape.blocks / (waves * slots) if shape.blocks >= slots else 1.0
    return waves, sm_fraction * saturation * tail


def resident_blocks(shape: LaunchShape, gpu: GpuLimits) -> tuple[int, str]:
    """Blocks of ``shape`` one SM holds at once, and the resource that limits them."""
    warp_regs = math.ceil(shape.registers * gpu.warp_size / 256) * 256  # allocation unit
    warps = math.ceil(shape.threads / gpu.warp_size)
    limits = {
        "threads": gpu.max_threads_per_sm // max(1, warps * gpu.warp_size),
        "registers": gpu.registers_per_sm // max(1, warp_regs * warps),
        "shared memory": (gpu.shared_memory_per_sm // shape.smem_bytes
                          if shape.smem_bytes else MAX_BLOCKS_PER_SM),
        "blocks": MAX_BLOCKS_PER_SM,
    }
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


@register_cost_model("gpu")
class GpuCostModel(RooflineCostModel):
    """Roofline with GPU occupancy, wave quantisation, launch overhead and capacity.

    Parameters
    ----------
    hw : HardwareSpec
        A GPU spec (``hw.gpu`` holds the per-SM limits).
    backend : Backend, optional
        The CUDA backend (names the schedule rule of a group).
    config : GpuTemplateConfig, optional
        Launch parameters of the templates.
    """

    def __init__(self, hw: HardwareSpec, backend=None, config: GpuTemplateConfig | None = None):
        if hw.gpu is None:
            raise InvalidHardwareSpecError(
                f"the gpu cost model needs a GPU spec; '{hw.name}' has no GpuLimits")
        super().__init__(hw, backend)
        self.config = config or GpuTemplateConfig()

    def relative_efficiency(self, rule: str, cls: str | None = None) -> float:
        """``rule``'s efficiency over the matmul template's (``efficiency`` tables): this
        model prices the generic templates' contractions at the raw tensor-core roofline,
        so a kernel the backend describes is priced on the footing of the matmul it
        replaces."""
        return self.efficiency(rule, cls) / self.efficiency("matmul")

    def _estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        base = super()._estimate(graph, group)
        if not base.detail:  # barrier / view: no kernel
            return base
        gpu = self.hw.gpu
        rule = base.detail["rule"]
        kernel = self.kernels.gpu_kernel(graph, group, rule, self.hw)
        detail = dict(base.detail)
        if kernel is not None and kernel.shape is None:
            return replace(base, time_s=math.inf, feasible=False, detail=detail,
                           reason=kernel.reason)
        compute_raw = base.detail["compute_s"]
        if kernel is None:
            shape = launch_shape(graph, group, base.onchip_bytes, self.config)
            onchip, eff, reread_s = base.onchip_bytes, 1.0, 0.0
            internal_s, launches = base.detail["internal_s"], 1 + split_launches(graph, group)
        else:
            shape, onchip, launches = kernel.shape, kernel.onchip_bytes, kernel.launches
            eff = self.relative_efficiency(rule, base.detail.get("shape_class"))
            contraction_s = sum(
                f / self.hw.peak_flops[OpClass(c)]
                for c, f in base.detail["flops_by_class"].items()
                if OpClass(c) in (OpClass.MATMUL, OpClass.CONV))
            compute_raw += contraction_s * (1.0 / eff - 1.0)
            reread = kernel.reread_bytes
            reread_s = reread / self.bandwidth_for(reread, shared_only=True)
            internal_s = 0.0
        base = replace(base, onchip_bytes=onchip)
        detail["launch_shape"] = shape
        if shape.smem_bytes > gpu.shared_memory_per_block:
            return replace(base, time_s=math.inf, feasible=False, detail=detail, reason=(
                f"shared memory per block {shape.smem_bytes / 1024:.1f} KiB exceeds "
                f"{gpu.shared_memory_per_block / 1024:.0f} KiB on {self.hw.name} "
                f"({base.onchip_bytes / 1024:.0f} KiB of intermediates over {shape.blocks} "
                "blocks)"))
        if shape.registers > gpu.max_registers_per_thread:
            return replace(base, time_s=math.inf, feasible=False, detail=detail, reason=(
                f"{shape.registers} registers per thread exceed "
                f"{gpu.max_registers_per_thread} on {self.hw.name} ({len(group)} fused ops)"))
        resident, limiter = resident_blocks(shape, gpu)
        if resident < 1:
            return replace(base, time_s=math.inf, feasible=False, detail=detail, reason=(
                f"one block of {shape.threads} threads x {shape.registers} registers does "
                f"not fit an SM of {gpu.registers_per_sm} registers on {self.hw.name}"))
        slots = resident * gpu.sm_count
        waves, util = compute_utilization(shape, resident, gpu)
        occupancy = min(shape.blocks, slots) / gpu.sm_count * shape.threads \
            / gpu.max_threads_per_sm
        bw_factor = min(1.0, occupancy / OCCUPANCY_FOR_PEAK_BW)
        if shape.blocks < slots:  # the grid, not an SM resource, bounds the occupancy
            limiter = f"grid of {shape.blocks} < {slots} slots"
        compute_s = compute_raw / util
        memory_s = (base.detail["memory_s"] + reread_s) / bw_factor
        body = max(compute_s, memory_s)
        time_s = launches * self.hw.launch_overhead_s + body + internal_s
        bound = "compute" if compute_s >= memory_s else "memory"
        if kernel is not None:
            detail.update(internal_s=internal_s, efficiency=eff, reread_s=reread_s)
        detail.update(compute_s=compute_s, memory_s=memory_s, waves=waves, utilization=util,
                      launches=launches,
                      occupancy=occupancy, resident_blocks=resident, occupancy_limit=limiter)
        return replace(base, time_s=time_s, detail=detail, reason=(
            f"{bound}-bound ({detail['rule']}), {shape.blocks} blocks x {shape.threads} "
            f"threads, {waves} wave(s), occupancy {occupancy:.2f} ({limiter})"
            + (f", {launches} launches" if launches > 1 else "")))
