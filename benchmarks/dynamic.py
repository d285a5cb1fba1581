"""One dynamic build vs builds specialised per size, and vs onnxruntime.

    python benchmarks/dynamic.py [--models bert_2l:S:1,16,77,128 resnet18:N:1,3,8] [--repeat 20]

For each model the symbolic dim is compiled once (``shape_hints`` = the range of sizes) and,
for every size, a static build is made with that dim fixed. All builds use our fusion and
schedules; the three contenders run interleaved per size (median of ``--repeat``).
Writes benchmarks/results/dynamic.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import fusion_tvm  # noqa: E402
from benchmarks.zoo import example_inputs, get_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="*",
                    default=["bert_2l:S:1,16,77,128", "gpt2_2l:S:1,16,77,128",
                             "resnet18:N:1,3,8"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dynamic.json"))
    args = ap.parse_args()
    import onnxruntime as ort

    threads = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    print(f"machine: {os.cpu_count()} cores, {threads} thread(s) for TVM and onnxruntime")
    rows = []
    for spec in args.models:
        name, dim, sizes = spec.split(":")
        sizes = [int(s) for s in sizes.split(",")]
        other = {"N": 1} if dim == "S" else {}
        model = get_model(name, small=args.small, dynamic=True)
        print(f"[{name}] dynamic build", file=sys.stderr, flush=True)
        dyn = fusion_tvm.compile(model, shape_hints={dim: (min(sizes), max(sizes)), **other})
        sess = ort.InferenceSession(model.SerializeToString(), opts)
        for size in sizes:
            dims = {dim: size, **other}
            shape_dict = {}
            for inp in model.graph.input:
                shape_dict[inp.name] = [
                    dims.get(d.dim_param, d.dim_value) if d.dim_param else d.dim_value
                    for d in inp.type.tensor_type.shape.dim
                ]
            print(f"[{name}] static build {dim}={size}", file=sys.stderr, flush=True)
            static = fusion_tvm.compile(model, shape_dict=shape_dict)
            feeds = example_inputs(model, seed=size, **dims)
            contenders = {
                "dynamic": lambda f=feeds, d=dyn: d.run(f),
                "static": lambda f=feeds, s=static: s.run(f),
                "onnxruntime": lambda f=feeds, o=sess: o.run(None, f),
            }
            ref = sess.run(None, feeds)
            err = max(float(np.abs(a - b).max()) for a, b in zip(dyn.run(feeds), ref,
                                                                   strict=True))
            times = {k: [] for k in contenders}
            for fn in contenders.values():
                fn()
            for _ in range(args.repeat):
                for k, fn in contenders.items():
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append({"model": name, "dim": dim, "size": size, **{f"{k}_ms": v for k, v in
                         med.items()}, "dynamic_over_static": med["dynamic"] / med["static"],
                         "dynamic_over_ort": med["dynamic"] / med["onnxruntime"],
                         "max_abs_err_vs_ort": err, "repeat": args.repeat, "threads": threads})
    print(f"\n{'model':<10} {'size':>8} {'dynamic ms':>10} {'static ms':>10} {'ort ms':>8} "
          f"{'dyn/static':>10} {'dyn/ort':>8} {'err':>8}")
    for r in rows:
        print(f"{r['model']:<10} {r['dim']}={r['size']:<6} {r['dynamic_ms']:>10.2f} "
              f"{r['static_ms']:>10.2f} {r['onnxruntime_ms']:>8.2f} "
              f"{r['dynamic_over_static']:>10.2f} {r['dynamic_over_ort']:>8.2f} "
              f"{r['max_abs_err_vs_ort']:>8.1e}")
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
