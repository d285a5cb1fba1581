"""Benchmark fusion_tvm against FuseOps, stock TVM, onnxruntime and PyTorch on the model zoo.

    python benchmarks/run.py --quick                       # CI: small models, checks numerics
    python benchmarks/run.py --models resnet18 bert_2l:batch=8,seq=64 --threads 2 --repeat 50

A model is ``name`` or ``name:key=value,...`` (keywords of ``benchmarks.zoo.get_model``,
e.g. ``small=True``). Every contender runs on the same feeds with the same thread count; runs are
interleaved (round robin, rotating the order) so drifting machine load hits all contenders alike.
Exit status: 0 when every contender that ran agrees with onnxruntime, 1 on a mismatch or a
failed compile, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow ``python benchmarks/run.py`` from anywhere
    sys.path.insert(0, str(ROOT))

DEFAULT_SUITE = ["mlp", "detection_head", "resnet18", "resnet18:batch=8",
                 "resnet18:dynamic=True,batch=4", "resnet50", "mobilenetv2", "bert_2l_s16",
                 "bert_2l", "bert_2l:batch=8", "bert_2l:dynamic=True,seq=77", "bert_base",
                 "gpt2_2l", "gpt2", "vit_tiny"]
# --quick: realistic operator mix at dimensions that compile and run in seconds on 2 cores.
QUICK_SUITE = ["mlp", "detection_head", "resnet18:image=64,width=16",
               "bert_2l_s16:hidden=256,heads=4,ffn=1024,vocab=1000",
               "gpt2_2l:hidden=256,heads=4,seq=32,vocab=1000,max_pos=64"]
CONTENDERS = ["ours", "ours_nchw", "fuseops", "stock_tvm", "onnxruntime", "torch_eager",
              "torch_compile"]
OPT_IN = {"ours_nchw"}  # ablations: only when named in --contenders
REFERENCE = "onnxruntime"
STOCK_LIMIT_S = 1.0  # stock TVM is not timed when one run takes longer than this


#: Pause before each contender's turn (the previous contender's thread pool goes idle).
SETTLE_S = 0.5
#: Samples a contender takes back to back in one turn.
BLOCK = 5
#: A timed sample is this long at least: short models run back to back k times a sample.
SAMPLE_S = 0.005
MAX_INNER = 200

def short(e: BaseException, limit: int = 240) -> str:
    """One line for a report: the exception type and its non-empty lines, joined."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text}"[:limit]


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- contenders
class Skipped(Exception):  # noqa: N818 - a reason, not an error
    """A contender that cannot run here (missing package, model too big); not a failure."""


@dataclass
class Context:
    threads: int
    target: str
    hw: str | None = None  # fusion_tvm hardware preset (None: the backend's default, "host")
    shape_hints: dict | None = None  # sizes of symbolic dims, for dynamic models


@dataclass
class Prepared:
    """A compiled contender: ``run(feeds)`` returns the outputs as numpy arrays."""

    run: Callable[[dict], list]
    compile_s: float
    kernels: int | None = None
    plan: object | None = None
    note: str = ""
    coverage: dict | None = None


def _numpy_list(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() if hasattr(o, "numpy") else np.asarray(o) for o in out]


def _fusion_tvm(fusion: str, layout: str | None = None):
    def prepare(model, feeds, ctx: Context) -> Prepared:
        import fusion_tvm

        if not hasattr(fusion_tvm, "compile"):
            raise Skipped("fusion_tvm.compile is not available in this checkout")
        target = ctx.target
        if layout is not None:  # ours_nchw: the LLVM backend without the NCHWc conv layout
            if ctx.target != "llvm":
                raise Skipped("layout options are for the llvm target")
            from fusion_tvm.targets.llvm_cpu import LLVMCPUBackend

            target = LLVMCPUBackend(layout=layout)
        t0 = time.perf_counter()
        cm = fusion_tvm.compile(model, target=target, hw=ctx.hw, fusion=fusion,
                                shape_hints=ctx.shape_hints)
        dt = time.perf_counter() - t0
        return Prepared(lambda feeds: list(cm.run(feeds)), dt, cm.num_kernels,
                        getattr(cm, "plan", None), coverage=rule_coverage(cm))

    return prepare


