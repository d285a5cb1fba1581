"""Kernel benchmark: fused LLVM-CPU schedules against numpy/OpenBLAS, 1 and 2 threads.

Run ``python benchmarks/kernels.py`` (add ``--quick`` for fewer repetitions). Each thread
count runs in its own subprocess with ``TVM_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set,
because both thread pools read them once at start-up. Inside a worker, TVM and numpy runs
alternate (interleaved) and the median of the repetitions is reported, so a noisy
neighbour slows both sides alike. Prints a table and writes
``benchmarks/results/kernels.json``; the ``efficiency`` column is GFLOP/s over the
``HardwareSpec`` peak of the cores used.
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


def _lower(mod):
    import tvm
    from tvm import relax

    return tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
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

    return _conv_module(n, c, h, w_, o, r), [x, wt, b], ref, 2 * n * o * h * w_ * c * r * r


def _worker(threads: int, reps: int, names: list[str]) -> list[dict]:
    import tvm
    from tvm import relax, tirx

    import fusion_tvm.targets  # noqa: F401
    from fusion_tvm.cost_models.hardware import OpClass
    from fusion_tvm.cost_models.presets import get_hardware
    from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule

    hw = get_hardware("host")
    target = tvm.target.Target(dict(hw.target))
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        kind, params = CASES[name]
        mod, inputs, ref, flops = _case(kind, params, rng)
        sched = ApplyTargetSchedule("llvm", hw)(_lower(mod))
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
        for _ in range(reps):  # interleaved
            t_tvm.append(timer(*args).mean)
            start = time.perf_counter()
            for _ in range(3):
                ref()
            t_np.append((time.perf_counter() - start) / 3)
        tvm_gf = flops / float(np.median(t_tvm)) / 1e9
        np_gf = flops / float(np.median(t_np)) / 1e9
        op_class = OpClass.CONV if kind == "conv" else OpClass.MATMUL
        peak = hw.peak_flops[op_class] * threads / hw.num_cores
        rows.append(
            dict(
                case=name, threads=threads, rules=rules, gflops_tvm=round(tvm_gf, 1),
                gflops_numpy=round(np_gf, 1), ratio=round(tvm_gf / np_gf, 3),
                efficiency=round(tvm_gf * 1e9 / peak, 3), ms_tvm=round(1e3 * np.median(t_tvm), 3),
                ms_numpy=round(1e3 * np.median(t_np), 3), rel_err=err, reps=reps,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="5 repetitions")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    reps = 5 if args.quick else args.reps
    if args.worker:
        print(json.dumps(_worker(args.worker, reps, args.cases)))
        return 0
    rows = []
    for threads in args.threads:
        env = dict(os.environ, TVM_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, __file__, "--worker", str(threads), "--reps", str(reps),
               "--cases", *args.cases]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        rows.extend(json.loads(out.stdout.strip().splitlines()[-1]))
    header = f"{'case':28} {'thr':>3} {'TVM GF/s':>9} {'numpy GF/s':>10} {'ratio':>6} " \
             f"{'eff':>5} {'rule':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['case']:28} {r['threads']:>3} {r['gflops_tvm']:>9.1f} {r['gflops_numpy']:>10.1f}"
              f" {r['ratio']:>6.2f} {r['efficiency']:>5.2f} {','.join(r['rules']):>10}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                         time.gmtime())}, indent=1))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
