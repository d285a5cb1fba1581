"""Kernel benchmark: fused LLVM-CPU schedules against numpy/OpenBLAS, 1 and 2 threads.

Run ``python benchmarks/kernels.py`` (add ``--quick`` for fewer repetitions). Each thread
count runs in its own subprocess with ``TVM_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set,
because both thread pools read them once at start-up. Inside a worker, TVM and numpy runs
alternate (interleaved) and the median of the repetitions is reported, so a noisy
neighbour slows both sides alike. A pause (``--pause``, 0.2 s) separates every TVM and numpy
turn: both libraries' worker threads spin for a while after a parallel region, and without
the pause each contender on 2 threads ran while the other's pool still held the cores (TVM's
512^3 matmul measured 40 GFLOP/s interleaved without pauses, 166 alone, 179 with pauses).
Prints a table and writes
``benchmarks/results/kernels.json``. ``efficiency`` is the roofline time (``HardwareSpec``
peak FLOP/s per op class, and bandwidth of the memory level holding the data, for the cores
used) over the measured median time: for a compute-bound GEMM it is GFLOP/s over peak.
``ratio`` is numpy's time over ours (> 1: faster than numpy/OpenBLAS). The ``best``
columns use the fastest repetition instead of the median: on a shared machine the best run
is the closer estimate of what the kernel does alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "kernels.json"

# name -> (kind, shape parameters); conv is NCHW data, OIHW weight, stride 1, pad 1.
CASES = {
    "matmul_512": ("matmul", dict(m=512, n=512, k=512)),
    "matmul_1024": ("matmul", dict(m=1024, n=1024, k=1024)),
    "matmul_bias_gelu_512": ("matmul_epi", dict(m=512, n=512, k=512)),
    "conv_resnet_64x56x56_3x3": ("conv", dict(n=1, c=64, h=56, w=56, o=64, r=3)),
    "conv_resnet_256x14x14_3x3": ("conv", dict(n=1, c=256, h=14, w=14, o=256, r=3)),
    "conv_resnet_512x7x7_3x3": ("conv", dict(n=1, c=512, h=7, w=7, o=512, r=3)),
    # the same convs in the blocked NCHW[b]c layout (b = SIMD lanes), weights pre-packed
    "conv_nchwc_64x56x56_3x3": ("conv_nchwc", dict(n=1, c=64, h=56, w=56, o=64, r=3)),
    "conv_nchwc_256x14x14_3x3": ("conv_nchwc", dict(n=1, c=256, h=14, w=14, o=256, r=3)),
    "conv_nchwc_512x7x7_3x3": ("conv_nchwc", dict(n=1, c=512, h=7, w=7, o=512, r=3)),
    "softmax_256x1024": ("softmax", dict(m=256, n=1024)),
    "bias_relu_1024x1024": ("bias_relu", dict(m=1024, n=1024)),
    "matmul_512_fallback_only": ("matmul", dict(m=512, n=512, k=512, rules="fallback")),
}

#: The rule each case calibrates (the efficiency table in fusion_tvm/targets/llvm_cpu).
CALIBRATES = {
    "matmul_1024": "matmul",
    "conv_resnet_64x56x56_3x3": "conv2d",
    "softmax_256x1024": "reduction",
    "bias_relu_1024x1024": "elementwise",
    "matmul_512_fallback_only": "fallback",
}


# ----------------------------------------------------------------------------- modules
def _matmul_module(m, n, k, epilogue):
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, k), "float32"))
    w = relax.Var("w", R.Tensor((k, n), "float32"))
    b = relax.Var("b", R.Tensor((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            if epilogue:
                y = bb.emit(relax.op.nn.gelu(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _conv_module(n, c, h, w, o, r):
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((n, c, h, w), "float32"))
    wt = relax.Var("w", R.Tensor((o, c, r, r), "float32"))
    b = relax.Var("b", R.Tensor((1, o, 1, 1), "float32"))
    with bb.function("main", [x, wt, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, padding=r // 2))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _conv_nchwc_module(n, c, h, w, o, r, b):
    from tvm import relax
    from tvm.script import relax as R

    from fusion_tvm.targets.llvm_cpu.layout import conv2d_nchwc_te

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((n, c // b, h, w, b), "float32"))
    wt = relax.Var("w", R.Tensor((o // b, c // b, r, r, b, b), "float32"))
    bias = relax.Var("b", R.Tensor((1, o // b, 1, 1, b), "float32"))
    pad = [r // 2] * 4
    with bb.function("main", [x, wt, bias]):
        with bb.dataflow():
            y = bb.emit(bb.call_te(conv2d_nchwc_te, x, wt, [1, 1], pad, [1, 1], "float32"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _rowwise_module(kind, m, n):
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, n), "float32"))
    b = relax.Var("b", R.Tensor((n,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            if kind == "softmax":
                y = bb.emit(relax.op.nn.softmax(x))
            else:
                y = bb.emit(relax.op.nn.relu(relax.op.add(x, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _lower(mod):
    """Stock lowering with FuseOps, plus our FastMath as the pipeline runs it (exp / erf /
    tanh as vectorisable polynomials); each case is one fused kernel either way."""
    import tvm
    from tvm import relax

    from fusion_tvm.passes.fast_math import FastMath

    return tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            FastMath(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


# ---------------------------------------------------------------------------- the case
def _case(kind, p, rng):
    """(relax module, numpy inputs, numpy reference callable, flops)."""
    if kind in ("matmul", "matmul_epi"):
        m, n, k = p["m"], p["n"], p["k"]
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        if kind == "matmul":
            ref = lambda: x @ w  # noqa: E731
        else:
            from math import sqrt

            def ref():
                y = x @ w + b
                # tanh form: numpy has no vector erf; same work class as the kernel's epilogue
                return 0.5 * y * (1 + np.tanh(sqrt(2 / np.pi) * (y + 0.044715 * y**3)))

        return _matmul_module(m, n, k, kind == "matmul_epi"), [x, w, b], ref, 2 * m * n * k
    if kind in ("softmax", "bias_relu"):
        m, n = p["m"], p["n"]
        x = rng.standard_normal((m, n), dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        if kind == "softmax":
            def ref():
                e = np.exp(x - x.max(axis=1, keepdims=True))
                return e / e.sum(axis=1, keepdims=True)
        else:
            def ref():
                return np.maximum(x + b, 0)
        return _rowwise_module(kind, m, n), [x, b], ref, 0
    n, c, h, w_, o, r = (p[key] for key in ("n", "c", "h", "w", "o", "r"))
    x = rng.standard_normal((n, c, h, w_), dtype=np.float32)
    wt = rng.standard_normal((o, c, r, r), dtype=np.float32)
    b = rng.standard_normal((1, o, 1, 1), dtype=np.float32)
    w2 = wt.reshape(o, -1)

    def ref():  # im2col + OpenBLAS SGEMM + bias + ReLU
        xp = np.pad(x, ((0, 0), (0, 0), (r // 2, r // 2), (r // 2, r // 2)))
        cols = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(2, 3))
        cols = cols.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * r * r, h * w_)
        return np.maximum(w2 @ cols[0] + b.reshape(o, 1), 0).reshape(n, o, h, w_)

    flops = 2 * n * o * h * w_ * c * r * r
    if kind == "conv_nchwc":
        from fusion_tvm.presets import get_hardware
        from fusion_tvm.targets.llvm_cpu._util import lanes

        blk = lanes(get_hardware("host"), 32)
        while c % blk or o % blk:
            blk //= 2
        xb = np.ascontiguousarray(x.reshape(n, c // blk, blk, h, w_).transpose(0, 1, 3, 4, 2))
        wb = np.ascontiguousarray(
            wt.reshape(o // blk, blk, c // blk, blk, r, r).transpose(0, 2, 4, 5, 3, 1))
        bb_ = np.ascontiguousarray(b.reshape(1, o // blk, blk, 1, 1).transpose(0, 1, 3, 4, 2))

        def ref_blocked():  # the NCHW reference, blocked like the kernel's output
            y = ref()
            return y.reshape(n, o // blk, blk, h, w_).transpose(0, 1, 3, 4, 2)

        return (_conv_nchwc_module(n, c, h, w_, o, r, blk), [xb, wb, bb_], ref_blocked,
                flops)
    return _conv_module(n, c, h, w_, o, r), [x, wt, b], ref, flops


def _work(kind: str, p: dict, inputs: list[np.ndarray]) -> tuple[dict, int]:
    """(FLOPs by op class, bytes moved) of a case, as the roofline cost model counts them."""
    from fusion_tvm.hardware import OpClass

    out_elems = {
        "matmul": p.get("m", 0) * p.get("n", 0),
        "conv": p.get("n", 0) * p.get("o", 0) * p.get("h", 0) * p.get("w", 0),
    }
    nbytes = sum(a.nbytes for a in inputs)
    if kind in ("matmul", "matmul_epi"):
        flops = {OpClass.MATMUL: 2.0 * p["m"] * p["n"] * p["k"]}
        if kind == "matmul_epi":
            flops[OpClass.ELEMENTWISE] = 6.0 * p["m"] * p["n"]
            flops[OpClass.TRANSCENDENTAL] = 1.0 * p["m"] * p["n"]
        return flops, nbytes + 4 * out_elems["matmul"]
    if kind in ("conv", "conv_nchwc"):
        flops = {OpClass.CONV: 2.0 * out_elems["conv"] * p["c"] * p["r"] ** 2,
                 OpClass.ELEMENTWISE: 2.0 * out_elems["conv"]}
        return flops, nbytes + 4 * out_elems["conv"]
    elems = p["m"] * p["n"]
    if kind == "softmax":  # max, sum | subtract, divide | exp
        flops = {OpClass.REDUCTION: 2.0 * elems, OpClass.ELEMENTWISE: 2.0 * elems,
                 OpClass.TRANSCENDENTAL: 1.0 * elems}
    else:  # add, max
        flops = {OpClass.ELEMENTWISE: 2.0 * elems}
    return flops, nbytes + 4 * elems


def _roofline_s(hw, flops: dict, nbytes: int, threads: int) -> float:
    """Lower bound on the time: peak FLOP/s per class and the bandwidth of the level that
    holds the data (private levels count the cores in use), scaled to ``threads`` cores."""
    share = threads / hw.num_cores
    compute = sum(f / (hw.peak_flops[cls] * share) for cls, f in flops.items())
    bandwidth = hw.dram.bandwidth_bytes_per_s
    for lvl in hw.memory:
        if nbytes <= lvl.capacity_bytes * (1 if lvl.shared else threads):
            bandwidth = lvl.bandwidth_bytes_per_s * (1 if lvl.shared else share)
            break
    return max(compute, nbytes / bandwidth)


def _worker(threads: int, reps: int, names: list[str], pause: float) -> list[dict]:
    import tvm
    from tvm import relax, tirx

    import fusion_tvm.targets  # noqa: F401
    from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule
    from fusion_tvm.presets import get_hardware
    from fusion_tvm.targets.llvm_cpu import Fallback, LLVMCPUBackend

    class FallbackOnly(LLVMCPUBackend):
        def schedule_rules(self, hw):
            return (Fallback(),)

    hw = get_hardware("host")
    target = tvm.target.Target(dict(hw.target))
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        kind, params = CASES[name]
        mod, inputs, ref, flops = _case(kind, params, rng)
        backend = FallbackOnly() if params.get("rules") == "fallback" else "llvm"
        sched = ApplyTargetSchedule(backend, hw)(_lower(mod))
        rules = sorted(
            {str(f.attrs[RULE_ATTR]) for _, f in sched.functions_items()
             if isinstance(f, tirx.PrimFunc)}
        )
        vm = relax.VirtualMachine(tvm.compile(sched, target), tvm.cpu())
        args = [tvm.runtime.tensor(a) for a in inputs]
        got = vm["main"](*args).numpy()
        expect = ref()
        err = float(np.max(np.abs(got - expect)) / (np.max(np.abs(expect)) + 1e-6))
        timer = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=1)
        t_tvm, t_np = [], []
        ref()
        for _ in range(reps):  # interleaved, each turn after the other pool went idle
            time.sleep(pause)
            t_tvm.append(timer(*args).mean)
            time.sleep(pause)
            start = time.perf_counter()
            for _ in range(3):
                ref()
            t_np.append((time.perf_counter() - start) / 3)
        by_class, nbytes = _work(kind, params, inputs)
        flops = flops or sum(by_class.values())
        t_med, n_med = float(np.median(t_tvm)), float(np.median(t_np))
        rows.append(
            dict(
                case=name, threads=threads, rules=rules,
                gflops_tvm=round(flops / t_med / 1e9, 1),
                gflops_numpy=round(flops / n_med / 1e9, 1), ratio=round(n_med / t_med, 3),
                efficiency=round(_roofline_s(hw, by_class, nbytes, threads) / t_med, 3),
                efficiency_best=round(_roofline_s(hw, by_class, nbytes, threads) / min(t_tvm), 3),
                gflops_tvm_best=round(flops / min(t_tvm) / 1e9, 1),
                gflops_numpy_best=round(flops / min(t_np) / 1e9, 1),
                ms_tvm=round(1e3 * t_med, 3), ms_numpy=round(1e3 * n_med, 3),
                ms_tvm_best=round(1e3 * min(t_tvm), 3), rel_err=err, reps=reps,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="5 repetitions")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--pause", type=float, default=0.2,
                    help="seconds between TVM and numpy turns (spinning pools go idle)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    reps = 5 if args.quick else args.reps
    if args.worker:
        print(json.dumps(_worker(args.worker, reps, args.cases, args.pause)))
        return 0
    rows = []
    for threads in args.threads:
        env = dict(os.environ, TVM_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, __file__, "--worker", str(threads), "--reps", str(reps),
               "--pause", str(args.pause), "--cases", *args.cases]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        rows.extend(json.loads(out.stdout.strip().splitlines()[-1]))
    header = (f"{'case':28} {'thr':>3} {'TVM GF/s':>9} {'numpy GF/s':>10} {'ratio':>6} "
              f"{'eff':>5} | {'best TVM':>8} {'best np':>8} {'eff':>5} {'rule':>12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['case']:28} {r['threads']:>3} {r['gflops_tvm']:>9.1f} {r['gflops_numpy']:>10.1f}"
              f" {r['ratio']:>6.2f} {r['efficiency']:>5.2f} | {r['gflops_tvm_best']:>8.1f}"
              f" {r['gflops_numpy_best']:>8.1f} {r['efficiency_best']:>5.2f}"
              f" {','.join(r['rules']):>12}")
    print(f"load average during the run: {os.getloadavg()}")
    efficiency = {
        f"{rule}@{r['threads']}t": {"median": r["efficiency"], "best": r["efficiency_best"]}
        for r in rows
        for case, rule in CALIBRATES.items()
        if r["case"] == case
    }
    print("efficiency by rule (roofline time / measured):", efficiency)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULTS.write_text(json.dumps({"rows": rows, "efficiency": efficiency, "when": when,
                                   "pause_s": args.pause, "load_avg": os.getloadavg()},
                                  indent=1))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
