"""The built-in analytical roofline cost model.

For one candidate group (one kernel):

* **memory**: the group's external inputs and published outputs move once, each at
  the bandwidth of the memory level that holds a tensor of that size; intermediates
  stay on chip (cache-level traffic), or spill when they do not fit;
* **compute**: FLOPs by op class at the device peak, *including recomputation*: an
  inlined producer runs once per read of its output by the consumer (its reuse factor);
* **time** = launch overhead + thread-pool overhead of the parallel regions
  + max(compute, memory) / efficiency + intermediate traffic, where the efficiency is the
  calibrated fraction of the roofline that the schedule rule handling the group reaches
  on groups of its shape class (``hw.efficiency["rule:class"]``, else ``["rule"]``, else
  the target's ``KernelModel.rule_efficiency``), and a parallel region is one fork/join
  of the thread pool
  (``hw.parallel_overhead_s`` for the first, ``hw.parallel_region_s`` for each further
  one; see :func:`parallel_regions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..chain_stages import chain_stages
from ..graph import FusionGraph, PatternKind
from ..hardware import DeviceKind, OpClass
from ..kernel_model import KernelModel
from ..legality import GroupKind, classify, row_stage
from ..tir_analysis import evaluate
from .base import Cost, CostModel, register_cost_model

#: Fraction of the roofline assumed per rule when neither the hardware spec nor the
#: backend provides a calibrated figure.
DEFAULT_RULE_EFFICIENCY = {
    "matmul": 0.6,
    "conv2d": 0.5,
    "reduction": 0.4,
    "elementwise": 0.5,
    "fallback": 0.05,
}


#: Generic thresholds for a CPU target that does not count its parallel loops (the LLVM-CPU
#: target answers itself from the HardwareSpec, ``targets/llvm_cpu/kernel_model.py``), so
#: the model charges the thread pool to the kernels that are likely parallelised:
#: spatial blocks of at least this many elements (elementwise, fallback, conv padding) ...
PARALLEL_MIN_ELEMENTS = 1 << 14
#: ... GEMM tiles of at least this many FLOPs ...
PARALLEL_MIN_FLOPS = 1 << 21
#: ... and reduction rows covering at least this many elements; B is packed (one more
#: parallel loop) from this many row tiles of A.
PARALLEL_MIN_ROW_ELEMENTS = PARALLEL_MIN_ELEMENTS // 4
PACK_MIN_ROW_TILES = 12
#: Matmul/conv groups below this many FLOPs are the ``small`` shape class (call overhead and
#: short loops dominate; the calibrated efficiency differs from large GEMMs by ~3x).
SMALL_CONTRACTION_FLOPS = 1 << 21
#: Elementwise/reduction groups whose transcendental FLOPs are at least this fraction of all
#: their FLOPs are the ``transcendental`` shape class (libm calls, polynomial exp/erf).
TRANSCENDENTAL_SHARE = 0.02


def shape_class(rule: str, flops: Mapping[OpClass, float], conv_kind: str = "row") -> str:
    """The shape class of a group for per-class efficiencies (``"rule:class"`` keys).

    ``small``/``large`` for contractions (by FLOPs; ``window`` for a convolution the conv
    template leaves to the reduction rule's plain nest, ~10x slower),
    ``transcendental``/``plain`` for the other rules (by the share of transcendental work),
    ``copy`` for groups that only move data (layout transforms: strided, ~10x below a
    plain elementwise kernel's efficiency).
    """
    total = sum(flops.values())
    if conv_kind == "window":
        return "window"
    if rule in ("matmul", "conv2d"):
        return "small" if total < SMALL_CONTRACTION_FLOPS else "large"
    if total <= 0:
        return "copy"  # pure data movement: layout transforms, gathers, concatenations
    trans = flops.get(OpClass.TRANSCENDENTAL, 0.0)
    return "transcendental" if trans >= TRANSCENDENTAL_SHARE * total else "plain"


def _dims_of(graph: FusionGraph, tid: int) -> list[float]:
    return [evaluate(d, graph.dims) for d in graph.tensors[tid].shape]


def conv_kind(graph: FusionGraph, group, hw) -> str:
    """Which CPU conv kernel the (NCHW) convolution of ``group`` gets: ``row`` vectors
    (width a multiple of 4), ``channel`` vectors (narrow rows, channels a multiple of the
    SIMD lanes), else the plain ``window`` nest of the reduction rule (the conv template
    declines)."""
    conv = next((graph.nodes[n] for n in sorted(group)
                 if graph.nodes[n].op_class is OpClass.CONV), None)
    if conv is None:
        return "row"
    shape = _dims_of(graph, conv.outputs[0])
    if len(shape) != 4:
        return "row"
    channels, width = int(shape[1]), int(shape[3])
    if width % 4 == 0:
        return "row"
    return "channel" if channels % hw.simd_lanes_fp32 == 0 else "window"


def parallel_regions(graph: FusionGraph, group: frozenset[int], rule: str, hw,
                     flops: Mapping[OpClass, float], published: list[int]) -> int:
    """Thread-pool fork/joins of the kernel a CPU backend makes of ``group``.

    The generic answer, for targets that do not count their kernels' parallel loops (the
    LLVM-CPU target does) and for its conv2d kernels: conv2d always runs its output rows in
    parallel, plus one parallel weight repack when the output rows are too narrow to
    vectorise (width not a multiple of 4); matmul packs B in parallel when A has many row
    tiles, and runs its tiles in parallel from ``PARALLEL_MIN_FLOPS``; a reduction runs its
    rows in parallel from ``PARALLEL_MIN_ROW_ELEMENTS``; elementwise and fallback kernels
    run each output block in parallel from ``PARALLEL_MIN_ELEMENTS``. Zero on one core and
    off the CPU.
    """
    if hw.num_cores <= 1 or hw.kind is not DeviceKind.CPU:
        return 0
    outs = [_dims_of(graph, t) for t in published]
    elems = [float(math.prod(d)) if d else 1.0 for d in outs]
    big = max(elems, default=0.0)
    main = [_dims_of(graph, graph.nodes[n].outputs[0]) for n in sorted(group)
            if graph.nodes[n].is_contraction]
    if rule == "conv2d":
        return 2 if conv_kind(graph, group, hw) == "channel" else 1
    if rule == "matmul":
        rows = max((d[-2] for d in main if len(d) >= 2), default=1.0)
        mr = 1
        while mr * 2 <= max(1, hw.num_vector_registers // 4):
            mr *= 2
        contraction = flops.get(OpClass.MATMUL, 0.0)
        pack = rows >= PACK_MIN_ROW_TILES * mr
        return (1 if pack else 0) + (1 if contraction >= PARALLEL_MIN_FLOPS else 0)
    if rule == "reduction":
        # A window nest (a conv the template declined) counts its whole iteration space.
        work = max(big, flops.get(OpClass.CONV, 0.0) / 2)
        return 1 if work >= PARALLEL_MIN_ROW_ELEMENTS else 0
    return sum(1 for e in elems if e >= PARALLEL_MIN_ELEMENTS)


def _operand_reads(node, k: int, dims, hw) -> float:
    """Evaluations of an inlined producer per element of input ``k`` of ``node``.

    A contraction's A operand (``k = 0``) is loaded once per register tile of output
    columns (about two vectors wide on a CPU), not once per output column; everything
    else is read as often as the op reuses it."""
    reuse = node.reuse(k, dims)
    if k == 0 and node.is_contraction and hw.kind is DeviceKind.CPU:
        return max(1.0, reuse / (2 * hw.simd_lanes_fp32))
    return reuse


def _hoisted_reads(graph: FusionGraph, node, tid: int) -> float | None:
    """Evaluations of an inlined producer of ``tid`` per element of it, where ``node``
    broadcasts it in a loop nest kept in row-major order with its innermost loop vectorised
    (``KernelModel.hoists_broadcasts``): the compiler hoists a value out of
    the loops it does not vary along, so it runs once per iteration of the loops outside
    its last varying axis (a squeeze-excitation scale, ``[1, C, 1, 1, c]`` broadcast over
    ``H x W``, once per channel, not once per pixel). None: not a broadcast of ``tid``."""
    src, out = _dims_of(graph, tid), _dims_of(graph, node.outputs[0])
    if len(src) > len(out):
        return None
    src = [1.0] * (len(out) - len(src)) + src
    if any(s != o and s != 1 for s, o in zip(src, out, strict=True)):
        return None
    varying = [i for i in range(len(out) - 1) if src[i] != 1]
    evals = math.prod(out[:max(varying, default=-1) + 1]) * (out[-1] if src[-1] != 1 else 1)
    return evals / max(1.0, math.prod(src))


def _row_reads(graph: FusionGraph, node, k: int, tid: int) -> float:
    """Reads per element of input ``k`` of ``node`` in a row-wise (reduction rule) kernel.

    An input smaller than the output is broadcast; the rule only accepts groups whose
    intermediates are indexed by the row (``row_schedule.row_local``), so the broadcast is along the
    in-row axes and the value is computed once per row, outside the column loop.
    """
    reuse = node.reuse(k, graph.dims)
    size = math.prod(_dims_of(graph, tid))
    out = math.prod(_dims_of(graph, node.outputs[0]))
    return min(reuse, 1.0) if size < out else reuse


def rule_for_group(graph: FusionGraph, group: frozenset[int],
                   kernels: KernelModel | None = None) -> str:
    """The schedule rule expected to handle ``group`` (the target's answer when it has one)."""
    name = kernels.rule_for_group(graph, group) if kernels is not None else None
    if name:
        return name
    kind = classify(graph, group)
    if kind is GroupKind.CONTRACTION:
        ops = {graph.nodes[i].op_class for i in group}
        return "conv2d" if OpClass.CONV in ops else "matmul"
    if kind is GroupKind.REDUCTION:
        return "reduction"
    if kind is GroupKind.ELEMENTWISE:
        return "elementwise"
    return "fallback"


@register_cost_model("roofline")
class RooflineCostModel(CostModel):
    """Analytical roofline model over a :class:`HardwareSpec`.

    Parameters
    ----------
    hw : HardwareSpec
        Peaks, bandwidths, overheads and (calibrated) efficiencies.
    backend : Backend, optional
        Names the rule of a group; supplies default efficiencies.
    efficiency : Mapping[str, float], optional
        Efficiencies by ``"rule"`` or ``"rule:class"`` that take precedence over the spec's
        (experiments and tests inject tables here instead of editing a spec).
    """

    def __init__(self, hw, backend=None, efficiency: Mapping[str, float] | None = None):
        super().__init__(hw, backend)
        self.efficiency_table = dict(efficiency or {})
        self._cache: dict[tuple, tuple[FusionGraph, Cost]] = {}

    # ------------------------------------------------------------------ helpers
    def bandwidth_for(self, nbytes: float, shared_only: bool = False) -> float:
        """Bandwidth of the innermost level that can hold ``nbytes`` (device-wide);
        ``shared_only``: of the innermost level shared by all cores that can (a GPU's L2,
        which data re-read across thread blocks comes from)."""
        for lvl in self.hw.memory:
            if shared_only and not lvl.shared:
                continue
            cap = lvl.capacity_bytes * (1 if lvl.shared else self.hw.num_cores)
            if nbytes <= cap:
                return lvl.bandwidth_bytes_per_s
        return self.hw.dram.bandwidth_bytes_per_s

    def efficiency(self, rule: str, cls: str | None = None) -> float:
        """Fraction of peak reached by ``rule`` on groups of shape class ``cls``.

        Most specific first: the injected table, then the spec (``"rule:class"`` before
        ``"rule"``), then the backend's table, then the built-in defaults.
        """
        keys = ([f"{rule}:{cls}"] if cls else []) + [rule]
        for table in (self.efficiency_table, self.hw.efficiency):
            for key in keys:
                if key in table:
                    return table[key]
        given = self.kernels.rule_efficiency(rule, cls)
        if given is not None:
            return given
        return DEFAULT_RULE_EFFICIENCY.get(rule, self.hw.default_efficiency)

    # ----------------------------------------------------------------- estimate
    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        # The cache holds the graph itself, so an id is never reused while its entry lives.
        key = (id(graph), tuple(sorted(graph.dims.items())), group)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is graph:
            return hit[1]
        cost = self._estimate(graph, group)
        self._cache[key] = (graph, cost)
        return cost

    def _staged(self, graph: FusionGraph, group: frozenset[int], staged: set[int]) -> Cost:
        """A matmul kernel with a staged row pass before it (a norm computing A) or after it
        (a softmax of its output): the row pass as the reduction rule's kernel plus the
        GEMM kernel, in one launch with the kernel's fork/joins (the backend's count). The
        rows between them go through memory (cache-resident when they fit) as they would
        between two kernels; what fusing saves is a launch."""
        stage = self.estimate(graph, frozenset(staged))
        gemm = self.estimate(graph, group - staged)
        # One launch, and the fork/joins of the kernel as the rule schedules it.
        regions = self.kernels.parallel_regions(graph, group, "matmul", self.hw)
        if regions is None:
            regions = (gemm.detail.get("parallel_regions", 0)
                       + stage.detail.get("parallel_regions", 0))
        launch_s = self.hw.launch_overhead_s + self.hw.parallel_cost(regions)
        body = [c.time_s - c.detail.get("launch_s", 0.0) for c in (stage, gemm)]
        detail = dict(gemm.detail)
        detail["staged_row_pass_s"] = body[0]
        detail["parallel_regions"] = regions
        detail["launch_s"] = launch_s
        internal = []  # tensors passed between the two parts only: they never leave the kernel
        for n in group:
            t = graph.tensors[graph.nodes[n].outputs[0]]
            if not t.escapes and t.consumers and all(c in group for c in t.consumers) and any(
                    (c in staged) != (n in staged) for c in t.consumers):
                internal.append(graph.nodes[n].outputs[0])
        a_bytes = sum(graph.nbytes(t) for t in internal)
        for key in ("in_bytes", "out_bytes"):  # both parts' traffic, less what stays inside
            detail[key] = max(0.0, stage.detail.get(key, 0.0) + gemm.detail.get(key, 0.0)
                              - a_bytes)
        return Cost(
            time_s=sum(body) + launch_s,
            dram_bytes=max(0.0, stage.dram_bytes + gemm.dram_bytes - 2 * a_bytes),
            onchip_bytes=stage.onchip_bytes + gemm.onchip_bytes + a_bytes,
            flops=stage.flops + gemm.flops,
            feasible=True,
            reason=f"{gemm.reason}, with a staged row pass",
            detail=detail,
        )

    def _chained(self, graph: FusionGraph, stages: list[frozenset[int]]) -> Cost:
        """A chain of weight matmuls run as one kernel of stages (``chain_stages``): each
        stage as the kernel it would be alone, in one launch whose fork/joins are all the
        stages' (a fork after the first finds the pool awake: ``parallel_region_s``). The
        intermediates between stages move as between two kernels, through the level that
        holds them; what the chain saves is launches and cold forks."""
        costs = [self.estimate(graph, st) for st in stages]
        regions = sum(int(c.detail.get("parallel_regions", 0)) for c in costs)
        launch_s = self.hw.launch_overhead_s + self.hw.parallel_cost(regions)
        body = [c.time_s - c.detail.get("launch_s", 0.0) for c in costs]
        detail = dict(costs[-1].detail)
        detail.update(parallel_regions=regions, launch_s=launch_s,
                      stage_s=[round(b, 9) for b in body],
                      in_bytes=sum(c.detail.get("in_bytes", 0.0) for c in costs),
                      out_bytes=sum(c.detail.get("out_bytes", 0.0) for c in costs))
        return Cost(
            time_s=sum(body) + launch_s,
            dram_bytes=sum(c.dram_bytes for c in costs),
            onchip_bytes=sum(c.onchip_bytes for c in costs),
            flops=sum(c.flops for c in costs),
            feasible=all(c.feasible for c in costs),
            reason=f"{len(stages)} staged matmuls ({costs[0].reason.split(' (')[0]} first)",
            detail=detail,
        )

    def _estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        hw = self.hw
        dims = graph.dims
        members = sorted(group)
        if len(members) == 1 and graph.nodes[members[0]].info is None:
            return Cost(0.0, reason="barrier (not a kernel)")
        if len(members) == 1 and graph.nodes[members[0]].is_view:
            return Cost(0.0, reason="view (reshape, no kernel)")

        # Multiplicity of each member: inlined producers run once per read.
        stages = chain_stages(graph, group)
        if stages is not None:
            return self._chained(graph, stages)
        rule = rule_for_group(graph, group, self.kernels)
        # The reduction rule runs the chain row by row: a producer of a reduction stays a
        # block whose row is kept in cache (not inlined, runs once), and a per-row value
        # read by an in-row broadcast is loop-invariant in the column loop (hoisted).
        staged = row_stage(graph, group)[1] if rule == "matmul" else set()
        if staged:
            return self._staged(graph, group, staged)
        rowwise = rule == "reduction"
        hoisted = bool(self.kernels.hoists_broadcasts(rule))
        mult: dict[int, float] = {}
        published: list[int] = []
        internal_bytes = 0.0
        for n in reversed(members):
            node = graph.nodes[n]
            out = node.outputs[0]
            t = graph.tensors[out]
            inside = [c for c in t.consumers if c in group]
            external = t.escapes or any(c not in group for c in t.consumers) or not t.consumers
            if external:
                published.append(out)
            inlinable = node.pattern <= PatternKind.INJECTIVE and node.op_class in (
                OpClass.ELEMENTWISE, OpClass.TRANSCENDENTAL,
            )
            kept = rowwise and any(graph.nodes[c].is_reduction for c in inside)
            if inside and inlinable and not kept:
                m = 0.0
                for c in dict.fromkeys(inside):  # x * x lists its producer twice
                    cnode = graph.nodes[c]
                    reads = sum(
                        _row_reads(graph, cnode, k, tid) if rowwise else
                        _operand_reads(cnode, k, dims, hw)
                        for k, tid in enumerate(cnode.inputs) if tid == out
                    )
                    if hoisted and not cnode.is_contraction and reads > 1.0:
                        licm = _hoisted_reads(graph, cnode, out)
                        reads = reads if licm is None else min(reads, max(1.0, licm))
                    m += mult[c] * reads
                mult[n] = m + (1.0 if external else 0.0)
            else:
                mult[n] = 1.0
                # A contraction's output read only by inlined epilogue ops never leaves
                # registers (tile-level epilogue); other intermediates (reduction rows,
                # contraction outputs re-read by reductions) stay in cache.
                epilogue_only = node.is_contraction and all(
                    graph.nodes[c].pattern <= PatternKind.INJECTIVE for c in inside
                )
                if inside and not external and not epilogue_only:
                    internal_bytes += graph.nbytes(out)

        flops: dict[OpClass, float] = {}
        for n in members:
            for cls, f in graph.nodes[n].flops(dims).items():
                flops[cls] = flops.get(cls, 0.0) + f * mult[n]
        conv = "row"
        if rule == "conv2d" and hw.kind is DeviceKind.CPU:
            conv = conv_kind(graph, group, hw)
            if conv == "window":  # the conv template declines; the reduction rule takes it
                rule = "reduction"
        # External inputs move once, but only the part a member reads (gathers, slices).
        touched: dict[int, float] = {}
        for n in members:
            node = graph.nodes[n]
            for k, tid in enumerate(node.inputs):
                if graph.tensors[tid].producer in group:
                    continue
                frac = node.touched_fraction(k, dims)
                touched[tid] = max(touched.get(tid, 0.0), frac)
        traits = self.kernels.kernel_traits(graph, group, rule, hw)
        if traits is not None:
            for c, f in traits.recompute.items():
                flops[c] = flops.get(c, 0.0) + f
            internal_bytes += traits.staged_bytes
        cls = shape_class(rule, flops, conv)
        if cls == "copy" and any(f < 0.5 for f in touched.values()):
            # A gather (embedding lookup) copies whole contiguous rows: a plain streaming
            # kernel, not a strided layout transform (priced 85x too slow as one).
            cls = "plain"
        eff = self.efficiency(rule, cls)
        compute_s = sum(f / hw.peak_flops[cls] for cls, f in flops.items())
        if traits is not None:
            compute_s *= traits.compute_scale
        ext_inputs = sorted(touched)
        in_sizes = {t: graph.nbytes(t) * touched[t] for t in ext_inputs}
        in_bytes = sum(in_sizes.values())
        out_bytes = sum(graph.nbytes(t) for t in published)
        # A partly read input streams from the level that holds the part read; one no node
        # of the block produces (a weight, a model input) was last touched a whole run ago.
        held = {t: max(b if touched[t] < 1.0 else graph.nbytes(t),
                       graph.cold_bytes if graph.tensors[t].producer is None else 0.0)
                for t, b in in_sizes.items()}
        in_bw = {t: self.bandwidth_for(held[t]) for t in in_sizes}
        memory_s = sum(b / in_bw[t] for t, b in in_sizes.items())
        memory_s += sum(graph.nbytes(t) / self.bandwidth_for(graph.nbytes(t)) for t in published)
        inner_bw = hw.memory[0].bandwidth_bytes_per_s if len(hw.memory) > 1 else \
            hw.dram.bandwidth_bytes_per_s
        internal_s = 2.0 * internal_bytes / inner_bw
        # The rule's efficiency is the fraction of the roofline it reaches (calibrated);
        # every parallel loop of the kernel also forks and joins the thread pool.
        if traits is not None and traits.parallel_regions is not None:
            regions = traits.parallel_regions  # the target worked them out with the traits
        else:
            regions = self.kernels.parallel_regions(graph, group, rule, hw)
        # Only a target that counts its kernels' parallel loops says a kernel runs serial.
        counted = regions is not None
        if regions is None:
            regions = parallel_regions(graph, group, rule, hw, flops, published)
        launch_s = hw.launch_overhead_s + hw.parallel_cost(regions)
        serial = hw.kind is DeviceKind.CPU and hw.num_cores > 1 and counted and (
            not traits.main_parallel if traits is not None else regions == 0)
        if serial:
            # The rules left every loop serial: one core's share of the FLOP/s and of the
            # bandwidth (peaks and bandwidths are whole-machine figures).
            compute_s *= hw.num_cores
            memory_s *= hw.num_cores
        time_s = launch_s + max(compute_s, memory_s) / eff + internal_s
        bound = "compute" if compute_s >= memory_s else "memory"
        dram_bw = hw.dram.bandwidth_bytes_per_s
        dram = sum(b for t, b in in_sizes.items() if in_bw[t] == dram_bw)
        dram += sum(graph.nbytes(t) for t in published
                    if self.bandwidth_for(graph.nbytes(t)) == dram_bw)
        return Cost(
            time_s=time_s,
            dram_bytes=dram,
            onchip_bytes=internal_bytes,
            flops=sum(flops.values()),
            feasible=True,
            reason=f"{bound}-bound ({rule})",
            detail={
                "rule": rule,
                "compute_s": compute_s,
                "memory_s": memory_s,
                "internal_s": internal_s,
                "launch_s": launch_s,
                "parallel_regions": regions,
                "serial": serial,
                "shape_class": cls,
                "efficiency": eff,
                "flops_by_class": {c.value: f for c, f in flops.items()},
                "in_bytes": in_bytes,
                "out_bytes": out_bytes,
                "recompute": {graph.nodes[n].name: m for n, m in mult.items() if m > 1.0},
            },
        )
