"""Check fusion_tvm's CUDA backend on a GPU: build the zoo, compare outputs, time it.

    python benchmarks/gpu_check.py                      # on a GPU machine: build, check, time
    python benchmarks/gpu_check.py --dry-run            # no GPU: build + nvcc only, no runs
    python benchmarks/gpu_check.py --models mlp bert_2l_s16 --hw a100 --out results/x.json

For every model (``name`` or ``name:key=value,...`` as ``benchmarks/run.py`` takes them):

1. **ours**: ``fusion_tvm`` prepare + cost-model fusion (``gpu`` cost model) + CUDA schedule
   rules + VM lowering; in ``--dry-run`` (or with ``--nvcc-check``) the generated CUDA
   source is compiled with nvcc for the preset's arch as a self-check (on a GPU the runtime
   compiles it when the module loads, with nvcc unless cuda-bindings provide NVRTC);
2. **tvm_default**: TVM's own CUDA pipeline on the same Relax module (``LegalizeOps``,
   ``FuseOps``, ``FuseTIR``, dlight's default GPU rules), built and checked the same way;
3. on a GPU: both run on ``tvm.cuda(0)``; outputs are compared with onnxruntime (CPU) on
   the same feeds (the unfused LLVM build when onnxruntime is missing); latency is the
   median of ``--repeat`` synchronised runs after warm-up; PyTorch (eager, CUDA) of the
   same graph is timed too when torch sees a GPU.

A global ``--budget-s`` (default 420 s, so ``gpu_check.sh`` fits 8 minutes) skips the models
left when it runs out, and says so. Exit status: 0 when everything that ran agrees with
onnxruntime, 1 on a mismatch or a failed build, 2 on bad arguments or (without
``--dry-run``) no GPU.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# This TVM compiles CUDA modules when the runtime loads them; NVRTC needs cuda-bindings,
# nvcc only the toolkit. Decide before tvm is imported.
if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")

#: Most informative first: when the time budget runs out, the tail is skipped (and said so).
DEFAULT_MODELS = ["mlp", "bert_2l_s16", "gpt2_2l", "resnet18", "vit_tiny", "mobilenetv2",
                  "detection_head"]
TOLERANCE = {"rtol": 2e-3, "atol": 2e-3}


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def short(e: BaseException, limit: int = 400) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text}"[:limit]


def parse_model(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:key=value,...`` -> (name, kwargs)."""
    name, _, rest = spec.partition(":")
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


def gpu_available() -> bool:
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no driver, no runtime: no GPU
        return False


# ---------------------------------------------------------------------------------- builds
def build_ours(model, hw: str):
    from fusion_tvm.api import build_cuda

    return build_cuda(model, hw=hw)


def build_tvm_default(model, target):
    """TVM's default CUDA pipeline (FuseOps + dlight) on our frontend's Relax module."""
    import tvm
    from tvm import relax

    from fusion_tvm.frontend import load_model
    from fusion_tvm.targets.cuda.build import cuda_source

    loaded = load_model(model)
    mod = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                    relax.transform.CanonicalizeBindings()])(loaded.mod)
    with target:
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=relax.get_default_pipeline(target))
    return executable, cuda_source(executable)


def nvcc_check(source: str, arch: str, workdir: Path) -> float:
    from fusion_tvm.targets.cuda.build import nvcc_compile, nvcc_path

    if nvcc_path() is None:
        raise RuntimeError("nvcc not found: cannot check the generated CUDA source")
    t0 = time.perf_counter()
    nvcc_compile(source, arch, workdir=str(workdir))
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------ runs
def vm_runner(executable, names):
    import tvm
    from tvm import relax

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(executable, dev)
    fn = vm["main"]

    def flatten(v):
        if hasattr(v, "numpy"):
            return [v.numpy()]
        return [a for x in v for a in flatten(x)]

    def run(feeds, fetch=True):
        args = [tvm.runtime.tensor(feeds[n], dev) for n in names]
        out = fn(*args)
        dev.sync()
        return flatten(out) if fetch else None

    def timed(feeds, repeat: int) -> list[float]:
        args = [tvm.runtime.tensor(feeds[n], dev) for n in names]
        for _ in range(3):
            fn(*args)
        dev.sync()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(*args)
            dev.sync()
            times.append(time.perf_counter() - t0)
        return times

    return run, timed


