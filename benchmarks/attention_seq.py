"""Attention as one kernel against the sequence length: online vs row-wise softmax.

    python benchmarks/attention_seq.py [--seqs 128 512 1024 2048 4096] [--heads 4]
                                       [--repeat 15]

One ``softmax(Q K^T / sqrt(dh) + mask) V`` block (``ablation.attention_block``, dh = 64) at
each length: our plan (one kernel) scheduled by the online-softmax rule (``flash_attention``:
blocks of keys, running max / sum / output, nothing of length S held) and by the row-wise
rule (``LLVMCPUBackend(softmax="rowwise")``: a block of query rows holds its whole rows of
scores), FuseOps's four kernels with the same schedule rules, and onnxruntime. Timed
interleaved in one process in a rotating order with a pause between turns
(``ablation.time_runs``; inputs copied to the device once). Writes
benchmarks/results/attention_seq.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import fusion_tvm  # noqa: E402
from benchmarks.ablation import attention_block, time_runs  # noqa: E402
from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend  # noqa: E402

HEAD_DIM = 64


def bench(seq: int, heads: int, repeat: int, threads: int) -> dict:
    """Median ms per contender and the GFLOP/s they give, at one sequence length."""
    import onnxruntime as ort

    model = attention_block(seq=seq, heads=heads, dh=HEAD_DIM)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, heads, seq, HEAD_DIM)).astype(np.float32) for n in "qkv"}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    runs, kernels, errors = {}, {}, {}
    for label, fusion, softmax in (("ours", "cost", "online"), ("rowwise", "cost", "rowwise"),
                                   ("fuseops", "fuseops", "online")):
        cm = fusion_tvm.compile(model, fusion=fusion, target=LLVMCPUBackend(softmax=softmax))
        errors[label] = float(np.abs(cm.run(feeds)[0] - ref).max())
        kernels[label] = cm.num_kernels
        runs[label] = cm.bind(feeds)
    runs["onnxruntime"] = lambda: sess.run(None, feeds)
    times = time_runs(runs, repeat, pause=0.2)
    flops = 4.0 * heads * seq * seq * HEAD_DIM
    row = {"seq": seq, "heads": heads, "kernels": kernels, "max_abs_err_vs_ort": errors}
    for label, samples in times.items():
        ms = statistics.median(samples) * 1e3
        row[label] = {"ms": ms, "gflops": flops / ms / 1e6}
    row["ours_vs_fuseops"] = row["fuseops"]["ms"] / row["ours"]["ms"]
    row["online_vs_rowwise"] = row["rowwise"]["ms"] / row["ours"]["ms"]
    row["ours_vs_onnxruntime"] = row["onnxruntime"]["ms"] / row["ours"]["ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqs", nargs="*", type=int, default=[128, 512, 1024, 2048, 4096])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    threads = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    print(f"machine: {os.cpu_count()} cores, {threads} threads (TVM and onnxruntime)")
    rows = [bench(seq, args.heads, args.repeat, threads) for seq in args.seqs]
    print(f"\n{'seq':>5} {'ours ms':>9} {'GFLOP/s':>8} {'row-wise ms':>11} {'FuseOps ms':>10} "
          f"{'ORT ms':>8} {'vs row-wise':>11} {'vs FuseOps':>10} {'vs ORT':>7}")
    for r in rows:
        print(f"{r['seq']:>5} {r['ours']['ms']:>9.3f} {r['ours']['gflops']:>8.1f} "
              f"{r['rowwise']['ms']:>11.3f} {r['fuseops']['ms']:>10.3f} "
              f"{r['onnxruntime']['ms']:>8.3f} {r['online_vs_rowwise']:>10.2f}x "
              f"{r['ours_vs_fuseops']:>9.2f}x {r['ours_vs_onnxruntime']:>6.2f}x")
    out = Path(__file__).parent / "results" / "attention_seq.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"threads": threads, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
