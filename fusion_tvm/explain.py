"""Why are two ops (not) in one kernel? Answers from legality or from the cost model."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserInputError
from .legality import is_legal, quotient_is_acyclic
from .plan import BlockPlan, FusionPlan


@dataclass
class Explanation:
    """The answer for one pair of ops."""

    op_a: str
    op_b: str
    fused: bool
    reason: str
    group_a: list[str]
    group_b: list[str]
    separate_s: float | None = None
    merged_s: float | None = None
    #: The ONNX nodes each group computes (empty for models not from ONNX).
    onnx_a: list[str] = field(default_factory=list)
    onnx_b: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = "fused" if self.fused else "not fused"
        lines = [f"{self.op_a} and {self.op_b}: {head}", f"  why: {self.reason}"]
        lines.append(f"  group of {self.op_a}: {' '.join(self.group_a)}")
        if self.onnx_a:
            lines.append(f"    ONNX nodes: {' '.join(self.onnx_a)}")
        if not self.fused:
            lines.append(f"  group of {self.op_b}: {' '.join(self.group_b)}")
            if self.onnx_b:
                lines.append(f"    ONNX nodes: {' '.join(self.onnx_b)}")
        if self.separate_s is not None and self.merged_s is not None:
            lines.append(
                f"  predicted: separate {self.separate_s * 1e6:.2f} us, "
                f"merged {self.merged_s * 1e6:.2f} us"
            )
        return "\n".join(lines)

    def to_json(self) -> dict:
        """JSON-ready form."""
        return dict(self.__dict__)


def op_names(plan: FusionPlan) -> list[str]:
    """Relax binding names usable with :func:`explain` (ops that are kernels' members)."""
    names = []
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.info is not None:
                names.append(node.name)
    return names


def onnx_names(plan: FusionPlan) -> list[str]:
    """ONNX node names usable with :func:`explain`, in graph order, each once."""
    return list(dict.fromkeys(n for block in plan.blocks for node in block.graph.nodes
                              if node.info is not None for n in node.origins))


def prim_func_names(plan: FusionPlan) -> list[str]:
    """PrimFunc names of the ops (before fusion), each once."""
    return list(dict.fromkeys(n.func_name for b in plan.blocks for n in b.graph.nodes
                              if n.info is not None))


def find_onnx(plan: FusionPlan, name: str) -> tuple[BlockPlan, int] | None:
    """The op standing for ONNX node ``name``: the last kernel op computing (part of) it,
    the one that produces its output; None when no op has that origin."""
    found = None
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.info is not None and name in node.origins:
                found = block, node.id
    return found


def _find(plan: FusionPlan, name: str) -> tuple[BlockPlan, int]:
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.name == name:
                return block, node.id
    found = find_onnx(plan, name)
    if found is not None:
        return found
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.func_name == name:
                return block, node.id
    found = _find_kernel(plan, name)
    if found is not None:
        return found
    raise UserInputError(unknown_name_message(plan, name))


def _find_kernel(plan: FusionPlan, name: str) -> tuple[BlockPlan, int] | None:
    """The first op of the kernel ``name`` names: its row in the plan table (``#3``), its
    name there, or its PrimFunc after FuseTIR (as the profile shows it)."""
    if name.startswith("#") and name[1:].isdigit():
        row = int(name[1:])
        group = plan.groups[row] if row < len(plan.groups) else None
    else:
        group = next((g for g in plan.groups if name in (g.name, g.kernel)), None)
    if group is None or not group.node_ids:
        return None
    block = next((b for b in plan.blocks if b.function == group.function
                  and b.block_index == group.block_index), None)
    if block is None:
        return None
    ops = [i for i in group.node_ids if block.graph.nodes[i].info is not None]
    return block, (ops or group.node_ids)[0]


def unknown_name_message(plan: FusionPlan, name: str) -> str:
    """The error for a name no op has: the nearest names, and the names of each kind."""
    import difflib

    onnx, relax_names, funcs = onnx_names(plan), op_names(plan), prim_func_names(plan)
    kernels = [g.name for g in plan.groups] + [g.kernel for g in plan.groups if g.kernel]
    every = list(dict.fromkeys(onnx + relax_names + funcs + kernels))
    near = difflib.get_close_matches(name, every, n=6, cutoff=0.5)
    hint = f"did you mean {', '.join(near)}? " if near else ""

    def some(names: list[str], k: int = 6) -> str:
        more = f", ... ({len(names)} in all)" if len(names) > k else ""
        return ", ".join(names[:k]) + more

    rows = f"; kernels: {some([f'#{k} {g.name}' for k, g in enumerate(plan.groups)])}"
    kinds = [f"ONNX nodes: {some(onnx)}"] if onnx else []
    kinds += [f"Relax bindings: {some(relax_names)}", f"PrimFuncs: {some(funcs)}"]
    return (f"no op named '{name}' in the plan; {hint}name an op by its "
            f"{'ONNX node, ' if onnx else ''}Relax binding or PrimFunc name, or a kernel "
            f"by its row in the plan table (#0), its name there or its fused PrimFunc. "
            f"{'; '.join(kinds)}{rows}")


def explain(plan: FusionPlan, op_a: str, op_b: str) -> Explanation:
    """Explain whether and why ``op_a`` and ``op_b`` share a kernel.

    Ops are named by their Relax binding (``lv12``), their ONNX node (``/layer1/Conv``:
    the last op computing it stands for it) or their PrimFunc (``conv2d1``), tried in that
    order; a kernel by its row in the plan table (``#3``), its name there or its fused
    PrimFunc (its first op stands for it). An unknown name is a :class:`UserInputError`
    naming the nearest ones and the names of each kind.
    """
    block_a, a = _find(plan, op_a)
    block_b, b = _find(plan, op_b)
    exp = _explain(plan, op_a, op_b, block_a, a, block_b, b)
    exp.onnx_a, exp.onnx_b = _group_onnx(block_a, a), _group_onnx(block_b, b)
    return exp


def _group_onnx(block: BlockPlan, i: int) -> list[str]:
    """The ONNX nodes of the group holding op ``i``."""
    group = next((g for g in block.groups if i in g), frozenset([i]))
    return list(dict.fromkeys(n for j in sorted(group) for n in block.graph.nodes[j].origins))


def _explain(plan: FusionPlan, op_a: str, op_b: str, block_a: BlockPlan, a: int,
             block_b: BlockPlan, b: int) -> Explanation:
    if block_a is not block_b:
        return Explanation(op_a, op_b, False, "they live in different functions or dataflow "
                           "blocks; fusion never crosses a block", [], [])
    graph = block_a.graph
    model = plan.cost_model_obj
    group_of = {i: g for g in block_a.groups for i in g}
    ga, gb = group_of[a], group_of[b]
    names_a = [graph.nodes[i].name for i in sorted(ga)]
    names_b = [graph.nodes[i].name for i in sorted(gb)]
    if ga == gb:
        separate = sum(model.estimate(graph, frozenset([i])).time_s for i in ga)
        merged = model.estimate(graph, ga).time_s
        return Explanation(op_a, op_b, True, "one kernel: the cost model predicts the group "
                           "faster than its ops run apart", names_a, names_b, separate, merged)
    union = ga | gb
    decision = is_legal(graph, union, plan.limits, plan.kinds)
    separate = model.estimate(graph, ga).time_s + model.estimate(graph, gb).time_s
    if not decision:
        return Explanation(op_a, op_b, False, f"illegal: {decision.reason}", names_a, names_b)
    others = [g for g in block_a.groups if g not in (ga, gb)] + [union]
    if not quotient_is_acyclic(graph, others):
        return Explanation(op_a, op_b, False, "illegal: merging their groups would create a "
                           "cycle through another kernel", names_a, names_b)
    cost = model.estimate(graph, union)
    if not cost.feasible:
        return Explanation(op_a, op_b, False, f"infeasible on {plan.hardware}: {cost.reason}",
                           names_a, names_b)
    why = (
        "unprofitable: the cost model predicts the merged kernel no faster"
        if cost.time_s >= separate
        else "legal and predicted faster merged, but the search chose another partition "
        "that is better overall"
    )
    return Explanation(op_a, op_b, False, why, names_a, names_b, separate, cost.time_s)
