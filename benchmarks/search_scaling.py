"""Search time of the partition search on synthetic DAGs and real model graphs.

    python benchmarks/search_scaling.py [--sizes 100 250 500 1000 2000] [--models bert_base]

Synthetic graphs use the deterministic table cost model (fusion_tvm.testing.synthetic);
model graphs use the roofline model on the host spec. Prints a table, writes
benchmarks/results/search_scaling.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusion_tvm.search import exact_partition, greedy_partition  # noqa: E402
from fusion_tvm.testing.synthetic import TableCostModel, random_dag  # noqa: E402


def _time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic(sizes: list[int], repeat: int) -> list[dict]:
    rows = []
    for n in sizes:
        graph = random_dag(n, seed=n, edge_prob=min(0.35, 3.0 / n))
        model = TableCostModel(seed=n)
        t = _time(lambda g=graph, m=model: greedy_partition(g, m), repeat)
        groups = greedy_partition(graph, model)
        rows.append({"graph": f"random DAG {n}", "nodes": n, "edges": sum(map(len, graph.succs)),
                     "search": "greedy", "seconds": t, "groups": len(groups)})
    for n in (8, 10, 12):
        graph = random_dag(n, seed=n)
        model = TableCostModel(seed=n)
        t = _time(lambda g=graph, m=model: exact_partition(g, m), repeat)
        rows.append({"graph": f"random DAG {n}", "nodes": n, "edges": sum(map(len, graph.succs)),
                     "search": "exact", "seconds": t, "groups": len(exact_partition(graph, model))})
    return rows


def models(names: list[str]) -> list[dict]:
    from benchmarks.zoo import get_model
    from fusion_tvm.frontend import load_model
    from fusion_tvm.pipeline import make_pipeline

    rows = []
    for name in names:
        loaded = load_model(get_model(name))
        parts = make_pipeline(hw="host")
        with parts.target:
            parts.fuse(parts.prepare(loaded.mod))
        plan = parts.fuse_pass.plan
        nodes = sum(len(b.graph.nodes) for b in plan.blocks)
        rows.append({"graph": name, "nodes": nodes, "edges": None, "search": "auto",
                     "seconds": plan.search_time_s, "groups": plan.num_kernels})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[100, 250, 500, 1000, 2000])
    ap.add_argument("--models", nargs="*", default=["bert_base", "resnet50"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = synthetic(args.sizes, args.repeat) + models(args.models)
    print(f"{'graph':<22} {'nodes':>6} {'search':>7} {'seconds':>9} {'kernels':>8}")
    for r in rows:
        print(f"{r['graph']:<22} {r['nodes']:>6} {r['search']:>7} {r['seconds']:>9.3f} "
              f"{r['groups']:>8}")
    out = Path(__file__).parent / "results" / "search_scaling.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
