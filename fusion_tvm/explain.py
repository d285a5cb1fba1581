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
    known = ", ".join(op_names(plan)[:30])
    raise UserInputError(f"no op named '{name}' in the plan; ops include: {known}")


def explain(plan: FusionPlan, op_a: str, op_b: str) -> Explanation:
    """Explain whether and why ``op_a`` and ``op_b`` share a kernel.

    Ops are named by their Relax binding (``lv12``) or PrimFunc (``conv2d1``) name, as the
    plan table shows them.
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
