"""A cost model evaluated over several values of the symbolic dims.

Wraps any model: a group's cost is the weighted sum of its cost at each sample point, each
point weighted by the inverse of the unfused time there, so that every size counts by
*relative* time and the search picks a plan that is good across the whole range rather
than one tuned for the largest size.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import FusionGraph
from .base import Cost, CostModel


class MultiPointCostModel(CostModel):
    """Weighted combination of ``inner`` at ``points`` (dicts of dim values)."""

    def __init__(self, inner: CostModel, points: Sequence[dict[str, int]]):
        super().__init__(inner.hw, inner.backend)
        self.inner = inner
        self.points = [dict(p) for p in points]
        self.name = f"{inner.name}@{len(self.points)}pts"
        self._graphs: dict[int, tuple[FusionGraph, list[FusionGraph], list[float]]] = {}

    def _views(self, graph: FusionGraph) -> tuple[list[FusionGraph], list[float]]:
        hit = self._graphs.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1], hit[2]
        views = [graph.with_dims({**graph.dims, **p}) for p in self.points]
        weights = []
        for v in views:
            total = sum(self.inner.estimate(v, frozenset([i])).time_s
                        for i in range(len(v.nodes)))
            weights.append(1.0 / total if total > 0 else 1.0)
        norm = sum(weights)
        weights = [w / norm for w in weights]
        self._graphs[id(graph)] = (graph, views, weights)
        return views, weights

    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        views, weights = self._views(graph)
        costs = [self.inner.estimate(v, group) for v in views]
        feasible = all(c.feasible for c in costs)
        reason = next((c.reason for c in costs if not c.feasible), costs[0].reason)
        # Report seconds at the middle point: one constant factor for every group, so
        # the search's comparisons are unchanged.
        mid = len(costs) // 2
        rel = sum(w * c.time_s for w, c in zip(weights, costs, strict=True))
        return Cost(
            time_s=rel / weights[mid],
            dram_bytes=costs[mid].dram_bytes,
            onchip_bytes=max(c.onchip_bytes for c in costs),
            flops=costs[mid].flops,
            feasible=feasible,
            reason=reason,
            detail={**costs[mid].detail, "per_point_s": [c.time_s for c in costs]},
        )
