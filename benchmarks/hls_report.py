"""HLS backend report: fused designs for FPGA boards, C-simulated against onnxruntime.

    python benchmarks/hls_report.py                      # MLP, CNN, transformer on zcu104
    python benchmarks/hls_report.py --boards zcu104 u250 --precision float "ap_fixed<16,6>"
    python benchmarks/hls_report.py --export out/hls     # also write the Vitis projects

For every (model, board, precision): the fusion plan of the FPGA cost model (groups vs the
CPU plan of the same model on ci-x86-avx2 with the roofline model), the estimated
latency, DSP and BRAM against the board, and the error of the g++ C simulation against
onnxruntime. No HLS tool is run: latency and resources are the analytical estimates.
Exit status 0 when every design fits and matches (float: rtol 1e-4 / atol 1e-5;
fixed point: max abs error < 0.05), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fusion_tvm  # noqa: E402
from fusion_tvm.frontend import load_model  # noqa: E402
from fusion_tvm.pipeline import make_pipeline  # noqa: E402
from fusion_tvm.targets.hls import HLSBackend  # noqa: E402
from fusion_tvm.targets.hls import examples as ex  # noqa: E402

DATA = ROOT / "tests" / "data"


def _fixture(name: str):
    import onnx

    return lambda: onnx.load(DATA / f"{name}.onnx")


MODELS = {
    "mlp": ex.mlp,
    "mlp_wide": lambda: ex.mlp(batch=8, d_in=256, hidden=256, d_out=256),
    "cnn": ex.small_cnn,
    "transformer": ex.transformer_block,
    "bert_tiny": _fixture("bert_tiny"),  # int64 token ids, seq 8
    "gpt2_tiny": _fixture("gpt2_tiny"),
}
DEFAULT = ["mlp", "mlp_wide", "cnn", "transformer"]


def cpu_kernels(model, shapes) -> int:
    """Kernels of the CPU plan (roofline on the frozen ci-x86-avx2 spec)."""
    parts = make_pipeline(target="llvm", hw="ci-x86-avx2")
    with parts.target:
        parts.fuse(parts.prepare(load_model(model, shape_dict=shapes).mod))
    return parts.fuse_pass.plan.num_kernels


def feeds_for(model, seed: int = 1) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """Random inputs (token ids / masks for int64 inputs) and the shapes used: symbolic
    dims become 1 (leading) or 8."""
    rng = np.random.default_rng(seed)
    feeds, shapes = {}, {}
    for i in model.graph.input:
        dims = [d.dim_value or (1 if k == 0 else 8)
                for k, d in enumerate(i.type.tensor_type.shape.dim)]
        shapes[i.name] = dims
        if i.type.tensor_type.elem_type == 7:  # int64
            if "mask" in i.name:
                feeds[i.name] = np.ones(dims, np.int64)
            else:
                feeds[i.name] = rng.integers(0, 2 if "type" in i.name else 50, dims)
        else:
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds, shapes


def run_one(name: str, board: str, precision: str, export: Path | None) -> dict:
    model = MODELS[name]()
    feeds, shapes = feeds_for(model)
    ref = ex.reference(model, feeds)
    t0 = time.perf_counter()
    cm = fusion_tvm.compile(model, target=HLSBackend(precision=precision), hw=board,
                            shape_dict=shapes)
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = cm.run(feeds)
    t_sim = time.perf_counter() - t0
    err = max(float(np.abs(o - r).max()) for o, r in zip(out, ref, strict=True))
    if precision == "float":
        ok = all(np.allclose(o, r, rtol=1e-4, atol=1e-5) for o, r in zip(out, ref, strict=True))
    else:
        ok = err < 0.05
    s = cm.summary()
    r = s["resources"]
    fits = r["dsp"] <= r["dsp_budget"] and r["bram_18k"] <= r["bram_budget"]
    if export is not None:
        cm.export(export / f"{name}_{board}_{'float' if precision == 'float' else 'fixed'}")
    return {
        "model": name, "board": board, "precision": precision,
        "kernels_fpga": cm.num_kernels, "kernels_cpu": cpu_kernels(model, shapes),
        "latency_cycles": s["latency_cycles"], "latency_us": s["latency_us"],
        "interval_cycles": s["interval_cycles"],
        "dsp": r["dsp"], "dsp_budget": r["dsp_budget"],
        "bram": r["bram_18k"], "bram_budget": r["bram_budget"],
        "weights_off_chip": len(s["weights_off_chip"]),
        "max_abs_error": err, "ok": bool(ok and fits),
        "compile_s": t_compile, "csim_s": t_sim, "report": cm.report(), "summary": s,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT, choices=list(MODELS))
    ap.add_argument("--boards", nargs="+", default=["zcu104"])
    ap.add_argument("--precision", nargs="+", default=["float", "ap_fixed<16,6>"])
    ap.add_argument("--export", type=Path, default=None, help="write the HLS projects here")
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    ap.add_argument("--verbose", action="store_true", help="print each design's report")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        for board in args.boards:
            for prec in args.precision:
                row = run_one(name, board, prec, args.export)
                rows.append(row)
                if args.verbose:
                    print(f"## {name} on {board} ({prec})\n\n```\n{row['report']}\n```\n")
    print("| model | board | precision | kernels FPGA / CPU | latency (cycles) | latency (us) "
          "| DSP | BRAM18K | off-chip weights | max abs err | ok | compile s | csim s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['board']} | {r['precision']} | {r['kernels_fpga']} / "
              f"{r['kernels_cpu']} | {r['latency_cycles']:.0f} | {r['latency_us']:.1f} | "
              f"{r['dsp']:.0f} / {r['dsp_budget']} | {r['bram']} / {r['bram_budget']} | "
              f"{r['weights_off_chip']} | {r['max_abs_error']:.2e} | "
              f"{'yes' if r['ok'] else 'NO'} | {r['compile_s']:.1f} | {r['csim_s']:.1f} |")
    if args.json is not None:
        slim = [{k: v for k, v in r.items() if k not in ("report",)} for r in rows]
        args.json.write_text(json.dumps(slim, indent=2, default=str))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
