"""Prediction accuracy of the cost model over the model zoo or the real-model benchmark.

``python benchmarks/prediction.py`` calibrates this machine (``fusion_tvm.calibration``,
quick mode; ``--hw spec.json`` reuses a spec), compiles every zoo model (small variants;
``--full`` for the real sizes) with the calibrated spec, times every kernel alone and both
whole models (ours and FuseOps's partition, same schedules, interleaved), prints a table and
writes ``benchmarks/results/prediction.json``: per-kernel Spearman rank correlation and median
absolute percentage error, and predicted vs measured total and speedup over FuseOps per model.

``--real NAME ...`` does the same over ``benchmarks/real_models.py``'s registry instead of the
zoo (``--real all``, ``--real held_out`` or ``--real tuned`` for the whole registry, the models
kept out of tuning, or the rest), with the ONNX files that script exported (exported here
when missing) and ``benchmarks/results/prediction_real.json`` as the default output, written
after every model. A model that fails is listed and the next one taken.
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
RESULTS_REAL = ROOT / "benchmarks" / "results" / "prediction_real.json"
GROUPS = ("all", "held_out", "tuned")  # --real selections besides model names
MODELS = ["mlp", "detection_head", "resnet18", "bert_2l", "bert_2l_s16", "gpt2_2l",
          "mobilenetv2", "vit_tiny"]


def real_names(selection: list[str], specs: dict) -> list[str]:
    """Registry names of ``--real``'s words (``all``, ``held_out``, ``tuned`` or names), in
    order, each once."""
    names: list[str] = []
    for word in selection:
        if word == "all":
            names += list(specs)
        elif word == "held_out":
            names += [n for n, s in specs.items() if s.held_out]
        elif word == "tuned":
            names += [n for n, s in specs.items() if not s.held_out]
        elif word in specs:
            names.append(word)
        else:
            raise SystemExit(f"unknown real model '{word}': one of {', '.join(GROUPS)} or a "
                             f"name of `python benchmarks/real_models.py --list`")
    return list(dict.fromkeys(names))


def real_items(names: list[str], specs: dict, failed: dict[str, str]):
    """``(name, onnx model, feeds)`` of each real model, one at a time; a model that does not
    export goes to ``failed``."""
    from benchmarks.real_models import OUT, export

    for name in names:
        try:
            model, feeds = export(name, specs[name], OUT / "onnx")
        except Exception as err:  # noqa: BLE001 - an exporter / library failure, not ours
            failed[name] = f"export failed: {type(err).__name__}: {err}".splitlines()[0]
            log(f"{name}: {failed[name]}")
            continue
        yield name, model, feeds


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=MODELS, help="zoo models")
    ap.add_argument("--real", nargs="+", metavar="NAME",
                    help="real-model benchmark instead of the zoo: registry names, or "
                         f"{', '.join(GROUPS)}")
    ap.add_argument("--full", action="store_true", help="real zoo model sizes (slow)")
    ap.add_argument("--hw", help="calibrated spec JSON to use instead of calibrating now")
    ap.add_argument("--thorough", action="store_true", help="thorough calibration")
    ap.add_argument("--transcendental", action="store_true",
                    help="calibrate the transcendental peak as well")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved whole-model rounds")
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per kernel")
    ap.add_argument("--out", type=Path,
                    help=f"JSON output (default {RESULTS.relative_to(ROOT)}; with --real "
                         f"{RESULTS_REAL.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    args.out = args.out or (RESULTS_REAL if args.real else RESULTS)
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def calibrate(args):
    """``(spec, runner, call_s, calibration)``: the spec of ``--hw`` (calibration None), or
    this machine calibrated now."""
    from fusion_tvm.calibration import calibrate_full, make_runner
    from fusion_tvm.calibration._timing import TimingConfig
    from fusion_tvm.calibration.micro import measure_call
    from fusion_tvm.presets import get_hardware

    # Kernels of a few us: each repetition loops the kernel for >= 5 ms; the least disturbed
    # of 15 repetitions is kept, by calibration and kernel timing alike (the median follows
    # the load; both sides timed the same way see the same machine).
    timing = TimingConfig(repeat=args.reps, min_repeat_ms=5.0, statistic="min")
    if args.hw:
        spec = get_hardware(args.hw)
        runner = make_runner(spec, timing=timing)
        return spec, runner, measure_call(runner), None
    calibration = calibrate_full("host", thorough=args.thorough, log=log,
                                 transcendental=args.transcendental, timing=timing)
    runner = make_runner(calibration.spec, timing=timing)
    return calibration.spec, runner, calibration.call_s, calibration


def main(argv=None) -> int:
    from fusion_tvm.calibration.report import models_report, zoo_report

    args = parse_args(argv)
    if args.real:
        from benchmarks.real_models import registry

        specs = registry()
        names = real_names(args.real, specs)
    start = time.perf_counter()
    spec, runner, call_s, calibration = calibrate(args)
    cal_s = time.perf_counter() - start

    def write(report) -> dict:
        out = report.to_json()
        out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out["load_avg"] = os.getloadavg()
        out["calibration_s"] = cal_s
        out["total_s"] = time.perf_counter() - start
        out["small"] = not args.full and not args.real
        out["real"] = bool(args.real)
        out["command"] = " ".join(["python", "benchmarks/prediction.py",
                                   *(sys.argv[1:] if argv is None else argv)])
        if calibration is not None:
            out["calibration"] = calibration.to_json()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
        return out

    if args.real:
        export_failed: dict[str, str] = {}

        def save(report):  # after every model: a long run that stops keeps what it measured
            report.failed.update(export_failed)
            write(report)

        report = models_report(real_items(names, specs, export_failed), spec, runner, call_s,
                               rounds=args.rounds, log=log,
                               held_out={n for n in names if specs[n].held_out},
                               keep_going=True, on_model=save)
        report.failed.update(export_failed)
    else:
        report = zoo_report(args.models, spec, runner, call_s, small=not args.full,
                            rounds=args.rounds, log=log)
    print(report.table())
    out = write(report)
    print(f"wrote {args.out} ({out['total_s']:.0f} s, load average {out['load_avg']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
