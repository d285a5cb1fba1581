"""Partition search: the legal partition with the least predicted time.

* :func:`exact_partition` — dynamic programming over the down-closed sets (ideals) of
  the graph: optimal for the cost model, used when the block has few fusible nodes.
* :func:`greedy_partition` — priority merging (XLA-style): repeatedly merge the
  producer/consumer pair of groups with the largest predicted gain, keeping every
  group legal and the group graph acyclic; incremental and deterministic.
* :func:`brute_force_partition` — enumerates all set partitions; for tests only.

All three return a list of groups (frozensets of node ids) covering every node of the
graph; barriers are always singletons.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache

from .cost_models.base import CostModel
from .graph import FusionGraph
from .legality import (
    FusionDecision,
    FusionKinds,
    TemplateLimits,
    is_legal,
    quotient_is_acyclic,
    reachable,
)


@dataclass(frozen=True)
class SearchConfig:
    """Options of the partition search.

    Attributes
    ----------
    exact_limit : int
        Blocks with at most this many fusible nodes are solved exactly.
    max_exact_groups : int
        Safety valve on the number of candidate groups the exact search may enumerate.
    limits : TemplateLimits
        What the target's templates can schedule in one group.
    kinds : FusionKinds
        Which kinds of fusion are allowed (ablations switch some off).
    forbidden : tuple
        Feedback from scheduling: groups that only the fallback rule could schedule.
    sources : tuple
        Measured decisions: the candidate (see :func:`choose_partition`) kept per block.
    """

    exact_limit: int = 12
    max_exact_groups: int = 20000
    limits: TemplateLimits = field(default_factory=TemplateLimits)
    kinds: FusionKinds = field(default_factory=FusionKinds)
    #: (function, block index, node ids) of groups the target could not schedule.
    forbidden: tuple[tuple[str, int, frozenset[int]], ...] = ()
    #: (function, block index, source) of blocks whose candidate was decided by measurement
    #: (``compile(..., verify="measure")``): that candidate is kept whatever the model says.
    sources: tuple[tuple[str, int, str], ...] = ()


def _acceptable(graph, group, model, config: SearchConfig) -> FusionDecision:
    d = is_legal(graph, group, config.limits, config.kinds)
    if not d:
        return d
    cost = model.estimate(graph, group)
    if not cost.feasible:
        return FusionDecision.forbid(cost.reason)
    return d


# ------------------------------------------------------------------------- exact
def _connected_groups(graph: FusionGraph, limit: int) -> Iterator[frozenset[int]]:
    """Every weakly connected set of fusible nodes (grown from its smallest node)."""
    fusible = set(graph.fusible_nodes)
    seen: set[frozenset[int]] = set()
    for start in sorted(fusible):
        stack = [frozenset([start])]
        while stack:
            g = stack.pop()
            if g in seen:
                continue
            seen.add(g)
            yield g
            if len(seen) > limit:
                return
            border = {v for u in g for v in graph.succs[u] | graph.preds[u]}
            for v in border:
                if v in fusible and v not in g and v > start:
                    stack.append(g | {v})


def _prologue_ops(graph: FusionGraph, group: frozenset[int]) -> int:
    """Members of ``group`` that feed one of its contractions (its prologue)."""
    above: set[int] = set()
    for n in group:
        if graph.nodes[n].is_contraction:
            above |= reachable(graph.preds, n, group)
    return sum(1 for n in above if not graph.nodes[n].is_contraction)


def exact_partition(
    graph: FusionGraph, model: CostModel, config: SearchConfig | None = None
) -> list[frozenset[int]]:
    """Optimal partition under ``model`` by DP over ideals (small graphs)."""
    config = config or SearchConfig()
    n = len(graph.nodes)
    pred_mask = [sum(1 << p for p in graph.preds[i]) for i in range(n)]
    # (mask, preds, cost, flops, g)
    candidates: list[tuple[int, int, float, float, frozenset[int]]] = []
    for g in _connected_groups(graph, config.max_exact_groups):
        if len(g) > 1 and not _acceptable(graph, g, model, config):
            continue
        mask = sum(1 << i for i in g)
        preds = 0
        for i in g:
            preds |= pred_mask[i]
        preds &= ~mask
        est = model.estimate(graph, g)
        candidates.append((mask, preds, est.time_s, (est.flops, _prologue_ops(graph, g)), g))
    for i in range(n):
        if not graph.nodes[i].fusible:
            est = model.estimate(graph, frozenset([i]))
            candidates.append((1 << i, pred_mask[i], est.time_s, (est.flops, 0), frozenset([i])))
    full = (1 << n) - 1
    # index candidates by their lowest member so each state only scans the relevant ones
    by_low: dict[int, list] = {}
    for c in candidates:
        low = (c[0] & -c[0]).bit_length() - 1
        by_low.setdefault(low, []).append(c)

    @cache
    def best(done: int) -> tuple[float, tuple, tuple]:
        """(time, (FLOPs, prologue ops), groups) of the best partition of the nodes not in
        ``done``; times equal to the nanosecond go to the partition that computes less
        (recomputed prologues), then to the one with fewer ops loaded into a contraction
        (a bias + ReLU stays its matmul's epilogue rather than the next one's operand load,
        where the model sees no difference)."""
        if done == full:
            return 0.0, (0.0, 0), ()
        result = (float("inf"), (float("inf"), 0), ())
        remaining = full & ~done
        # Any group may come next if its external preds are done. Scan candidates whose
        # lowest node is not yet done.
        r = remaining
        while r:
            low = (r & -r).bit_length() - 1
            r &= r - 1
            for mask, preds, cost, flops, g in by_low.get(low, ()):
                if mask & done or (preds & ~done):
                    continue
                sub_cost, sub_flops, sub_groups = best(done | mask)
                total = cost + sub_cost
                work = (flops[0] + sub_flops[0], flops[1] + sub_flops[1])
                if (round(total, 9), work) < (round(result[0], 9), result[1]):
                    result = (total, work, (g,) + sub_groups)
        return result

    _, _, groups = best(0)
    best.cache_clear()
    return sorted(groups, key=min)


# ------------------------------------------------------------------------ greedy
#: Nodes between two contractions a seed may hold (a softmax with its scale and mask, an
#: activation and a norm); longer paths are left to pairwise merging.
MAX_SEED_NODES = 24


def chain_seeds(graph: FusionGraph, model: CostModel,
                config: SearchConfig) -> list[frozenset[int]]:
    """Groups spanning two contractions and every node on the paths between them, for the
    greedy search to start from: pairwise merging reaches such a group only through its
    parts, which a target may not take (a GPU runs ``softmax(Q K^T) V`` as one online-softmax
    kernel, but has no template for ``Q K^T`` with its softmax alone). Legal, feasible,
    predicted faster than their members apart; disjoint, the largest gain first."""
    fusible = frozenset(graph.fusible_nodes)
    candidates = []
    for c1 in sorted(fusible):
        if not graph.nodes[c1].is_contraction:
            continue
        # Walk down from c1 through non-contractions; the contractions met end the walk.
        between: set[int] = set()
        reached: set[int] = set()
        stack = [s for s in graph.succs[c1] if s in fusible]
        while stack and len(between) <= MAX_SEED_NODES:
            u = stack.pop()
            if u in between or u in reached:
                continue
            if graph.nodes[u].is_contraction:
                reached.add(u)
                continue
            between.add(u)
            stack.extend(s for s in graph.succs[u] if s in fusible)
        if len(between) > MAX_SEED_NODES:
            continue
        for c2 in sorted(reached):
            path = reachable(graph.preds, c2, frozenset(between))
            group = frozenset({c1, c2} | path)
            if not _acceptable(graph, group, model, config):
                continue
            apart = sum(model.estimate(graph, frozenset([n])).time_s for n in group)
            gain = apart - model.estimate(graph, group).time_s
            if gain > 0:
                candidates.append((-round(gain, 12), min(group), group))
    seeds: list[frozenset[int]] = []
    taken: set[int] = set()
    for _, _, group in sorted(candidates):
        if not group & taken and quotient_is_acyclic(graph, [*seeds, group]):
            seeds.append(group)
            taken |= group
    return seeds


def greedy_partition(
    graph: FusionGraph,
    model: CostModel,
    config: SearchConfig | None = None,
    start: list[frozenset[int]] | None = None,
) -> list[frozenset[int]]:
    """Priority merging of producer/consumer groups by predicted gain.

    ``start`` (disjoint, legal groups whose quotient graph is acyclic) replaces the chain
    seeds as the groups merging starts from.
    """
    config = config or SearchConfig()
    n = len(graph.nodes)
    # Start from the chain seeds, every other node alone; a group is named by an id
    # (a node's for a singleton), its edges are its members' edges between groups.
    members: dict[int, frozenset[int]] = {}
    owner: dict[int, int] = {}
    next_id = n
    seeded = chain_seeds(graph, model, config) if start is None \
        else [g for g in start if len(g) > 1]
    for seed in seeded:
        members[next_id] = seed
        owner.update(dict.fromkeys(seed, next_id))
        next_id += 1
    for i in range(n):
        if i not in owner:
            members[i] = frozenset([i])
            owner[i] = i
    version = dict.fromkeys(members, 0)
    estimates = {g: model.estimate(graph, m) for g, m in members.items()}
    cost = {g: e.time_s for g, e in estimates.items()}
    work = {g: e.flops for g, e in estimates.items()}
    g_succ = {g: {owner[s] for u in m for s in graph.succs[u]} - {g} for g, m in members.items()}
    g_pred = {g: {owner[p] for u in m for p in graph.preds[u]} - {g} for g, m in members.items()}
    heap: list = []

    def push(a: int, b: int) -> None:
        if not (graph.nodes[min(members[a])].fusible and graph.nodes[min(members[b])].fusible):
            return
        merged = members[a] | members[b]
        if not _acceptable(graph, merged, model, config):
            return
        est = model.estimate(graph, merged)
        gain = cost[a] + cost[b] - est.time_s
        if gain > 0:
            # Gains equal to the nanosecond (a memory-bound kernel hides the arithmetic a
            # merge adds) go to the merge that recomputes least: a bias + ReLU joins its
            # matmul as an epilogue rather than the next matmul's operand load.
            recompute = (est.flops - work[a] - work[b], _prologue_ops(graph, merged))
            heapq.heappush(heap, (-round(gain, 9), recompute, min(merged), a, b,
                                  version[a], version[b]))

    def creates_cycle(a: int, b: int) -> bool:
        # a -> b edge exists; any other path a ~> b through a third group makes a cycle.
        # No pruning by node index: groups are not intervals, so a group path need not
        # follow node-level ancestry (a random-DAG test caught exactly that).
        stack = [s for s in g_succ[a] if s != b]
        seen = set(stack)
        while stack:
            u = stack.pop()
            for v in g_succ[u]:
                if v == b:
                    return True
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return False

    for a in sorted(members):
        for b in sorted(g_succ[a]):
            push(a, b)
    while heap:
        _, _, _, a, b, va, vb = heapq.heappop(heap)
        if a not in members or b not in members or version[a] != va or version[b] != vb:
            continue
        if b not in g_succ[a]:
            continue
        if creates_cycle(a, b):
            continue
        c = next_id
        next_id += 1
        members[c] = members.pop(a) | members.pop(b)
        version[c] = 0
        est = model.estimate(graph, members[c])
        cost[c], work[c] = est.time_s, est.flops
        g_succ[c] = (g_succ.pop(a) | g_succ.pop(b)) - {a, b}
        g_pred[c] = (g_pred.pop(a) | g_pred.pop(b)) - {a, b}
        for s in g_succ[c]:
            g_pred[s] -= {a, b}
            g_pred[s].add(c)
        for p in g_pred[c]:
            g_succ[p] -= {a, b}
            g_succ[p].add(c)
        for s in sorted(g_succ[c]):
            push(c, s)
        for p in sorted(g_pred[c]):
            push(p, c)
    return sorted(members.values(), key=min)


# ------------------------------------------------------------------- reference
def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def brute_force_partition(
    graph: FusionGraph, model: CostModel, config: SearchConfig | None = None
) -> tuple[float, list[frozenset[int]]]:
    """Enumerate every set partition (tests only; n <= ~10)."""
    config = config or SearchConfig()
    best = (float("inf"), [])
    for part in _set_partitions(list(range(len(graph.nodes)))):
        groups = [frozenset(p) for p in part]
        if any(len(g) > 1 and not _acceptable(graph, g, model, config) for g in groups):
            continue
        if not quotient_is_acyclic(graph, groups):
            continue
        total = sum(model.estimate(graph, g).time_s for g in groups)
        if total < best[0] - 1e-15:
            best = (total, sorted(groups, key=min))
    return best


def search_partition(
    graph: FusionGraph, model: CostModel, config: SearchConfig | None = None
) -> list[frozenset[int]]:
    """Exact search for small blocks, greedy merging for large ones."""
    config = config or SearchConfig()
    if len(graph.fusible_nodes) <= config.exact_limit:
        return exact_partition(graph, model, config)
    return greedy_partition(graph, model, config)


def singletons(graph: FusionGraph) -> list[frozenset[int]]:
    """The unfused partition."""
    return [frozenset([i]) for i in range(len(graph.nodes))]


def legal_part(
    graph: FusionGraph, groups: list[frozenset[int]], model: CostModel, config: SearchConfig
) -> list[frozenset[int]]:
    """``groups`` with every group our legality or the model refuses split into single ops
    (another compiler's partition, e.g. FuseOps's, made a candidate of ours); the rest as
    they are. Unfused when the groups left make a cycle between kernels."""
    kept: list[frozenset[int]] = []
    for g in groups:
        if len(g) == 1 or _acceptable(graph, g, model, config):
            kept.append(g)
        else:
            kept.extend(frozenset([i]) for i in sorted(g))
    if not quotient_is_acyclic(graph, kept):
        return singletons(graph)
    return sorted(kept, key=min)


@dataclass(frozen=True)
class Choice:
    """The partition kept for a block and where it came from.

    Attributes
    ----------
    groups : list of frozenset
        The partition.
    source : str
        ``"search"``; ``"fuseops"`` (FuseOps's partition, legal parts, merged further by
        the greedy search) or ``"unfused"`` when those are predicted faster than the
        search's own result (or when a measured decision names them).
    time_s : float
        Its predicted time.
    search_time_s : float
        The search's own result's predicted time (equal to ``time_s`` when it won).
    runner_up : str or None
        The best other candidate whose partition differs from ``groups`` (None: every
        candidate is that partition).
    runner_up_groups : list of frozenset or None
        Its partition.
    runner_up_time_s : float or None
        Its predicted time.
    """

    groups: list[frozenset[int]]
    source: str
    time_s: float
    search_time_s: float
    runner_up: str | None = None
    runner_up_groups: list[frozenset[int]] | None = None
    runner_up_time_s: float | None = None


def choose_partition(
    graph: FusionGraph,
    model: CostModel,
    config: SearchConfig | None = None,
    baseline: list[frozenset[int]] | None = None,
    prefer: str | None = None,
) -> Choice:
    """The search's partition, unless another candidate is predicted faster.

    The search is a heuristic on large blocks: priority merging can lock in a merge that
    blocks better ones. The candidates it must beat under the same model are the unfused
    partition and, given ``baseline`` (FuseOps's partition), that partition's legal part
    merged further by the greedy search. Ties go to the search, so plans that already
    beat both do not move. ``prefer`` names the candidate to keep instead (a measured
    decision); a name that is not a candidate is ignored. The best other partition is
    returned as the runner-up.
    """
    config = config or SearchConfig()
    groups = search_partition(graph, model, config)
    ours = model.estimate_plan(graph, groups)
    best = Choice(groups, "search", ours, ours)
    scored = [best]
    candidates = [("unfused", singletons(graph))]
    if baseline is not None:
        start = legal_part(graph, baseline, model, config)
        candidates.insert(0, ("fuseops", greedy_partition(graph, model, config, start)))
    for source, cand in candidates:
        t = model.estimate_plan(graph, cand)
        scored.append(Choice(sorted(cand, key=min), source, t, ours))
        if round(t, 12) < round(best.time_s, 12):
            best = scored[-1]
    best = next((c for c in scored if c.source == prefer), best)
    kept = set(best.groups)
    others = [c for c in scored if set(c.groups) != kept]
    if not others:
        return best
    second = min(others, key=lambda c: round(c.time_s, 12))
    return Choice(best.groups, best.source, best.time_s, ours, second.source, second.groups,
                  second.time_s)


__all__ = [
    "Choice",
    "SearchConfig",
    "brute_force_partition",
    "chain_seeds",
    "choose_partition",
    "exact_partition",
    "greedy_partition",
    "legal_part",
    "search_partition",
    "singletons",
]
