"""The fusion plan: which ops form which kernel, and what the cost model predicts.

A :class:`FusionPlan` is produced by :class:`~fusion_tvm.passes.FuseByCostModel` and
compares our partition with FuseOps's and with the unfused one *under the same cost
model*, which gives the predicted speedup before anything is built.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .cost_models.base import CostModel
from .graph import FusionGraph


@dataclass
class GroupPlan:
    """One kernel of the plan."""

    name: str
    function: str  # Relax function holding the block
    ops: list[str]  # binding names of the members
    prim_funcs: list[str]  # PrimFuncs fused
    kind: str
    rule: str
    predicted_time_s: float
    dram_bytes: float
    onchip_bytes: float
    flops: float
    bound: str
    node_ids: list[int] = field(default_factory=list)
    block_index: int = 0
    kernel: str = ""  # the PrimFunc that runs the group after FuseTIR
    scheduled_rule: str = ""  # the schedule rule that ran it (set after scheduling)
    #: Bytes the kernel reads and writes outside itself (its inputs and published outputs),
    #: wherever the cost model holds them; ``dram_bytes`` is the part that goes to DRAM
    #: (0 when every tensor fits the last-level cache).
    traffic_bytes: float = 0.0
    #: The ONNX node(s) each op of ``ops`` computes (an empty list: none, e.g. a layout
    #: conversion the pipeline inserted); empty lists throughout for models not from ONNX.
    onnx_nodes: list[list[str]] = field(default_factory=list)

    @property
    def onnx_names(self) -> list[str]:
        """The ONNX nodes of the kernel's ops, each once, in op order."""
        return list(dict.fromkeys(n for names in self.onnx_nodes for n in names))

    @property
    def display_rule(self) -> str:
        """The rule that ran the kernel, else the one the cost model priced."""
        return self.scheduled_rule or self.rule


@dataclass
class BlockPlan:
    """The plan of one dataflow block, with its graph kept for explanations."""

    function: str
    block_index: int
    groups: list[frozenset[int]]
    fuseops_groups: list[frozenset[int]] | None
    graph: FusionGraph = field(repr=False)
    #: Which candidate the partition is: ``"search"``, ``"fuseops"`` or ``"unfused"``
    #: (see :func:`~fusion_tvm.search.choose_partition`).
    source: str = "search"
    #: Predicted time of ``groups``.
    predicted_time_s: float = 0.0
    #: The best other candidate (its source, partition and predicted time); None when every
    #: candidate is ``groups``.
    alternative: str | None = None
    alternative_groups: list[frozenset[int]] | None = None
    alternative_time_s: float | None = None


