"""What optional tuning adds over the untuned default: tune, then time default vs tuned.

    python benchmarks/tuning.py [--models resnet18 mobilenetv2 bert_base] [--trials 12]
                                [--repeat 20] [--threads 2]

For every model: :func:`fusion_tvm.tune` measures each kernel's knobs (the rules' own
choice against up to ``--trials`` candidates) into a database under the output folder; then
the untuned build, the tuned build and onnxruntime run interleaved in one process (median
of ``--repeat`` rounds of 3 runs each, a 0.3 s pause between contenders). Prints a table and writes
benchmarks/results/tuning.json. The default path never needs tuning: this shows how far
the derived knobs are from measured ones, kernel by kernel and end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ["resnet18", "mobilenetv2", "bert_base"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--trials", type=int, default=12, help="candidates per kernel")
    ap.add_argument("--repeat", type=int, default=20, help="interleaved rounds")
    ap.add_argument("--threads", type=int, default=None, help="threads for every contender")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--reuse", action="store_true",
                    help="start from the databases a previous run left (records improve)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    threads = args.threads or len(os.sched_getaffinity(0))
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import numpy as np
    import onnxruntime as ort

    import fusion_tvm
    from benchmarks.zoo import example_inputs, get_model
    from fusion_tvm.tuning import tune

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        model = get_model(name)
        feeds = example_inputs(model)
        db = args.out / f"tuning_{name}.json"
        if db.exists() and not args.reuse:
            db.unlink()
        report = tune(model, db, trials=args.trials)
        default = fusion_tvm.compile(model)
        tuned = fusion_tvm.compile(model, tuning_db=db)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)[0]
        err = max(float(np.abs(c.run(feeds)[0] - ref).max() / (np.abs(ref).max() or 1))
                  for c in (default, tuned))
        runs = {"default": lambda c=default, f=feeds: c.run(f),
                "tuned": lambda c=tuned, f=feeds: c.run(f),
                "onnxruntime": lambda s=sess, f=feeds: s.run(None, f)}
        times = {k: [] for k in runs}
        for _ in range(args.repeat):
            for key, fn in runs.items():
                fn()
                for _ in range(3):
                    t = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - t)
                time.sleep(0.3)  # let this runtime's spinning workers park
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        kernels = report.kernels
        row = {
            "model": name, "kernels_tuned": sum(k.status == "tuned" for k in kernels),
            "kernels_measured": len(kernels), "tuning_s": round(report.seconds, 1),
            "kernels_alone_default_ms": sum(k.default_us for k in kernels) / 1e3,
            "kernels_alone_tuned_ms": sum(k.best_us for k in kernels) / 1e3,
            "default_ms": med["default"], "tuned_ms": med["tuned"],
            "onnxruntime_ms": med["onnxruntime"], "max_rel_err": err,
            "tuned_speedup": med["default"] / med["tuned"],
        }
        rows.append(row)
        print(f"{name}: tuned {row['kernels_tuned']}/{row['kernels_measured']} kernels in "
              f"{row['tuning_s']} s; default {med['default']:.2f} ms, tuned {med['tuned']:.2f}, "
              f"onnxruntime {med['onnxruntime']:.2f}", flush=True)
    head = ("| model | kernels tuned | tuning s | kernels alone ms (default -> tuned) | "
            "default ms | tuned ms | onnxruntime ms | tuned / default |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['kernels_tuned']}/{r['kernels_measured']} | {r['tuning_s']} | "
            f"{r['kernels_alone_default_ms']:.2f} -> {r['kernels_alone_tuned_ms']:.2f} | "
            f"{r['default_ms']:.2f} | {r['tuned_ms']:.2f} | {r['onnxruntime_ms']:.2f} | "
            f"{r['tuned_ms'] / r['default_ms']:.3f} |")
    print("\n".join(lines))
    info = {"machine": platform.processor() or platform.machine(), "threads": threads,
            "trials": args.trials, "repeat": args.repeat, "date": time.strftime("%Y-%m-%d")}
    (args.out / "tuning.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
