"""Synthetic fusion graphs and table cost models, for search tests and benchmarks.

They need no TVM module: nodes carry a fake :class:`PrimFuncInfo` with one block whose
work class is chosen by the caller, so legality sees contractions and reductions as in
real graphs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..cost_models.base import Cost, CostModel
from ..graph import FusionGraph, FusionNode, TensorInfo
from ..ops import OpClass, PatternKind
from ..presets import get_hardware
from ..tir_analysis import BlockInfo, PrimFuncInfo

_KINDS = {
    "ew": (OpClass.ELEMENTWISE, PatternKind.ELEMWISE, 0, False),
    "red": (OpClass.REDUCTION, PatternKind.COMM_REDUCE, 1, False),
    "mm": (OpClass.MATMUL, PatternKind.OUT_EWISE_FUSABLE, 1, True),
}


def _info(kind: str, size: int) -> PrimFuncInfo:
    cls, _, nred, contraction = _KINDS[kind]
    ops = {OpClass.ELEMENTWISE if contraction else cls: 1}
    block = BlockInfo("b", (size,), nred, ops, contraction, {"x": 1}, "y")
    return PrimFuncInfo(blocks=[block], param_names=["x", "y"], param_shapes=[(size,), (size,)])


def make_graph(
    num_nodes: int,
    edges: list[tuple[int, int]],
    kinds: list[str] | None = None,
    barriers: set[int] | None = None,
    size: int = 1 << 16,
) -> FusionGraph:
    """A graph of ``num_nodes`` nodes; ``edges`` must go from lower to higher ids."""
    kinds = kinds or ["ew"] * num_nodes
    barriers = barriers or set()
    tensors = [TensorInfo(id=i, name=f"t{i}", shape=(size,), dtype="float32", producer=i)
               for i in range(num_nodes)]
    ext = TensorInfo(id=num_nodes, name="input", shape=(size,), dtype="float32")
    tensors.append(ext)
    inputs: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in edges:
        if not u < v:
            raise ValueError("edges must go from lower to higher node ids")
        inputs[v].append(u)
    nodes = []
    for i in range(num_nodes):
        if not inputs[i]:
            inputs[i].append(ext.id)
        fusible = i not in barriers
        node = FusionNode(
            id=i, name=f"n{i}", binding=None, inputs=inputs[i], outputs=[i],
            func_name=f"{kinds[i]}{i}",
            pattern=_KINDS[kinds[i]][1] if fusible else PatternKind.OPAQUE,
            info=_info(kinds[i], size), fusible=fusible,
        )
        nodes.append(node)
        for t in inputs[i]:
            tensors[t].consumers.append(i)
    for i in range(num_nodes):
        if not tensors[i].consumers:
            tensors[i].escapes = True
    return FusionGraph(nodes=nodes, tensors=tensors, dims={})


def random_dag(
    num_nodes: int, seed: int, edge_prob: float = 0.35, mm_prob: float = 0.2,
    red_prob: float = 0.15, barrier_prob: float = 0.05,
) -> FusionGraph:
    """A random DAG with fan-out, diamonds, contractions, reductions and barriers."""
    rng = random.Random(seed)
    edges = []
    for v in range(1, num_nodes):
        preds = [u for u in range(v) if rng.random() < edge_prob]
        if not preds:
            preds = [rng.randrange(v)]
        edges.extend((u, v) for u in preds)
    kinds = []
    for _ in range(num_nodes):
        r = rng.random()
        kinds.append("mm" if r < mm_prob else "red" if r < mm_prob + red_prob else "ew")
    barriers = {i for i in range(num_nodes) if rng.random() < barrier_prob}
    return make_graph(num_nodes, edges, kinds, barriers)


@dataclass
class TableCostModel(CostModel):
    """A deterministic synthetic model: launch + work - savings on internal edges + a
    capacity penalty on large groups. Not physically meaningful; it exercises search."""

    seed: int = 0
    launch: float = 5.0
    capacity: int = 4

    def __post_init__(self):
        super().__init__(get_hardware("ci-x86-avx2"))
        rng = random.Random(self.seed)
        self._work = [rng.uniform(1, 10) for _ in range(4096)]
        self._save = [rng.uniform(0, 6) for _ in range(4096)]

    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        if len(group) == 1 and not graph.nodes[min(group)].fusible:
            return Cost(1.0)
        t = self.launch + sum(self._work[i] for i in group)
        for u in group:
            for v in graph.succs[u]:
                if v in group:
                    t -= self._save[(u * 31 + v) % 4096]
        if len(group) > self.capacity:
            t += 4.0 * (len(group) - self.capacity)
        return Cost(max(t, 0.5))


class ConstantCostModel(CostModel):
    """``fuse=True``: every merge gains (always fuse); ``fuse=False``: never fuse."""

    def __init__(self, fuse: bool = True):
        super().__init__(get_hardware("ci-x86-avx2"))
        self.fuse = fuse

    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        return Cost(1.0 if self.fuse else float(len(group)) * 2.0)
