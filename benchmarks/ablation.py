"""What each kind of fusion contributes: kernel counts, predicted and measured latency.

    python benchmarks/ablation.py [--models bert_2l gpt2_2l vit_tiny] [--measure] [--repeat 20]

For every model: FuseOps's partition, our full search, and our search with one kind switched
off at a time (reduction chains, multi-output, prologue, weight folding, siblings, attention).
With ``--measure`` every variant is built with the same schedule rules and timed, interleaved
in one process in a rotating order (median of ``--repeat`` samples, see :func:`measure`).
Writes benchmarks/results/ablation.json.

Besides the zoo, ``--models`` takes the small cases below (also used by the tests):
``attention`` (one softmax(Q K^T + mask) V block), ``tvm20342`` (a long fp16 exp chain feeding
a broadcast add: TVM #20342 measured it 30-60% slower fused than unfused) and ``tvm20401``
(MaxPool feeding an Add: 5.5x slower fused in TVM #20401). For these an ``unfused`` variant
is built too: ours must never be slower than it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from onnx import TensorProto  # noqa: E402

import fusion_tvm  # noqa: E402
from benchmarks.run import runs_per_sample, time_interleaved  # noqa: E402
from benchmarks.zoo import example_inputs, get_model  # noqa: E402
from benchmarks.zoo.builder import GraphBuilder  # noqa: E402
from fusion_tvm.legality import FusionKinds  # noqa: E402
from fusion_tvm.search import SearchConfig  # noqa: E402

KINDS = [f.name for f in dataclasses.fields(FusionKinds)]


def attention_block(seq: int = 128, heads: int = 4, dh: int = 64, causal: bool = False):
    """softmax(Q K^T / sqrt(dh) + mask) V on inputs q, k, v [1, heads, seq, dh]."""
    g = GraphBuilder("attention")
    q, k, v = (g.add_input(n, [1, heads, seq, dh]) for n in "qkv")
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Div", [scores, g.const(float(np.sqrt(dh)))])
    if causal:
        mask = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
    else:  # padding: the last quarter of the keys masked
        mask = np.zeros((1, 1, 1, seq), np.float32)
        mask[..., seq - seq // 4:] = -1e4
    scores = g.op("Add", [scores, g.const(mask)])
    out = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    g.add_output(out)
    return g.build("attention block")


def exp_chain_broadcast(channels: int = 64, rows: int = 64, cols: int = 64, depth: int = 8):
    """TVM #20342: a long fp16 exp chain on [1, C, 1, W] broadcast-added to [1, C, H, W].

    Fused, every output element recomputes the whole chain (H times the work); the cost
    model sees that reuse and must keep the chain apart when it does not pay.
    """
    g = GraphBuilder("tvm20342")
    x = g.add_input("x", [1, channels, 1, cols], TensorProto.FLOAT16)
    y = g.add_input("y", [1, channels, rows, cols], TensorProto.FLOAT16)
    t = x
    for _ in range(depth):  # exp(-t) stays in (0, 1]: no fp16 overflow however deep
        t = g.op("Exp", [g.op("Neg", [t])])
    g.add_output(g.op("Add", [y, t]), dtype=TensorProto.FLOAT16)
    return g.build("TVM issue 20342")


def maxpool_add(channels: int = 64, size: int = 56):
    """TVM #20401: MaxPool 3x3 / 1 (pad 1) feeding an Add (5.5x slower fused in TVM)."""
    g = GraphBuilder("tvm20401")
    x = g.add_input("x", [1, channels, size, size])
    y = g.add_input("y", [1, channels, size, size])
    pooled = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    g.add_output(g.op("Add", [pooled, y]))
    return g.build("TVM issue 20401")


def inception_block(channels: int = 32, size: int = 28):
    """A GoogLeNet-style inception block on x [1, channels, size, size]: three 1x1 convs of x
    (16 / 24 / 8 outputs, bias and ReLU each), the second and third feeding a 3x3 / a 5x5
    conv, the branches concatenated. The 1x1s are siblings (``CombineSiblingConvs``)."""
    g = GraphBuilder("inception")
    x = g.add_input("x", [1, channels, size, size])
    b1 = g.relu(g.conv(x, channels, 16, 1, bias=True))
    b2 = g.relu(g.conv(g.relu(g.conv(x, channels, 24, 1, bias=True)), 24, 32, 3, bias=True))
    b3 = g.relu(g.conv(g.relu(g.conv(x, channels, 8, 1, bias=True)), 8, 16, 5, bias=True))
    g.add_output(g.op("Concat", [b1, b2, b3], axis=1))
    return g.build("inception block")


#: Small cases: builder(small: bool) -> model.
CASES = {
    "attention": lambda small: attention_block(seq=16 if small else 128,
                                               dh=16 if small else 64),
    "attention_causal": lambda small: attention_block(seq=16 if small else 128,
                                                      dh=16 if small else 64, causal=True),
    "tvm20342": lambda small: exp_chain_broadcast(*((8, 8, 16) if small else (64, 64, 64))),
    "tvm20401": lambda small: maxpool_add(*((4, 12) if small else (64, 56))),
    "inception": lambda small: inception_block(*((16, 14) if small else (32, 28))),
}


def inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for a zoo model or a case (the cases' fp16 inputs included)."""
    fp16 = {i.name for i in model.graph.input
            if i.type.tensor_type.elem_type == TensorProto.FLOAT16}
    if not fp16:
        return example_inputs(model, seed=seed)
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float16 if i.name in fp16 else np.float32) for i in model.graph.input}


def measure(built: dict, feeds: dict, repeat: int, pause: float) -> dict[str, list[float]]:
    """Per variant, ``repeat`` samples: each the mean of back-to-back runs lasting >= 5 ms
    after one warm-up run (``run.time_interleaved``, one sample a turn). The variants take
    turns in an order rotated every round, with a pause between turns: a fixed order
    measured the variant after FuseOps's 2.8 ms TVM #20342 kernel 1.3x slower than the same
    code elsewhere in the order (the previous turn's worker threads still spinning). Inputs
    are copied to the device once (``CompiledModel.bind``): the numpy copies of ``run``
    (~90 us on #20342's 512 KB fp16 input) are the same for every variant and hid a 7%
    difference between 35 us kernels."""
    return time_runs({label: cm.bind(feeds) for label, cm in built.items()}, repeat, pause)


def time_runs(runs: dict, repeat: int, pause: float) -> dict[str, list[float]]:
    """``repeat`` samples of each zero-argument call in ``runs``, as :func:`measure` takes
    them (a warm-up, >= 5 ms a sample, rotating turns with ``pause`` between)."""
    inner = {}
    for label, run in runs.items():
        run()
        inner[label] = runs_per_sample(run)
    return time_interleaved(runs, inner, repeat, block=1, settle_s=pause, warm_turn=True)


def load(name: str, small: bool = False):
    """A zoo model or one of :data:`CASES`."""
    return CASES[name](small) if name in CASES else get_model(name, small=small)


def variants(case: bool = False) -> dict[str, dict]:
    """FuseOps's partition, ours, ours with the row-wise attention template instead of the
    online-softmax one (a schedule choice, ``LLVMCPUBackend(softmax="rowwise")``), and ours
    with each fusion kind switched off (and the unfused build for the small cases)."""
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

    out = {"fuseops": {"fusion": "fuseops"}, "ours": {"fusion": "cost"},
           "ours rowwise-softmax": {"fusion": "cost",
                                    "target": LLVMCPUBackend(softmax="rowwise")}}
    if case:
        out["unfused"] = {"fusion": "none"}
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
    ap.add_argument("--pause", type=float, default=0.1,
                    help="seconds between variants (thread pools go idle)")
    ap.add_argument("--small", action="store_true", help="test-sized models")
    args = ap.parse_args()
    rows = []
    threads = os.environ.get("TVM_NUM_THREADS", "all cores")
    print(f"machine: {os.cpu_count()} cores, TVM_NUM_THREADS={threads}, hw preset {args.hw}")
    for name in args.models:
        model = load(name, small=args.small)
        feeds = inputs(model, seed=0)
        built = {}
        for label, kw in variants(name in CASES).items():
            print(f"[{name}] building {label}", file=sys.stderr, flush=True)
            cm = fusion_tvm.compile(model, hw=args.hw, **kw)
            built[label] = cm
        times = {label: [] for label in built}
        if args.measure:
            times = measure(built, feeds, args.repeat, args.pause)
        fo = built["fuseops"]
        for label, cm in built.items():
            plan = cm.plan
            row = {
                "model": name, "variant": label, "kernels": cm.num_kernels,
                "kernels_vs_fuseops": cm.num_kernels / fo.num_kernels,
                "predicted_ms": plan.predicted_time_s * 1e3 if plan else None,
                "measured_ms": statistics.median(times[label]) * 1e3 if times[label] else None,
            }
            for base in ("fuseops", "unfused"):
                if row["measured_ms"] and times.get(base):
                    row[f"speedup_vs_{base}"] = statistics.median(times[base]) * 1e3 / \
                        row["measured_ms"]
            rows.append(row)
    print(f"\n{'model':<16} {'variant':<22} {'kernels':>7} {'x FuseOps':>9} {'pred ms':>8} "
          f"{'meas ms':>8} {'vs FuseOps':>10} {'vs unfused':>10}")
    for r in rows:
        pred = f"{r['predicted_ms']:.2f}" if r["predicted_ms"] else "-"
        meas = f"{r['measured_ms']:.2f}" if r["measured_ms"] else "-"
        sp = f"{r['speedup_vs_fuseops']:.2f}x" if r.get("speedup_vs_fuseops") else "-"
        su = f"{r['speedup_vs_unfused']:.2f}x" if r.get("speedup_vs_unfused") else "-"
        print(f"{r['model']:<16} {r['variant']:<22} {r['kernels']:>7} "
              f"{r['kernels_vs_fuseops']:>9.2f} {pred:>8} {meas:>8} {sp:>10} {su:>10}")
    out = Path(__file__).parent / "results" / "ablation.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