@dataclass
class FusionPlan:
    """Plan of a whole module."""

    target: str = ""
    hardware: str = ""
    cost_model: str = ""
    dims: dict = field(default_factory=dict)
    groups: list[GroupPlan] = field(default_factory=list)
    predicted_time_s: float = 0.0
    fuseops_time_s: float | None = None
    unfused_time_s: float = 0.0
    num_kernels: int = 0
    fuseops_kernels: int | None = None
    unfused_kernels: int = 0
    search_time_s: float = 0.0
    #: Blocks where a candidate other than the search's own partition was predicted faster
    #: and kept: function, block, source, its predicted time and the search's.
    fallbacks: list[dict] = field(default_factory=list)
    #: Blocks decided by measurement (``compile(..., verify="measure")``; None: not asked):
    #: function, block, the source kept and the alternative, both predicted and measured
    #: times (seconds, by source), and whether the decision came from the tuning database.
    verified: list[dict] | None = None
    notes: list[str] = field(default_factory=list)
    blocks: list[BlockPlan] = field(default_factory=list, repr=False)
    cost_model_obj: Any = field(default=None, repr=False)
    limits: Any = field(default=None, repr=False)
    kinds: Any = field(default=None, repr=False)

    # ---------------------------------------------------------------- derived
    @property
    def baseline_time_s(self) -> float | None:
        """Predicted time of FuseOps's partition under the same model."""
        return self.fuseops_time_s

    @property
    def predicted_speedup(self) -> float | None:
        """Predicted speedup of our partition over FuseOps's."""
        if not self.fuseops_time_s or not self.predicted_time_s:
            return None
        return self.fuseops_time_s / self.predicted_time_s

    def modeled_bytes(self, partition: str = "ours") -> dict[str, float] | None:
        """Bytes the cost model moves for a partition: ``traffic`` (every kernel's external
        inputs and published outputs, i.e. what goes through memory between kernels) and
        ``dram`` (the part too large for the last-level cache).

        ``partition`` is ``"ours"``, ``"fuseops"`` or ``"unfused"``; None when that partition
        or the model is unavailable.
        """
        if self.cost_model_obj is None or not self.blocks:
            return None
        from .search import singletons

        total = {"traffic": 0.0, "dram": 0.0}
        for block in self.blocks:
            groups = {"ours": block.groups, "fuseops": block.fuseops_groups,
                      "unfused": singletons(block.graph)}[partition]
            if groups is None:
                return None
            for g in groups:
                if not is_kernel(block.graph, g):
                    continue
                cost = self.cost_model_obj.estimate(block.graph, g)
                total["traffic"] += traffic_bytes(cost)
                total["dram"] += cost.dram_bytes
        return total

    def set_origins(self, origins) -> None:
        """Name each op's ONNX node(s): ``origins`` maps binding vars of the module the
        block graphs were built from to node names (:mod:`fusion_tvm.origins`)."""
        for block in self.blocks:
            for node in block.graph.nodes:
                node.origins = tuple(origins.get(node.binding.var, ()))
        for g in self.groups:
            block = next((b for b in self.blocks if b.function == g.function
                          and b.block_index == g.block_index), None)
            g.onnx_nodes = [list(block.graph.nodes[i].origins) if block else []
                            for i in g.node_ids]

    @property
    def has_onnx_names(self) -> bool:
        """Whether any op knows its ONNX node (the model came from ONNX)."""
        return any(any(names) for g in self.groups for names in g.onnx_nodes)

    # ----------------------------------------------------------------- output
    def to_json(self) -> dict:
        """A JSON-ready summary (groups included, graphs left out)."""
        hidden = ("blocks", "cost_model_obj", "limits", "kinds")
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}
        if self.verified is None:  # plans compiled without verify= read as they always did
            del d["verified"]
        d["groups"] = [asdict(g) for g in self.groups]
        d["predicted_speedup"] = self.predicted_speedup
        return d

    def dumps(self) -> str:
        """The JSON summary as text."""
        return json.dumps(self.to_json(), indent=2, default=str)

    def table(self, max_rows: int = 200) -> str:
        """A readable per-group table with the summary lines (and, for ONNX models, the
        ONNX nodes each kernel computes)."""
        onnx = self.has_onnx_names
        shown = self.groups[:max_rows]
        bound_w = max((len(g.bound) for g in shown), default=5) if onnx else 0
        lines = [
            f"fusion plan for {self.target} on {self.hardware} (cost model: {self.cost_model})",
            f"symbolic dims evaluated at: {self.dims or 'none'}",
            "",
            f"{'#':>4}  {'kernel':<44} {'ops':>3}  {'rule':<15} {'pred us':>9} "
            f"{'mem KB':>9} {'DRAM KB':>9}  {'bound':<{bound_w}}"
            + ("  onnx nodes" if onnx else ""),
        ]
        for k, g in enumerate(shown):
            lines.append(
                f"{k:>4}  {g.name[:44]:<44} {len(g.ops):>3}  {g.display_rule:<15} "
                f"{g.predicted_time_s * 1e6:>9.1f} {g.traffic_bytes / 1024:>9.1f} "
                f"{g.dram_bytes / 1024:>9.1f}  {g.bound:<{bound_w}}"
                + (f"  {short_names(g.onnx_names)}" if onnx else "")
            )
        lines[3] = lines[3].rstrip()
        if len(self.groups) > max_rows:
            lines.append(f"  ... {len(self.groups) - max_rows} more")
        lines.append("")
        lines.append(
            f"kernels: unfused {self.unfused_kernels}, FuseOps "
            f"{self.fuseops_kernels if self.fuseops_kernels is not None else '-'}, "
            f"ours {self.num_kernels}"
        )
        fo = f"{self.fuseops_time_s * 1e3:.3f} ms" if self.fuseops_time_s else "-"
        lines.append(
            f"predicted: unfused {self.unfused_time_s * 1e3:.3f} ms, FuseOps {fo}, "
            f"ours {self.predicted_time_s * 1e3:.3f} ms"
        )
        if self.predicted_speedup:
            lines.append(f"predicted speedup vs FuseOps: {self.predicted_speedup:.2f}x")
        lines.append(f"search time: {self.search_time_s * 1e3:.1f} ms")
        for f in self.fallbacks:
            lines.append(
                f"block {f['function']}#{f['block']}: kept the {f['source']} partition "
                f"({f['predicted_s'] * 1e3:.3f} ms predicted; the search's own "
                f"{f['search_predicted_s'] * 1e3:.3f} ms)"
            )
        lines.extend(verified_line(v) for v in self.verified or [])
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def short_names(names: list[str], width: int = 60) -> str:
    """Names joined by spaces within about ``width`` characters (``+N`` counts those left
    out); ``-`` for none."""
    if not names:
        return "-"
    text = names[0] if len(names[0]) <= width else names[0][:width - 3] + "..."
    for k in range(1, len(names)):
        rest = len(names) - k - 1
        joined = f"{text} {names[k]}"
        if len(joined) + (len(f" +{rest}") if rest else 0) > width:
            return f"{text} +{len(names) - k}"
        text = joined
    return text


