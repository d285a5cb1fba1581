"""The built-in analytical roofline cost model.

For one candidate group (one kernel):

* **memory**: the group's external inputs and published outputs move once, each at
  the bandwidth of the memory level that holds a tensor of that size; intermediates
  stay on chip (cache-level traffic), or spill when they do not fit;
* **compute**: FLOPs by op class at the device peak, *including recomputation*: an
  inlined producer runs once per read of its output by the consumer (its reuse factor);
* **time** = launch overhead + max(compute, memory) / efficiency + intermediate traffic,
  where the efficiency is the calibrated fraction of the roofline that the schedule rule
  handling the group reaches (``backend.rule_efficiency`` or ``hw.efficiency``).
"""

from __future__ import annotations

from ..graph import FusionGraph, PatternKind
from ..legality import GroupKind, classify
from .base import Cost, CostModel, register_cost_model
from .hardware import OpClass

#: Fraction of the roofline assumed per rule when neither the hardware spec nor the
#: backend provides a calibrated figure.
DEFAULT_RULE_EFFICIENCY = {
    "matmul": 0.6,
    "conv2d": 0.5,
    "reduction": 0.4,
    "elementwise": 0.5,
    "fallback": 0.05,
}


#: Output elements above which the CPU templates parallelise a kernel over the cores.
PARALLEL_MIN_ELEMENTS = 4096


def rule_for_group(graph: FusionGraph, group: frozenset[int], backend=None) -> str:
    """The schedule rule expected to handle ``group`` (backend's answer when it has one)."""
    if backend is not None and hasattr(backend, "rule_for_group"):
        name = backend.rule_for_group(graph, group)
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
    """Analytical roofline model over a :class:`HardwareSpec`."""

    def __init__(self, hw, backend=None):
        super().__init__(hw, backend)
        self._cache: dict[tuple, tuple[FusionGraph, Cost]] = {}

    # ------------------------------------------------------------------ helpers
    def bandwidth_for(self, nbytes: float) -> float:
        """Bandwidth of the innermost level that can hold ``nbytes`` (device-wide)."""
        for lvl in self.hw.memory:
            cap = lvl.capacity_bytes * (1 if lvl.shared else self.hw.num_cores)
            if nbytes <= cap:
                return lvl.bandwidth_bytes_per_s
        return self.hw.dram.bandwidth_bytes_per_s

    def efficiency(self, rule: str) -> float:
        """Fraction of peak reached by ``rule`` on this hardware."""
        if rule in self.hw.efficiency:
            return self.hw.efficiency[rule]
        if self.backend is not None:
            table = getattr(self.backend, "rule_efficiency", None)
            if table and rule in table:
                return table[rule]
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

    def _estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        hw = self.hw
        dims = graph.dims
        members = sorted(group)
        if len(members) == 1 and graph.nodes[members[0]].info is None:
            return Cost(0.0, reason="barrier (not a kernel)")
        if len(members) == 1 and graph.nodes[members[0]].is_view:
            return Cost(0.0, reason="view (reshape, no kernel)")

        # Multiplicity of each member: inlined producers run once per read.
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
            if inside and inlinable:
                m = 0.0
                for c in inside:
                    cnode = graph.nodes[c]
                    reads = sum(
                        cnode.reuse(k, dims) for k, tid in enumerate(cnode.inputs) if tid == out
                    )
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
        rule = rule_for_group(graph, group, self.backend)
        eff = self.efficiency(rule)
        compute_s = sum(f / hw.peak_flops[cls] for cls, f in flops.items())

        # External inputs move once, but only the part a member reads (gathers, slices).
        touched: dict[int, float] = {}
        for n in members:
            node = graph.nodes[n]
            for k, tid in enumerate(node.inputs):
                if graph.tensors[tid].producer in group:
                    continue
                frac = node.touched_fraction(k, dims)
                touched[tid] = max(touched.get(tid, 0.0), frac)
        ext_inputs = sorted(touched)
        in_sizes = {t: graph.nbytes(t) * touched[t] for t in ext_inputs}
        in_bytes = sum(in_sizes.values())
        out_bytes = sum(graph.nbytes(t) for t in published)
        memory_s = sum(b / self.bandwidth_for(graph.nbytes(t)) for t, b in in_sizes.items())
        memory_s += sum(graph.nbytes(t) / self.bandwidth_for(graph.nbytes(t)) for t in published)
        inner_bw = hw.memory[0].bandwidth_bytes_per_s if len(hw.memory) > 1 else \
            hw.dram.bandwidth_bytes_per_s
        internal_s = 2.0 * internal_bytes / inner_bw
        # The rule's efficiency is the fraction of the roofline it reaches (calibrated);
        # kernels big enough to be split over the cores also pay the thread pool.
        work = sum(graph.nbytes(t) for t in published) / 4.0
        parallel = hw.num_cores > 1 and work >= PARALLEL_MIN_ELEMENTS
        launch_s = hw.launch_overhead_s + (hw.parallel_overhead_s if parallel else 0.0)
        time_s = launch_s + max(compute_s, memory_s) / eff + internal_s
        bound = "compute" if compute_s >= memory_s else "memory"
        dram_bw = hw.dram.bandwidth_bytes_per_s
        dram = sum(b for t, b in in_sizes.items() if self.bandwidth_for(graph.nbytes(t)) == dram_bw)
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
                "in_bytes": in_bytes,
                "out_bytes": out_bytes,
                "recompute": {graph.nodes[n].name: m for n, m in mult.items() if m > 1.0},
            },
        )