def rule_coverage(cm) -> dict | None:
    """Share of the model's (modeled) FLOPs in kernels that a template rule, not the
    fallback, scheduled; FLOPs by rule."""
    from tvm import tirx

    from fusion_tvm.passes.apply_target_schedule import RULE_ATTR

    plan = getattr(cm, "plan", None)
    if plan is None or not plan.groups:
        return None
    rules = {gv.name_hint: str(f.attrs[RULE_ATTR])
             for gv, f in cm.fused_mod.functions.items()
             if isinstance(f, tirx.PrimFunc) and f.attrs and RULE_ATTR in f.attrs}
    by_rule: dict[str, float] = {}
    for g in plan.groups:
        rule = rules.get(g.kernel, "unscheduled")
        by_rule[rule] = by_rule.get(rule, 0.0) + g.flops
    total = sum(by_rule.values())
    bad = by_rule.get("fallback", 0.0) + by_rule.get("unscheduled", 0.0)
    return {"template_share": 1.0 - bad / total if total else 1.0, "flops_by_rule": by_rule}


def stock_target(ctx: Context):
    """The LLVM target the fusion_tvm contenders get (host ``-mcpu``), so stock TVM is not
    handicapped by plain ``llvm`` (generic x86-64, no AVX)."""
    import tvm

    if ctx.target != "llvm":
        return tvm.target.Target(ctx.target)
    try:
        from fusion_tvm import get_hardware

        return tvm.target.Target(dict(get_hardware(ctx.hw or "host").target))
    except Exception:  # fusion_tvm's presets missing or broken: the host CPU by LLVM's name
        from tvm.target import codegen

        return tvm.target.Target({"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu())})


def stock_tvm(model, feeds, ctx: Context) -> Prepared:
    """Plain TVM: ``from_onnx`` -> ``zero`` pipeline (FuseOps) -> ``tvm.compile``, untuned."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from fusion_tvm.api import tvm_noise_filtered

    t0 = time.perf_counter()
    target = stock_target(ctx)
    with target, tvm_noise_filtered():  # TOPI's "Fast mode segfaults" note per gather
        mod = relax.get_pipeline("zero")(from_onnx(model))
        vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    dt = time.perf_counter() - t0
    names = _input_names(model)
    fn = vm["main"]
    return Prepared(lambda feeds: _numpy_list(fn(*[tvm.runtime.tensor(feeds[n]) for n in names])),
                    dt, count_call_tir(mod))


def onnxruntime(model, feeds, ctx: Context) -> Prepared:
    """onnxruntime CPU with default options except the intra-op thread count."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise Skipped("onnxruntime not importable") from None
    t0 = time.perf_counter()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = ctx.threads
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return Prepared(lambda feeds: sess.run(None, feeds), time.perf_counter() - t0)


def _torch_module(model, feeds, ctx: Context):
    try:
        import torch
    except ImportError:
        raise Skipped("torch not importable") from None
    from benchmarks.zoo.to_torch import to_torch

    torch.set_num_threads(ctx.threads)
    return torch, to_torch(model, {k: v.shape for k, v in feeds.items()})


def _torch_runner(torch, module, names):
    def run(feeds):
        with torch.inference_mode():
            outs = module(*[torch.from_numpy(feeds[n]) for n in names])
        return [o.numpy() for o in outs]

    return run


def torch_eager(model, feeds, ctx: Context) -> Prepared:
    """The ONNX graph executed op by op with torch (``benchmarks.zoo.to_torch``)."""
    t0 = time.perf_counter()
    torch, module = _torch_module(model, feeds, ctx)
    return Prepared(_torch_runner(torch, module, module.input_names), time.perf_counter() - t0)


def torch_compile(model, feeds, ctx: Context) -> Prepared:
    """``torch.compile(dynamic=False)`` (inductor) of the same module; compile_s includes the
    first call, where compilation happens. If inductor's pattern matcher (its SDPA rewrite)
    breaks the build, retry without it and say so."""
    import_start = time.perf_counter()
    torch, module = _torch_module(model, feeds, ctx)
    import torch._inductor.config as inductor_config

    note = ""
    for patch in ({}, {"pattern_matcher": False}):
        torch._dynamo.reset()
        compiled = torch.compile(module, dynamic=False)
        run = _torch_runner(torch, compiled, module.input_names)
        try:
            with inductor_config.patch(patch):
                run(feeds)
            break
        except Exception as e:
            if patch:
                raise
            note = f"inductor pattern_matcher disabled; the default build failed: {short(e)}"
    return Prepared(run, time.perf_counter() - import_start, note=note)


PREPARE: dict[str, Callable] = {
    "ours": _fusion_tvm("cost"),
    "ours_nchw": _fusion_tvm("cost", layout="native"),
    "fuseops": _fusion_tvm("fuseops"),
    "stock_tvm": stock_tvm,
    "onnxruntime": onnxruntime,
    "torch_eager": torch_eager,
    "torch_compile": torch_compile,
}


# ---------------------------------------------------------------------------- kernel counts
def _input_names(model) -> list[str]:
    init = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in init]


def count_call_tir(mod) -> int:
    """Kernels launched by ``main``: its ``call_tir`` bindings."""
    import tvm
    from tvm import relax

    call_tir = {tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace")}
    n = 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and any(b.value.op.same_as(op) for op in call_tir):
                n += 1
    return n


def stock_kernel_counts(model) -> dict[str, int]:
    """Kernel count of the model one op per kernel, and after TVM's FuseOps (no build)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    T = relax.transform  # noqa: N806
    mod = from_onnx(model)
    mod = T.LegalizeOps()(T.DecomposeOpsForInference()(mod))
    mod = T.FoldConstant()(T.AnnotateTIROpPattern()(mod))
    unfused = count_call_tir(mod)
    fused = T.DeadCodeElimination()(T.FuseTIR()(T.FuseOps()(mod)))
    return {"unfused": unfused, "fuseops": count_call_tir(fused)}


def layout_conversions(plan) -> dict | None:
    """Activation layout conversions (NCHW <-> NCHWc) executed per run: ``ops`` in all,
    ``alone`` of them in kernels of their own (the rest fused into a neighbour's kernel)."""
    if plan is None or not getattr(plan, "groups", None):
        return None
    ops = alone = 0
    for g in plan.groups:
        n = sum(1 for f in g.prim_funcs if f.startswith(("to_nchwc", "to_nchw")))
        ops += n
        alone += int(n > 0 and n == len(g.prim_funcs))
    return {"ops": ops, "alone": alone}


# ---------------------------------------------------------------------------- measurement
@dataclass
class Result:
    name: str
    status: str = "ok"  # ok | skipped | failed | mismatch
    note: str = ""
    compile_s: float | None = None
    kernels: int | None = None
    times_s: list = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    def stat(self, fn) -> float | None:
        return fn(self.times_s) if self.times_s else None


def errors(outs, ref) -> tuple[float, float]:
    """Max abs error, and max abs error relative to the reference's largest magnitude."""
    if len(outs) != len(ref):
        return float("inf"), float("inf")
    abs_err, rel_err = 0.0, 0.0
    for got, want in zip(outs, ref, strict=True):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            return float("inf"), float("inf")
        e = float(np.abs(got - want).max()) if got.size else 0.0
        abs_err = max(abs_err, e)
        rel_err = max(rel_err, e / max(float(np.abs(want).max()) if want.size else 0.0, 1e-12))
    return abs_err, rel_err


def runs_per_sample(run: Callable[[], object]) -> int:
    """Back-to-back runs per sample, so that a sample lasts >= SAMPLE_S: a model of a few
    microseconds is timed warm, not after each settle pause (cold caches, sleeping worker
    threads, a core clocked down). Times one call of ``run``."""
    t0 = time.perf_counter()
    run()
    return max(1, min(MAX_INNER, math.ceil(SAMPLE_S / max(time.perf_counter() - t0, 1e-7))))


def time_interleaved(runs: dict[str, Callable[[], object]], inner: dict[str, int], repeat: int,
                     block: int = BLOCK, settle_s: float = SETTLE_S, budget_s: float = math.inf,
                     min_repeat: int = 0, warm_turn: bool = False) -> dict[str, list[float]]:
    """Samples of each of ``runs`` (seconds a call: the mean of ``inner[name]`` calls),
    ``repeat`` each unless ``budget_s`` runs out after ``min_repeat``.

    Round robin with a rotating order, ``block`` samples a turn (after one untimed call with
    ``warm_turn``). Between turns the previous contender's thread pool must go idle: TVM's
    workers spin-wait for a while after a run, and onnxruntime timed 50 ms after a TVM run
    took 65 ms instead of 19 (ResNet-18, 2 threads); after 0.5 s it is back to 19.
    """
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    taken = r = 0
    while taken < repeat:
        if taken >= min_repeat and time.perf_counter() - start > budget_s:
            break
        n = min(block, repeat - taken)
        k = r % max(len(names), 1)
        for name in names[k:] + names[:k]:
            time.sleep(settle_s)
            run, inner_k = runs[name], inner[name]
            if warm_turn:
                run()
            for _ in range(n):
                t0 = time.perf_counter()
                for _ in range(inner_k):
                    run()
                times[name].append((time.perf_counter() - t0) / inner_k)
        taken += n
        r += 1
    return times


def bench_model(label: str, model, feeds, contenders, ctx: Context, args) -> dict:
    results: dict[str, Result] = {}
    prepared: dict[str, Prepared] = {}
    plan = coverage = None
    for name in contenders:
        res = results[name] = Result(name)
        progress(f"{label}: compiling {name}")
        try:
            p = PREPARE[name](model, feeds, ctx)
        except Skipped as e:
            res.status, res.note = "skipped", str(e)
            progress(f"{label}: {name} skipped: {e}")
            continue
        except Exception as e:  # a contender that fails to build is reported, not fatal
            res.status, res.note = "failed", short(e, 300)
            progress(f"{label}: {name} FAILED: {res.note}")
            continue
        res.compile_s, res.kernels, res.note = p.compile_s, p.kernels, p.note
        if name == "ours":
            plan = p.plan
            coverage = p.coverage
        prepared[name] = p

    # Warm-up: the first call also gives the outputs checked against the reference.
    outputs = {}
    inner: dict[str, int] = {}
    for name, p in list(prepared.items()):
        progress(f"{label}: warm-up {name}")
        try:
            t0 = time.perf_counter()
            outputs[name] = p.run(feeds)
            first = time.perf_counter() - t0
            if name == "stock_tvm" and first > STOCK_LIMIT_S and not args.time_stock_anyway:
                results[name].note = f"not timed: one run took {first:.1f} s (> {STOCK_LIMIT_S} s)"
                del prepared[name]
                continue
            for _ in range(args.warmup - 1):
                p.run(feeds)
            inner[name] = runs_per_sample(lambda p=p: p.run(feeds))
        except Exception as e:
            results[name].status = "failed"
            results[name].note = "run: " + short(e, 300)
            del prepared[name]

    ref_name = REFERENCE if REFERENCE in outputs else next(iter(outputs), None)
    for name, outs in outputs.items():
        if ref_name is None or name == ref_name:
            continue
        res = results[name]
        res.max_abs_err, res.max_rel_err = errors(outs, outputs[ref_name])
        if not res.max_rel_err <= args.rtol:
            res.status = "mismatch"
            res.note = (f"max rel err {res.max_rel_err:.2e} vs {ref_name} > {args.rtol:g}; "
                        + res.note).rstrip("; ")

    progress(f"{label}: timing {', '.join(prepared)} x {args.repeat}")
    times = time_interleaved({name: (lambda p=p: p.run(feeds)) for name, p in prepared.items()},
                             inner, args.repeat, budget_s=args.budget_s,
                             min_repeat=args.min_repeat)
    for name, samples in times.items():
        results[name].times_s.extend(samples)
    taken = min((len(t) for t in times.values()), default=args.repeat)
    if taken < args.repeat:
        progress(f"{label}: time budget {args.budget_s:g} s reached after {taken} samples")

    row = {"model": label, "reference": ref_name, "runs_per_sample": inner,
           "coverage": coverage,
           "contenders": {n: asdict(r) for n, r in results.items()}}
    try:  # stock TVM's import, for reference: its own op set, BatchNorm not folded
        from fusion_tvm.api import tvm_noise_filtered

        with tvm_noise_filtered():  # TOPI's "Fast mode segfaults" note per gather otherwise
            counts = stock_kernel_counts(model)
        row["kernels"] = {f"stock_{k}": v for k, v in counts.items()}
    except Exception as e:
        row["kernels"] = {"error": short(e)}
    if plan is not None:  # one definition everywhere: kernels the built module launches
        row["kernels"]["unfused"] = plan.unfused_kernels
    if "fuseops" in results and results["fuseops"].kernels is not None:
        row["kernels"]["fuseops"] = results["fuseops"].kernels
    if "ours" in results and results["ours"].kernels is not None:
        row["kernels"]["ours"] = results["ours"].kernels
    if plan is not None:
        row["layout_conversions"] = layout_conversions(plan)
        row["predicted"] = {k: getattr(plan, k, None) for k in
                            ("predicted_time_s", "baseline_time_s", "predicted_speedup")}
        try:  # modeled memory traffic of each partition (bytes between kernels, DRAM part)
            row["predicted"]["bytes"] = {p: plan.modeled_bytes(p)
                                         for p in ("unfused", "fuseops", "ours")}
        except Exception as e:  # informative only
            row["predicted"]["bytes"] = {"error": short(e)}
    for res in results.values():
        if res.times_s:
            res_d = row["contenders"][res.name]
            res_d["median_s"] = res.stat(statistics.median)
            res_d["min_s"], res_d["max_s"] = res.stat(min), res.stat(max)
    return row


# ---------------------------------------------------------------------------- reporting
def machine_info(threads: int) -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    info = {"cpu": cpu, "logical_cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "threads": threads, "python": platform.python_version(),
            "platform": platform.platform()}
    for mod in ("tvm", "onnxruntime", "onnx", "numpy", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    return info


def _ms(x) -> str:
    return "–" if x is None else (f"{x * 1e3:.3g}" if x < 1 else f"{x * 1e3:.0f}")


def _lat(c: dict) -> str:
    if c.get("median_s") is None:
        return {"skipped": "skip", "failed": "FAIL"}.get(c["status"], "n/t")
    return f"{_ms(c['median_s'])} ({_ms(c['min_s'])}–{_ms(c['max_s'])})"


def markdown(rows: list[dict], info: dict, args) -> str:
    out = ["# fusion_tvm benchmarks\n",
           f"Machine: {info['cpu']}, {info['usable_cores']} usable cores; **{info['threads']} "
           f"thread(s)** everywhere (TVM_NUM_THREADS, ort intra_op_num_threads, torch). "
           f"TVM {info['tvm']}, onnxruntime {info['onnxruntime']}, torch {info['torch']}.  ",
           f"Latency: median of up to {args.repeat} samples (at least {args.min_repeat}, "
           f"{args.budget_s:g} s budget a model) after {args.warmup} warm-up, the contenders "
           f"interleaved in turns of {BLOCK} samples with a {SETTLE_S:g} s pause between turns "
           f"(thread pools go idle); "
           f"a round's sample is the mean of back-to-back runs lasting >= "
           f"{SAMPLE_S * 1e3:g} ms (one run for all but the smallest models), "
           f"ms (min–max). n/t: not timed; skip: contender unavailable (see notes). "
           f"Errors: max |x - ort| and that over max |ort|.\n"]
    present = [c for c in CONTENDERS if any(c in r["contenders"] for r in rows)]
    head = ["model", "kernels unfused/FuseOps/ours", "modeled traffic MB unfused/FuseOps/ours",
            "pred. ms ours/FuseOps", "pred. speedup",
            *[f"{c} ms" for c in present], "meas. speedup vs fuseops", "compile s ours/fuseops",
            "err ours abs/rel", "FLOPs on templates"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        cs, k, pred = r["contenders"], r.get("kernels", {}), r.get("predicted") or {}
        kern = "/".join(str(k.get(x, "–")) for x in ("unfused", "fuseops", "ours"))
        ours, fuse = cs.get("ours", {}), cs.get("fuseops", {})
        speed = "–"
        if ours.get("median_s") and fuse.get("median_s"):
            speed = f"{fuse['median_s'] / ours['median_s']:.2f}x"
        pspeed = pred.get("predicted_speedup")
        comp = "/".join("–" if c.get("compile_s") is None else f"{c['compile_s']:.1f}"
                        for c in (ours, fuse))
        err = "–" if ours.get("max_abs_err") is None else \
            f"{ours['max_abs_err']:.1e}/{ours['max_rel_err']:.1e}"
        nbytes = pred.get("bytes") or {}
        traffic = "/".join("–" if not isinstance(nbytes.get(p), dict) else
                           f"{nbytes[p]['traffic'] / 1e6:.3g}"
                           for p in ("unfused", "fuseops", "ours"))
        out.append("| " + " | ".join([
            r["model"], kern, traffic,
            f"{_ms(pred.get('predicted_time_s'))}/{_ms(pred.get('baseline_time_s'))}",
            "–" if pspeed is None else f"{pspeed:.2f}x",
            *[_lat(cs[c]) if c in cs else "–" for c in present], speed, comp, err,
            "–" if not r.get("coverage") else f"{100 * r['coverage']['template_share']:.1f}%",
        ]) + " |")
        for name, c in cs.items():
            if c["note"]:
                notes.setdefault((name, c["status"], c["note"]), []).append(r["model"])
    detail = ["\n## Contenders\n", "| model | contender | status | median ms | min ms | max ms "
              "| compile s | kernels | max abs err | max rel err |", "|" + "---|" * 10]
    for r in rows:
        for name, c in r["contenders"].items():
            detail.append("| " + " | ".join([
                r["model"], name, c["status"], _ms(c.get("median_s")), _ms(c.get("min_s")),
                _ms(c.get("max_s")),
                "–" if c["compile_s"] is None else f"{c['compile_s']:.2f}",
                "–" if c["kernels"] is None else str(c["kernels"]),
                "–" if c["max_abs_err"] is None else f"{c['max_abs_err']:.2e}",
                "–" if c["max_rel_err"] is None else f"{c['max_rel_err']:.2e}"]) + " |")
    out += detail
    if notes:
        out += ["\n## Notes\n", *(f"- {name} ({status}) on {', '.join(ms)}: {note}"
                                   for (name, status, note), ms in notes.items())]
    return "\n".join(out) + "\n"


def plots(rows: list[dict], out_dir: Path) -> list[str]:
    """Latency bars and predicted-vs-measured scatter as SVG (``benchmarks/svgplot.py``)."""
    from benchmarks.svgplot import bar_chart, scatter_loglog

    written = []
    names = [c for c in CONTENDERS if any(r["contenders"].get(c, {}).get("median_s")
                                          for r in rows)]
    if names:
        series = {c: [(r["contenders"].get(c, {}).get("median_s") or 0) * 1e3 or None
                      for r in rows] for c in names}
        (out_dir / "latency.svg").write_text(bar_chart(
            [r["model"] for r in rows], series, "median latency (ms, log)",
            "Latency per model and contender"))
        written.append("latency.svg")
    pts: dict[str, list] = {}
    for r in rows:
        pred = r.get("predicted") or {}
        for key, c in (("predicted_time_s", "ours"), ("baseline_time_s", "fuseops")):
            m = r["contenders"].get(c, {}).get("median_s")
            if pred.get(key) and m:
                pts.setdefault(c, []).append((pred[key] * 1e3, m * 1e3))
    if pts:
        (out_dir / "predicted_vs_measured.svg").write_text(scatter_loglog(
            pts, "predicted (ms)", "measured median (ms)", "Cost model vs measurement"))
        written.append("predicted_vs_measured.svg")
    return written


# ---------------------------------------------------------------------------- driver
def parse_model(spec: str) -> tuple[str, dict]:
    """``name:key=value,key=value`` -> (name, kwargs); values parsed as Python literals."""
    name, _, rest = spec.partition(":")
    kw = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"bad model option {item!r} in {spec!r}")
        try:
            kw[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kw[key] = value
    return name, kw


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", help="zoo models, name[:key=value,...]")
    ap.add_argument("--quick", action="store_true",
                    help="CI mode: small models, few repetitions, numerical check")
    ap.add_argument("--threads", type=int, default=None, help="threads for every contender "
                    "(default: usable cores)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per contender")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop timing a model after this many seconds (default 10, quick 5)")
    ap.add_argument("--min-repeat", type=int, default=5,
                    help="timed rounds always done, whatever the budget")
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None,
                    help="default: all (--quick: all but torch_compile, ~20 s compile a model)")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--hw", default=None, help="fusion_tvm hardware preset for ours/fuseops")
    ap.add_argument("--rtol", type=float, default=1e-3,
                    help="allowed max |err| / max |reference| per contender")
    ap.add_argument("--time-stock-anyway", action="store_true",
                    help=f"time stock TVM even when one run takes > {STOCK_LIMIT_S} s")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                    help="output folder (default benchmarks/results, git-ignored)")
    args = ap.parse_args(argv)
    if args.threads is None:  # --quick: 1 thread, steadier on a shared CI machine
        args.threads = 1 if args.quick else len(os.sched_getaffinity(0)) \
            if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.repeat is None:
        args.repeat = 20 if args.quick else 100
    if args.budget_s is None:
        args.budget_s = 5.0 if args.quick else 10.0
    if args.contenders is None:
        args.contenders = [c for c in CONTENDERS
                           if c not in OPT_IN and not (args.quick and c == "torch_compile")]
    args.warmup = max(args.warmup, 1)
    if not args.models:
        args.models = QUICK_SUITE if args.quick else DEFAULT_SUITE
    return args


def write_results(rows: list[dict], info: dict, args, final: bool,
                  render: Callable[[list[dict], dict, object], str] = markdown) -> None:
    """Summary and JSON after every model (a long run keeps what it measured); plots at the end.
    ``render`` writes the summary (``benchmarks/real_models.py`` has its own table)."""
    args.out.mkdir(parents=True, exist_ok=True)
    md = render(rows, info, args)
    (args.out / "summary.md").write_text(md)
    doc = {"machine": info, "args": {k: str(v) if isinstance(v, Path) else v
                                     for k, v in vars(args).items()}, "models": rows}
    (args.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    if final:
        print(md)
        written = plots([r for r in rows if r.get("contenders")], args.out)
        progress(f"wrote {args.out}/summary.md, results.json" +
                 (", " + ", ".join(written) if written else ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    # Before TVM / torch / ort start their thread pools.
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from benchmarks import zoo

    models = []
    for spec in args.models:
        name, kw = parse_model(spec)
        if name not in zoo.list_models():
            print(f"unknown model {name!r}; known: {', '.join(zoo.list_models())}",
                  file=sys.stderr)
            return 2
        models.append((spec, name, kw))
    info = machine_info(args.threads)
    progress(f"{info['cpu']}, {info['usable_cores']} cores, {args.threads} thread(s); "
             f"{len(models)} model(s)")
    rows = []
    t_start = time.perf_counter()
    for i, (label, name, kw) in enumerate(models, 1):
        elapsed = time.perf_counter() - t_start
        eta = f", ~{elapsed / (i - 1) * (len(models) - i + 1) / 60:.0f} min left" if i > 1 else ""
        done = round(20 * (i - 1) / len(models))
        progress(f"[{'#' * done}{'.' * (20 - done)}] {i}/{len(models)} {label} "
                 f"({elapsed / 60:.1f} min elapsed{eta}): building ONNX")
        model = zoo.get_model(name, **kw)
        feeds = zoo.example_inputs(model, seed=0)
        ctx = Context(args.threads, args.target, args.hw, zoo.default_dims(model) or None)
        rows.append(bench_model(label, model, feeds, args.contenders, ctx, args))
        del model
        write_results(rows, info, args, final=i == len(models))
    progress(f"done: {len(models)} model(s) in {(time.perf_counter() - t_start) / 60:.1f} min")
    bad = [f"{r['model']}/{n}: {c['status']}" for r in rows for n, c in r["contenders"].items()
           if c["status"] in ("failed", "mismatch")]
    if bad:
        progress("FAILED: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