def verified_line(v: dict) -> str:
    """One line of :meth:`FusionPlan.table` for a measured decision."""
    kept, other = v["source"], v["alternative"]
    meas, pred = v["measured_s"], v["predicted_s"]
    how = "from the tuning database" if v.get("cached") else "timed now"
    return (
        f"block {v['function']}#{v['block']}: measured {kept} {meas[kept] * 1e3:.3f} ms vs "
        f"{other} {meas[other] * 1e3:.3f} ms a run (predicted {pred[kept] * 1e3:.3f} vs "
        f"{pred[other] * 1e3:.3f} ms): kept {kept} ({how})"
    )


def group_plan(
    graph: FusionGraph,
    group: frozenset[int],
    model: CostModel,
    function: str,
    name: str,
    block_index: int = 0,
    kernel: str = "",
) -> GroupPlan:
    """Describe one group with the model's prediction."""
    from .legality import classify

    cost = model.estimate(graph, group)
    members = sorted(group)
    return GroupPlan(
        name=name,
        function=function,
        ops=[graph.nodes[i].name for i in members],
        prim_funcs=[graph.nodes[i].func_name for i in members],
        kind=classify(graph, group).value,
        rule=str(cost.detail.get("rule", "")),
        predicted_time_s=cost.time_s,
        dram_bytes=cost.dram_bytes,
        traffic_bytes=traffic_bytes(cost),
        onchip_bytes=cost.onchip_bytes,
        flops=cost.flops,
        bound=cost.reason,
        node_ids=members,
        onnx_nodes=[list(graph.nodes[i].origins) for i in members],
        block_index=block_index,
        kernel=kernel or (graph.nodes[members[0]].func_name if len(members) == 1 else ""),
    )


def traffic_bytes(cost) -> float:
    """Bytes a kernel moves through memory (its external inputs and published outputs), as
    the cost model books them; its DRAM bytes where the model does not split them out."""
    moved = cost.detail.get("in_bytes", 0.0) + cost.detail.get("out_bytes", 0.0)
    return float(moved or cost.dram_bytes)


def is_kernel(graph: FusionGraph, group: frozenset[int]) -> bool:
    """Whether a group launches a kernel (barriers and lone reshape views do not)."""
    if len(group) == 1:
        node = graph.nodes[min(group)]
        return node.info is not None and not node.is_view
    return True


def count_kernels(graph: FusionGraph, groups) -> int:
    """Kernels launched by a partition."""
    return sum(1 for g in groups if is_kernel(graph, g))
