"""Partition search: legality never violated, exact == brute force, greedy scales."""

import time

import pytest

from fusion_tvm.cost_models.base import Cost, CostModel
from fusion_tvm.legality import TemplateLimits, is_legal, quotient_is_acyclic
from fusion_tvm.presets import get_hardware
from fusion_tvm.search import (
    SearchConfig,
    brute_force_partition,
    choose_partition,
    exact_partition,
    greedy_partition,
    legal_part,
    search_partition,
)
from fusion_tvm.testing.synthetic import ConstantCostModel, TableCostModel, make_graph, random_dag


def _check_partition(graph, groups, limits=None):
    covered = sorted(i for g in groups for i in g)
    assert covered == list(range(len(graph.nodes))), "partition must cover each node once"
    for g in groups:
        if len(g) > 1:
            assert is_legal(graph, g, limits), is_legal(graph, g, limits).reason
    assert quotient_is_acyclic(graph, groups)


@pytest.mark.parametrize("seed", range(40))
def test_exact_matches_brute_force(seed):
    n = 5 + seed % 4  # 5..8 nodes
    graph = random_dag(n, seed)
    model = TableCostModel(seed=seed)
    best_cost, best_groups = brute_force_partition(graph, model)
    groups = exact_partition(graph, model)
    _check_partition(graph, groups)
    cost = model.estimate_plan(graph, groups)
    assert cost == pytest.approx(best_cost, rel=1e-9), (groups, best_groups)


@pytest.mark.parametrize("seed", range(20))
def test_greedy_is_legal_and_no_worse_than_unfused(seed):
    graph = random_dag(60, seed, edge_prob=0.08)
    model = TableCostModel(seed=seed)
    groups = greedy_partition(graph, model)
    _check_partition(graph, groups)
    unfused = sum(model.estimate(graph, frozenset([i])).time_s for i in range(60))
    assert model.estimate_plan(graph, groups) <= unfused


def test_greedy_close_to_exact_on_small_graphs():
    ratios = []
    for seed in range(30):
        graph = random_dag(8, 100 + seed)
        model = TableCostModel(seed=seed)
        exact = model.estimate_plan(graph, exact_partition(graph, model))
        greedy = model.estimate_plan(graph, greedy_partition(graph, model))
        assert greedy >= exact - 1e-9
        ratios.append(greedy / exact)
    assert sum(ratios) / len(ratios) < 1.15


def test_never_fuse_and_always_fuse_models():
    # diamond 0 -> {1, 2} -> 3 plus a tail 3 -> 4
    graph = make_graph(5, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])
    never = search_partition(graph, ConstantCostModel(fuse=False))
    assert all(len(g) == 1 for g in never)
    always = search_partition(graph, ConstantCostModel(fuse=True))
    assert always == [frozenset(range(5))]


def test_convexity_blocks_path_through_barrier():
    # 0 -> 1 (barrier) -> 2 and 0 -> 2: fusing {0, 2} would need the barrier inside.
    graph = make_graph(3, [(0, 1), (1, 2), (0, 2)], barriers={1})
    d = is_legal(graph, frozenset({0, 2}))
    assert not d and "convex" in d.reason
    groups = search_partition(graph, ConstantCostModel(fuse=True))
    assert all(len(g) == 1 for g in groups)


def test_template_limits_refuse_two_contractions():
    graph = make_graph(3, [(0, 1), (1, 2)], kinds=["mm", "ew", "mm"])
    d = is_legal(graph, frozenset({0, 1, 2}), TemplateLimits(max_contractions=1))
    assert not d and "matmul/conv" in d.reason
    assert is_legal(graph, frozenset({0, 1, 2}), TemplateLimits(max_contractions=2))
    groups = search_partition(graph, ConstantCostModel(fuse=True))
    assert frozenset({0, 1, 2}) not in groups
    _check_partition(graph, groups, TemplateLimits())


def test_search_is_deterministic():
    graph = random_dag(200, 7, edge_prob=0.02)
    model = TableCostModel(seed=7)
    assert greedy_partition(graph, model) == greedy_partition(graph, TableCostModel(seed=7))


