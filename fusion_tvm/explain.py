"""Why are two ops (not) in one kernel? Answers from legality or from the cost model."""

from __future__ import annotations

from dataclasses import dataclass

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

    def __str__(self) -> str:
        head = "fused" if self.fused else "not fused"
        lines = [f"{self.op_a} and {self.op_b}: {head}", f"  why: {self.reason}"]
        lines.append(f"  group of {self.op_a}: {' '.join(self.group_a)}")
        if not self.fused:
            lines.append(f"  group of {self.op_b}: {' '.join(self.group_b)}")
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
    """Names usable with :func:`explain` (binding names, then PrimFunc names)."""
    names = []
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.info is not None:
                names.append(node.name)
    return names


def _find(plan: FusionPlan, name: str) -> tuple[BlockPlan, int]:
    for block in plan.blocks:
        for node in block.graph.nodes:
            if node.name == name:
                return block, node.id
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
    """The error for a name no op has: the nearest names, and how ops can be named."""
    import difflib

    names = op_names(plan) + [n.func_name for b in plan.blocks for n in b.graph.nodes
                              if n.info is not None]
    names += [g.name for g in plan.groups] + [g.kernel for g in plan.groups if g.kernel]
    near = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=6, cutoff=0.5)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    kernels = ", ".join(f"#{k} {g.name}" for k, g in enumerate(plan.groups[:6]))
    more = f", ... ({len(plan.groups)} kernels)" if len(plan.groups) > 6 else ""
    return (f"no op named '{name}' in the plan; {hint}Name an op by its Relax binding "
            f"(e.g. {names[0] if names else 'lv3'}) or PrimFunc name, or a kernel by its "
            f"row in the plan table (#0), its name there or its fused PrimFunc; kernels: "
            f"{kernels}{more}")


def explain(plan: FusionPlan, op_a: str, op_b: str) -> Explanation:
    """Explain whether and why ``op_a`` and ``op_b`` share a kernel.

    Ops are named by their Relax binding (``lv12``) or PrimFunc (``conv2d1``) name; a kernel
    by its row in the plan table (``#3``), its name there or its fused PrimFunc (its first
    op stands for it). An unknown name is a :class:`UserInputError` naming the nearest ones.
    """
    block_a, a = _find(plan, op_a)
    block_b, b = _find(plan, op_b)
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