def torch_timer(model, feeds, repeat: int):
    """Median ms of the graph in PyTorch eager on CUDA, or a reason it did not run."""
    try:
        import torch
    except ImportError:
        return None, "torch not importable"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    from benchmarks.zoo.to_torch import to_torch

    module = to_torch(model, {k: v.shape for k, v in feeds.items()}).cuda().eval()
    args = [torch.from_numpy(feeds[n]).cuda() for n in module.input_names]
    with torch.inference_mode():
        for _ in range(3):
            module(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            module(*args)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, ""


def run_ort(model, feeds) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare(outs, ref) -> tuple[bool, float]:
    if len(outs) != len(ref):
        return False, float("inf")
    worst = 0.0
    ok = True
    for a, b in zip(outs, ref, strict=True):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return False, float("inf")
        worst = max(worst, float(np.max(np.abs(a - b))) if a.size else 0.0)
        ok = ok and np.allclose(a, b, **TOLERANCE)
    return ok, worst


# ---------------------------------------------------------------------------------- driver
def check_model(label: str, model, args, arch: str, target, workdir: Path, on_gpu: bool) -> dict:
    from benchmarks import zoo

    row: dict = {"model": label, "ok": True, "errors": []}
    feeds = zoo.example_inputs(model, seed=0)
    names = [i.name for i in model.graph.input if i.name in feeds]

    t0 = time.perf_counter()
    try:
        ours = build_ours(model, args.hw)
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        row["ok"] = False
        row["errors"].append(f"ours build: {short(e)}")
        progress(f"{label}: ours build FAILED: {short(e)}")
        traceback.print_exc()
        return row
    row["ours"] = {"build_s": round(time.perf_counter() - t0, 2), "kernels": ours.num_kernels,
                   "prim_funcs": len(ours.rules),
                   "rules": dict(sorted(_count(ours.rules.values()).items())),
                   "predicted_ms": ours.plan.predicted_time_s * 1e3 if ours.plan else None}
    if args.nvcc_check:
        try:
            row["ours"]["nvcc_s"] = round(
                nvcc_check(ours.source, arch, workdir / label / "ours"), 2)
        except Exception as e:  # noqa: BLE001
            row["ok"] = False
            row["errors"].append(f"ours nvcc: {short(e)}")

    t0 = time.perf_counter()
    try:
        stock_exe, stock_src = build_tvm_default(model, target)
        row["tvm_default"] = {"build_s": round(time.perf_counter() - t0, 2),
                              "kernels": stock_src.count("__global__")}
        if args.nvcc_check:
            row["tvm_default"]["nvcc_s"] = round(
                nvcc_check(stock_src, arch, workdir / label / "tvm_default"), 2)
    except Exception as e:  # noqa: BLE001 - the baseline failing is reported, not fatal
        stock_exe = None
        row.setdefault("tvm_default", {})["error"] = short(e)
    progress(f"{label}: built; ours {row['ours']['kernels']} kernels "
             f"{row['ours']['rules']}, tvm_default {row['tvm_default'].get('kernels')}")
    if not on_gpu:
        return row

    try:
        ref, row["reference"] = run_ort(model, feeds), "onnxruntime (CPU)"
    except ImportError:  # no onnxruntime here: the unfused CPU build of the same model
        import fusion_tvm

        cpu = fusion_tvm.compile(model, target="llvm", hw="host", fusion="none")
        ref, row["reference"] = cpu.run(feeds), "fusion_tvm llvm, unfused"
    for key, exe in (("ours", ours.executable), ("tvm_default", stock_exe)):
        if exe is None:
            continue
        try:
            run, timed = vm_runner(exe, names)
            good, err = compare(run(feeds), ref)
            row[key].update(match=good, max_abs_err=err,
                            latency_ms=statistics.median(timed(feeds, args.repeat)) * 1e3)
            if not good:
                row["ok"] = row["ok"] and key != "ours"
                row["errors"].append(
                    f"{key}: outputs differ from {row['reference']} (max {err:.3g})")
        except Exception as e:  # noqa: BLE001
            row[key]["error"] = short(e)
            if key == "ours":
                row["ok"] = False
                row["errors"].append(f"ours run: {short(e)}")
    try:
        ms, why = torch_timer(model, feeds, args.repeat)
        row["torch_eager_cuda"] = {"latency_ms": ms} if ms is not None else {"skipped": why}
    except Exception as e:  # noqa: BLE001
        row["torch_eager_cuda"] = {"error": short(e)}
    lat = {k: row.get(k, {}).get("latency_ms") for k in ("ours", "tvm_default",
                                                          "torch_eager_cuda")}
    progress(f"{label}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in lat.items() if v))
    return row


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def table(rows: list[dict]) -> str:
    head = f"{'model':28s} {'ok':3s} {'k.ours':>6s} {'k.tvm':>6s} {'ours ms':>9s} " \
           f"{'tvm ms':>9s} {'torch ms':>9s} {'speedup':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        o, t, p = r.get("ours", {}), r.get("tvm_default", {}), r.get("torch_eager_cuda", {})

        def ms(d):
            v = d.get("latency_ms")
            return f"{v:9.3f}" if v else f"{'-':>9s}"

        sp = (f"{t['latency_ms'] / o['latency_ms']:7.2f}x"
              if o.get("latency_ms") and t.get("latency_ms") else f"{'-':>8s}")
        lines.append(f"{r['model']:28s} {'yes' if r['ok'] else 'NO':3s} "
                     f"{o.get('kernels', '-')!s:>6s} {t.get('kernels', '-')!s:>6s} "
                     f"{ms(o)} {ms(t)} {ms(p)} {sp}")
        for e in r.get("errors", []):
            lines.append(f"    ! {e}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=None,
                   help=f"zoo models (default: {' '.join(DEFAULT_MODELS)})")
    p.add_argument("--hw", default="h100", help="hardware preset (a100, h100, h200)")
    p.add_argument("--small", action="store_true", help="test-sized variants of the models")
    p.add_argument("--dry-run", action="store_true",
                   help="build and nvcc-check only; no GPU needed, nothing runs")
    p.add_argument("--nvcc-check", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the generated source with nvcc for the arch (default: on in "
                   "--dry-run; on a GPU the runtime compiles it when the module loads)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="skip the models left once this many seconds have passed")
    p.add_argument("--out", default="benchmarks/results/gpu_check.json")
    p.add_argument("--workdir", default=None, help="where nvcc inputs/outputs go")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.nvcc_check is None:
        args.nvcc_check = args.dry_run
    start = time.perf_counter()
    from benchmarks import zoo
    from fusion_tvm.cost_models import get_hardware
    from fusion_tvm.targets import get_backend

    try:
        hw = get_hardware(args.hw)
        if hw.gpu is None:
            raise ValueError(f"'{args.hw}' is not a GPU preset")
        specs = [parse_model(m) for m in (args.models or DEFAULT_MODELS)]
        for name, _ in specs:
            zoo.get_spec(name)
    except (KeyError, ValueError) as e:
        print(f"gpu_check: {short(e)}", file=sys.stderr)
        return 2
    on_gpu = not args.dry_run and gpu_available()
    if not args.dry_run and not on_gpu:
        print("gpu_check: no CUDA device visible (use --dry-run to build only)", file=sys.stderr)
        return 2
    target = get_backend("cuda").target(hw)
    arch = hw.gpu.arch
    workdir = Path(args.workdir or os.environ.get("TMPDIR", "/tmp")) / "fusion_tvm_gpu_check"
    info = {"hw": args.hw, "arch": arch, "dry_run": args.dry_run, "on_gpu": on_gpu,
            "compile_mode": os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc"),
            "host": platform.node(), "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    rows = []
    for name, kwargs in specs:
        label = name + (":" + ",".join(f"{k}={v}" for k, v in kwargs.items()) if kwargs else "")
        if time.perf_counter() - start > args.budget_s:
            rows.append({"model": label, "ok": True, "skipped": "time budget spent",
                         "errors": []})
            progress(f"{label}: skipped (budget {args.budget_s:.0f} s spent)")
            continue
        progress(f"{label}: building for {args.hw} ({arch})")
        try:
            model = zoo.get_model(name, small=args.small, **kwargs)
            rows.append(check_model(label, model, args, arch, target, workdir, on_gpu))
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, not fatal
            traceback.print_exc()
            rows.append({"model": label, "ok": False, "errors": [short(e)]})
        _write(args.out, info, rows, start)
    _write(args.out, info, rows, start)
    print(table(rows))
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f} s)")
    return 0 if all(r["ok"] for r in rows) else 1


def _write(path: str, info: dict, rows: list[dict], start: float) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"info": {**info, "elapsed_s": round(time.perf_counter() - start, 1)}, "models": rows}
    out.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
