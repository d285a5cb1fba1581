"""Long-running differential fuzzing of the fusion pipeline.

    python benchmarks/fuzz.py --count 5000 --seed 0            # seeds 0..4999
    python benchmarks/fuzz.py --count 1 --seed 88 --reduce     # shrink and save one failure

Each seed makes a random ONNX graph (:mod:`fusion_tvm.testing.random_onnx`); it is compiled
with our fusion (``fusion="cost"``, checked well formed after every pass) and without
(``fusion="none"``) and both are compared with onnxruntime. With ``--reduce`` each failure
that is ours (crash, ill-formed module, wrong numbers where the unfused build is right) is
shrunk by delta debugging and saved as ``tests/data/fuzz_regressions/fuzz_<seed>.{onnx,npz,json}``
which ``tests/test_fuzz_regressions.py`` replays (marked xfail until the bug is fixed).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
REGRESSIONS = ROOT / "tests" / "data" / "fuzz_regressions"


def save_regression(case, result, schedule: bool, directory: Path = REGRESSIONS) -> Path:
    """Write a (reduced) failing case where the regression test finds it."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"fuzz_{case.seed}"
    onnx.save(case.model, stem.with_suffix(".onnx"))
    np.savez(stem.with_suffix(".npz"), **case.feeds)
    meta = {
        "seed": case.seed,
        "schedule": schedule,
        "kind": result.kind,
        "detail": result.detail,
        "ops": [n.op_type for n in case.model.graph.node],
        # The test replays it as xfail(strict=True) until the bug is fixed; whoever fixes it
        # deletes this key.
        "xfail": f"{result.kind}: {result.detail}"[:300],
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return stem.with_suffix(".onnx")


def fuzz(
    seed: int, count: int, min_ops: int = 5, max_ops: int = 15, schedule: str = "both",
    reduce: bool = False, max_reduce_per_signature: int = 2, always_unfused: bool = True,
    log=print, log_every: int = 100,
) -> dict:
    """Run seeds ``seed .. seed+count-1``; returns a summary dict."""
    from fusion_tvm.testing.random_onnx import OURS, check_case, random_model, reduce_case

    kinds: collections.Counter = collections.Counter()
    failures = []
    reduced_per_sig: collections.Counter = collections.Counter()
    start, cpu = time.perf_counter(), time.process_time()
    for s in range(seed, seed + count):
        sched = {"on": True, "off": False}.get(schedule, s % 2 == 0)
        case = random_model(s, min_ops, max_ops)
        result = check_case(case, schedule=sched, always_unfused=always_unfused)
        kinds[result.kind] += 1
        if (s - seed + 1) % log_every == 0:
            log(f"... {s - seed + 1} graphs, {dict(kinds)}")
        if result.ok:
            continue
        entry = {"seed": s, "schedule": sched, "kind": result.kind, "detail": result.detail,
                 "nodes": len(case.model.graph.node)}
        log(f"seed {s} (schedule={sched}): {result.kind}: {result.detail}")
        sig = result.signature()
        if reduce and result.kind in OURS and reduced_per_sig[sig] < max_reduce_per_signature:
            reduced_per_sig[sig] += 1
            small = reduce_case(case, sig, check=lambda c, sched=sched: check_case(c, sched))
            final = check_case(small, schedule=sched)
            path = save_regression(small, final, sched)
            entry["reduced_nodes"] = len(small.model.graph.node)
            entry["saved"] = str(path.relative_to(ROOT))
            log(f"  reduced {len(case.model.graph.node)} -> {len(small.model.graph.node)} "
                f"nodes: {path.relative_to(ROOT)}")
        failures.append(entry)
    return {
        "first_seed": seed, "count": count, "ops": [min_ops, max_ops], "schedule": schedule,
        "kinds": dict(kinds), "failures": failures,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--min-ops", type=int, default=5)
    parser.add_argument("--max-ops", type=int, default=15)
    parser.add_argument("--schedule", choices=["both", "on", "off"], default="both",
                        help="our schedule rules on, off, or alternating by seed")
    parser.add_argument("--reduce", action="store_true",
                        help="shrink failures of ours and save them as regression tests")
    parser.add_argument("--lazy-unfused", action="store_true",
                        help="build the unfused reference only when ours disagrees with ORT")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--log-every", type=int, default=100, help="progress line every N graphs")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    summary = fuzz(args.seed, args.count, args.min_ops, args.max_ops, args.schedule,
                   args.reduce, always_unfused=not args.lazy_unfused, log_every=args.log_every)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    from fusion_tvm.testing.random_onnx import OURS

    return 1 if any(f["kind"] in OURS for f in summary["failures"]) else 0


if __name__ == "__main__":
    sys.exit(main())
