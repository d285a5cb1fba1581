"""Prediction accuracy of the cost model over the model zoo.

``python benchmarks/prediction.py`` calibrates this machine (``fusion_tvm.calibration``,
quick mode; ``--hw spec.json`` reuses a spec), compiles every zoo model (small variants;
``--full`` for the real sizes) with the calibrated spec, times every kernel alone and both
whole models (ours and FuseOps's partition, same schedules, interleaved), prints a table and
writes ``benchmarks/results/prediction.json``: per-kernel Spearman rank correlation and median
absolute percentage error, and predicted vs measured speedup over FuseOps per model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "prediction.json"
MODELS = ["mlp", "detection_head", "resnet18", "bert_2l", "bert_2l_s16", "gpt2_2l",
          "mobilenetv2", "vit_tiny"]


def main(argv=None) -> int:
    from fusion_tvm.calibration import calibrate_full, make_runner
    from fusion_tvm.calibration._timing import TimingConfig
    from fusion_tvm.calibration.micro import measure_call
    from fusion_tvm.calibration.report import zoo_report
    from fusion_tvm.presets import get_hardware

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--full", action="store_true", help="real model sizes (slow)")
    ap.add_argument("--hw", help="calibrated spec JSON to use instead of calibrating now")
    ap.add_argument("--thorough", action="store_true", help="thorough calibration")
    ap.add_argument("--transcendental", action="store_true",
                    help="calibrate the transcendental peak as well")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved whole-model rounds")
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per kernel")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # Kernels of a few us: each repetition loops the kernel for >= 5 ms; the least disturbed
    # of 15 repetitions is kept, by calibration and kernel timing alike (the median follows
    # the load; both sides timed the same way see the same machine).
    timing = TimingConfig(repeat=args.reps, min_repeat_ms=5.0, statistic="min")
    start = time.perf_counter()
    calibration = None
    if args.hw:
        spec = get_hardware(args.hw)
        runner = make_runner(spec, timing=timing)
        call_s = measure_call(runner)
    else:
        calibration = calibrate_full("host", thorough=args.thorough, log=log,
                                     transcendental=args.transcendental, timing=timing)
        spec, call_s = calibration.spec, calibration.call_s
        runner = make_runner(spec, timing=timing)
    cal_s = time.perf_counter() - start
    report = zoo_report(args.models, spec, runner, call_s, small=not args.full,
                        rounds=args.rounds, log=log)
    print(report.table())
    out = report.to_json()
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg"] = os.getloadavg()
    out["calibration_s"] = cal_s
    out["total_s"] = time.perf_counter() - start
    out["small"] = not args.full
    out["command"] = " ".join(["python", "benchmarks/prediction.py", *(argv or sys.argv[1:])])
    if calibration is not None:
        out["calibration"] = calibration.to_json()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {path} ({out['total_s']:.0f} s, load average {out['load_avg']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