def test_exact_used_for_small_blocks():
    graph = random_dag(9, 3)
    model = TableCostModel(seed=3)
    cfg = SearchConfig(exact_limit=12)
    assert search_partition(graph, model, cfg) == exact_partition(graph, model, cfg)


def test_thousand_node_graph_searches_quickly():
    graph = random_dag(1000, 11, edge_prob=0.003)
    model = TableCostModel(seed=11)
    t0 = time.perf_counter()
    groups = greedy_partition(graph, model)
    elapsed = time.perf_counter() - t0
    _check_partition(graph, groups)
    assert elapsed < 20.0  # generous for loaded CI; the benchmark reports the real figure


class _GroupTable(CostModel):
    """Times per group from a table; groups not listed cost the sum of their members + 1."""

    def __init__(self, table):
        super().__init__(get_hardware("ci-x86-avx2"))
        self.table = {frozenset(k): v for k, v in table.items()}

    def estimate(self, graph, group):
        if group in self.table:
            return Cost(self.table[group])
        return Cost(sum(self.table[frozenset([i])] for i in group) + 1.0)


def _chain_trap():
    # 0 -> 1 -> 2 -> 3: merging {1, 2} gains most (5), but {0, 1} + {2, 3} gains 8 and
    # priority merging can no longer reach it; the whole chain is slow.
    graph = make_graph(4, [(0, 1), (1, 2), (2, 3)])
    model = _GroupTable({(0,): 5, (1,): 5, (2,): 5, (3,): 5, (1, 2): 5,
                         (0, 1): 6, (2, 3): 6, (0, 1, 2): 20, (1, 2, 3): 20,
                         (0, 1, 2, 3): 40})
    return graph, model, SearchConfig(exact_limit=0)  # force the greedy search


def test_fuseops_partition_kept_where_the_search_prices_worse():
    graph, model, cfg = _chain_trap()
    assert greedy_partition(graph, model, cfg) == \
        [frozenset([0]), frozenset([1, 2]), frozenset([3])]
    plain = choose_partition(graph, model, cfg)
    assert (plain.source, plain.time_s) == ("search", 15)
    fo = [frozenset([0, 1]), frozenset([2, 3])]
    choice = choose_partition(graph, model, cfg, fo)
    assert (choice.source, choice.groups, choice.time_s, choice.search_time_s) == \
        ("fuseops", fo, 12, 15)


def test_search_kept_on_ties_and_where_it_wins():
    graph, model, cfg = _chain_trap()
    searched = greedy_partition(graph, model, cfg)
    assert choose_partition(graph, model, cfg, searched).source == "search"
    worse = [frozenset([0, 1, 2]), frozenset([3])]
    # FuseOps's start is merged further only where that gains; here it cannot beat 15.
    assert choose_partition(graph, model, cfg, worse).source == "search"


def test_illegal_baseline_groups_are_split():
    # 0 -> 1 (barrier) -> 2 and 0 -> 2: {0, 2} is not convex; {0} and {2} alone remain.
    graph = make_graph(4, [(0, 1), (1, 2), (0, 2), (2, 3)], barriers={1})
    model = ConstantCostModel(fuse=True)
    part = legal_part(graph, [frozenset([0, 2]), frozenset([1]), frozenset([3])], model,
                      SearchConfig())
    assert part == [frozenset([i]) for i in range(4)]


@pytest.mark.parametrize("seed", range(10))
def test_choice_never_worse_than_its_candidates(seed):
    graph = random_dag(40, seed, edge_prob=0.1)
    model = TableCostModel(seed=seed)
    cfg = SearchConfig(exact_limit=0)
    # Another model's plan stands in for FuseOps's.
    other = greedy_partition(graph, TableCostModel(seed=seed + 1000), cfg)
    choice = choose_partition(graph, model, cfg, other)
    _check_partition(graph, choice.groups)
    t = model.estimate_plan(graph, choice.groups)
    assert t == pytest.approx(choice.time_s)
    assert t <= model.estimate_plan(graph, other) + 1e-9
    assert t <= model.estimate_plan(graph, greedy_partition(graph, model, cfg)) + 1e-9
    assert t <= sum(model.estimate(graph, frozenset([i])).time_s for i in range(40)) + 1e-9
