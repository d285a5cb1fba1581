"""What each kind of fusion contributes: kernel counts, predicted and measured latency.

    python benchmarks/ablation.py [--models bert_2l gpt2_2l vit_tiny] [--measure] [--repeat 20]

For every model: FuseOps's partition, our full search, and our search with one kind switched
off at a time (reduction chains, multi-output, prologue, weight folding, siblings). With
``--measure`` every variant is built with the same schedule rules and timed, interleaved in
one process (median of ``--repeat`` runs). Writes benchmarks/results/ablation.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusion_tvm  # noqa: E402
from benchmarks.zoo import example_inputs, get_model  # noqa: E402
from fusion_tvm.legality import FusionKinds  # noqa: E402
from fusion_tvm.search import SearchConfig  # noqa: E402

KINDS = [f.name for f in dataclasses.fields(FusionKinds)]


def variants() -> dict[str, dict]:
    out = {"fuseops": {"fusion": "fuseops"}, "ours": {"fusion": "cost"}}
    for kind in KINDS:
        cfg = SearchConfig(kinds=FusionKinds(**{kind: False}))
        out[f"ours -{kind}"] = {"fusion": "cost", "search": cfg}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="*", default=["bert_2l", "gpt2_2l", "vit_tiny"])
    ap.add_argument("--hw", default="host")
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="test-sized models")
    args = ap.parse_args()
    rows = []
    threads = os.environ.get("TVM_NUM_THREADS", "all cores")
    print(f"machine: {os.cpu_count()} cores, TVM_NUM_THREADS={threads}, hw preset {args.hw}")
    for name in args.models:
        model = get_model(name, small=args.small)
        feeds = example_inputs(model, seed=0)
        built = {}
        for label, kw in variants().items():
            print(f"[{name}] building {label}", file=sys.stderr, flush=True)
            cm = fusion_tvm.compile(model, hw=args.hw, **kw)
            built[label] = cm
        times = {label: [] for label in built}
        if args.measure:
            for cm in built.values():
                cm.run(feeds)
            for _ in range(args.repeat):
                for label, cm in built.items():
                    t0 = time.perf_counter()
                    cm.run(feeds)
                    times[label].append(time.perf_counter() - t0)
        fo = built["fuseops"]
        for label, cm in built.items():
            plan = cm.plan
            row = {
                "model": name, "variant": label, "kernels": cm.num_kernels,
                "kernels_vs_fuseops": cm.num_kernels / fo.num_kernels,
                "predicted_ms": plan.predicted_time_s * 1e3 if plan else None,
                "measured_ms": statistics.median(times[label]) * 1e3 if times[label] else None,
            }
            if row["measured_ms"] and times["fuseops"]:
                row["speedup_vs_fuseops"] = statistics.median(times["fuseops"]) * 1e3 / \
                    row["measured_ms"]
            rows.append(row)
    print(f"\n{'model':<10} {'variant':<22} {'kernels':>7} {'x FuseOps':>9} {'pred ms':>8} "
          f"{'meas ms':>8} {'speedup':>8}")
    for r in rows:
        pred = f"{r['predicted_ms']:.2f}" if r["predicted_ms"] else "-"
        meas = f"{r['measured_ms']:.2f}" if r["measured_ms"] else "-"
        sp = f"{r['speedup_vs_fuseops']:.2f}x" if r.get("speedup_vs_fuseops") else "-"
        print(f"{r['model']:<10} {r['variant']:<22} {r['kernels']:>7} "
              f"{r['kernels_vs_fuseops']:>9.2f} {pred:>8} {meas:>8} {sp:>8}")
    out = Path(__file__).parent / "results" / "ablation.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
