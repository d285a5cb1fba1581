"""Real architectures from torchvision, timm, ultralytics and transformers, timed against
FuseOps's plan (our schedules), onnxruntime and OpenVINO.

    python benchmarks/real_models.py --list                    # the registry, by family
    python benchmarks/real_models.py --quick                   # CI: three small models
    python benchmarks/real_models.py --models tv_resnet50 timm_regnety_004 --threads 2
    python benchmarks/real_models.py --family timm --resume    # skip models already in the JSON

Every model is built from its library's own config with seeded random weights (no download),
exported once with the TorchScript exporter (opset 17) to ``--out``/onnx/ and then timed with
``benchmarks/run.py``'s interleaved driver: every contender runs the same feeds with the same
thread count, in rotating turns with a pause between turns (onnxruntime's and TVM's workers
spin after a run). Contenders: ``ours`` (``fusion_tvm.compile``), ``fuseops`` (TVM's FuseOps
partition scheduled by our own rules), ``onnxruntime`` (default options) and ``openvino`` (CPU
plugin, ``INFERENCE_PRECISION_HINT=f32``, latency hint). Per model: kernels, layout
conversions executed, predicted and measured time, compile time, max error vs onnxruntime.
Writes ``summary.md`` and ``results.json`` (after every model) and ``latency.svg`` into
``--out`` (default ``benchmarks/results/real_models``).

Models marked ``held_out`` are kept out of tuning: the figures on them are the check that a
change is general, not fitted to the rest.

Needs the ``bench`` extra: ``pip install -e ".[bench]"`` (torch, torchvision, timm,
transformers, ultralytics, openvino). A family whose library is missing is skipped with a
note.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder leads sys.path and its kernels.py shadows the `kernels`
# package transformers imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import run as driver  # noqa: E402 - after the path set-up above

OUT = ROOT / "benchmarks" / "results" / "real_models"
CONTENDERS = ["ours", "fuseops", "onnxruntime", "openvino"]
QUICK = ["tv_mobilenet_v3_small", "timm_regnety_002", "hf_bert_4l"]


@dataclass(frozen=True)
class Spec:
    """One registry entry: ``build()`` returns the module, its example inputs (a tuple of
    tensors) and their names."""

    family: str
    build: Callable[[], tuple]
    held_out: bool = False
    note: str = ""


def _randomize_norms(model):
    """BatchNorm statistics and affine terms away from identity (random-weight models
    initialise them to mean 0, var 1, gamma 1 or 0: folding bugs would hide), and
    parameters initialised to (near) zero drawn again (a zero classifier head or a 1e-6
    layer scale makes the output independent of most of the network)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and float(p.abs().max()) < 1e-4:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.ndim > 1 else 0.2))
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.running_mean \
                    is not None:
                n = mod.num_features
                mod.running_mean.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
                mod.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                if mod.affine:
                    mod.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.5)
                    mod.bias.copy_(torch.rand(n, generator=gen) * 0.2 - 0.1)
    return model.eval()


def _image(model, size: int = 224, batch: int = 1):
    import torch

    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    return _randomize_norms(model), (x,), ["input"]


def _tv(name: str, size: int = 224, **kw):
    def build():
        import torch
        import torchvision

        torch.manual_seed(0)
        return _image(torchvision.models.get_model(name, weights=None, **kw), size)

    return build


def _tv_seg(name: str, size: int = 224):
    def build():
        import torch
        import torchvision

        torch.manual_seed(0)
        inner = torchvision.models.get_model(name, weights=None, weights_backbone=None,
                                             aux_loss=False)

        class Out(torch.nn.Module):  # the "out" entry of the dict torchvision returns
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(x)["out"]

        return _image(Out(), size)

    return build


def _tv_fpn(backbone: str, size: int = 320):
    """A detection backbone with its FPN, as torchvision's detectors build it."""

    def build():
        import torch
        from torchvision.models.detection.backbone_utils import (
            mobilenet_backbone,
            resnet_fpn_backbone,
        )

        torch.manual_seed(0)
        if backbone.startswith("mobilenet"):
            inner = mobilenet_backbone(backbone_name=backbone, weights=None, fpn=True,
                                       trainable_layers=0)
        else:
            inner = resnet_fpn_backbone(backbone_name=backbone, weights=None,
                                        trainable_layers=0)

        class Levels(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return tuple(self.inner(x).values())

        return _image(Levels(), size)

    return build


def _timm(name: str, size: int = 224, **kw):
    def build():
        import timm
        import torch

        torch.manual_seed(0)
        return _image(timm.create_model(name, pretrained=False, **kw), size)

    return build


def _yolo(yaml: str, size: int = 320):
    """An ultralytics model from its bundled yaml, with the head in export mode (boxes and
    classes decoded in the graph, as ``YOLO.export(format="onnx")`` does)."""

    def build():
        import torch
        from ultralytics import YOLO

        torch.manual_seed(0)
        model = YOLO(yaml, verbose=False).model.eval()
        for m in model.modules():
            if hasattr(m, "export") and hasattr(m, "format"):
                m.export, m.format = True, "onnx"
            if hasattr(m, "dynamic"):
                m.dynamic = False
        model = model.fuse(verbose=False) if hasattr(model, "fuse") else model
        for p in model.parameters():
            p.requires_grad_(False)
        x = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model(x)  # builds the anchors / strides the export-mode head reads
        return model, (x,), ["images"]

    return build


def _hf(config: str, model_cls: str, input_name: str, **kw):
    """A transformers model from its config, returning ``last_hidden_state``."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    inner = getattr(T, model_cls)(getattr(T, config)(**kw)).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(**{input_name: x}).last_hidden_state

    return LastHidden()


def _hf_text(config: str, model_cls: str, seq: int = 128, **kw):
    def build():
        import torch

        model = _hf(config, model_cls, "input_ids", **kw)
        ids = torch.randint(0, 1000, (1, seq), generator=torch.Generator().manual_seed(0))
        return model, (ids,), ["input_ids"]

    return build


def _hf_image(config: str, model_cls: str, size: int = 224, **kw):
    def build():
        model, example, _ = _image(_hf(config, model_cls, "pixel_values", **kw), size)
        return model, example, ["pixel_values"]

    return build


def registry() -> dict[str, Spec]:
    """Every model of the benchmark, name -> :class:`Spec`."""
    tv, tm, yo, hf = "torchvision", "timm", "ultralytics", "transformers"
    specs = {
        # torchvision classification
        "tv_resnet50": Spec(tv, _tv("resnet50")),
        "tv_resnext50_32x4d": Spec(tv, _tv("resnext50_32x4d"), held_out=True),
        "tv_mobilenet_v2": Spec(tv, _tv("mobilenet_v2")),
        "tv_mobilenet_v3_small": Spec(tv, _tv("mobilenet_v3_small")),
        "tv_mobilenet_v3_large": Spec(tv, _tv("mobilenet_v3_large"), held_out=True),
        "tv_efficientnet_b0": Spec(tv, _tv("efficientnet_b0")),
        "tv_regnet_y_400mf": Spec(tv, _tv("regnet_y_400mf")),
        "tv_regnet_x_400mf": Spec(tv, _tv("regnet_x_400mf"), held_out=True),
        "tv_shufflenet_v2_x1_0": Spec(tv, _tv("shufflenet_v2_x1_0")),
        "tv_squeezenet1_1": Spec(tv, _tv("squeezenet1_1"), held_out=True),
        "tv_densenet121": Spec(tv, _tv("densenet121")),
        "tv_googlenet": Spec(tv, _tv("googlenet", aux_logits=False, init_weights=True)),
        "tv_mnasnet1_0": Spec(tv, _tv("mnasnet1_0"), held_out=True),
        "tv_convnext_tiny": Spec(tv, _tv("convnext_tiny")),
        "tv_swin_t": Spec(tv, _tv("swin_t"), held_out=True),
        "tv_vit_b_16": Spec(tv, _tv("vit_b_16")),
        # torchvision segmentation and detection backbones
        "tv_deeplabv3_mobilenet_v3_large": Spec(tv, _tv_seg("deeplabv3_mobilenet_v3_large")),
        "tv_lraspp_mobilenet_v3_large": Spec(tv, _tv_seg("lraspp_mobilenet_v3_large"),
                                             held_out=True),
        "tv_fcn_resnet50": Spec(tv, _tv_seg("fcn_resnet50")),
        "tv_resnet18_fpn": Spec(tv, _tv_fpn("resnet18")),
        "tv_mobilenet_v3_large_fpn": Spec(tv, _tv_fpn("mobilenet_v3_large"), held_out=True),
        # timm: a spread of families
        "timm_convnext_atto": Spec(tm, _timm("convnext_atto")),
        "timm_regnety_002": Spec(tm, _timm("regnety_002")),
        "timm_regnety_004": Spec(tm, _timm("regnety_004"), held_out=True),
        "timm_efficientnet_b0": Spec(tm, _timm("efficientnet_b0")),
        "timm_mobilenetv3_small_100": Spec(tm, _timm("mobilenetv3_small_100")),
        "timm_ghostnet_100": Spec(tm, _timm("ghostnet_100")),
        "timm_resnest14d": Spec(tm, _timm("resnest14d")),
        "timm_densenet121": Spec(tm, _timm("densenet121"), held_out=True),
        "timm_vit_tiny_patch16_224": Spec(tm, _timm("vit_tiny_patch16_224")),
        "timm_deit_tiny_patch16_224": Spec(tm, _timm("deit_tiny_patch16_224"), held_out=True),
        "timm_mobilevitv2_050": Spec(tm, _timm("mobilevitv2_050", size=256)),
        "timm_tiny_vit_5m_224": Spec(tm, _timm("tiny_vit_5m_224")),
        "timm_levit_128s": Spec(tm, _timm("levit_128s"), held_out=True),
        "timm_repvgg_a0": Spec(tm, _timm("repvgg_a0")),
        "timm_rexnet_100": Spec(tm, _timm("rexnet_100"), held_out=True),
        "timm_mixnet_s": Spec(tm, _timm("mixnet_s")),
        "timm_lcnet_050": Spec(tm, _timm("lcnet_050")),
        "timm_edgenext_xx_small": Spec(tm, _timm("edgenext_xx_small", size=256),
                                       held_out=True),
        "timm_poolformer_s12": Spec(tm, _timm("poolformer_s12")),
        "timm_dla34": Spec(tm, _timm("dla34")),
        # ultralytics
        "yolov8n": Spec(yo, _yolo("yolov8n.yaml")),
        "yolo11n": Spec(yo, _yolo("yolo11n.yaml"), held_out=True),
        "yolov8n_seg": Spec(yo, _yolo("yolov8n-seg.yaml")),
        "yolov8n_pose": Spec(yo, _yolo("yolov8n-pose.yaml"), held_out=True),
        # transformers (real dimensions, fewer layers)
        "hf_bert_4l": Spec(hf, _hf_text("BertConfig", "BertModel", num_hidden_layers=4)),
        "hf_gpt2_4l": Spec(hf, _hf_text("GPT2Config", "GPT2Model", n_layer=4)),
        "hf_t5_encoder_4l": Spec(hf, _hf_text("T5Config", "T5EncoderModel", num_layers=4),
                                 held_out=True),
        "hf_distilbert": Spec(hf, _hf_text("DistilBertConfig", "DistilBertModel")),
        "hf_vit_4l": Spec(hf, _hf_image("ViTConfig", "ViTModel", num_hidden_layers=4)),
        "hf_segformer_b0": Spec(hf, _hf_image("SegformerConfig", "SegformerModel",
                                              size=256), held_out=True),
    }
    return specs


# ---------------------------------------------------------------------------- contenders
def openvino(model, feeds, ctx: driver.Context) -> driver.Prepared:
    """OpenVINO's CPU plugin in f32 (bf16-capable CPUs otherwise compute in bf16), latency
    hint, the benchmark's thread count."""
    try:
        import openvino as ov
    except ImportError:
        raise driver.Skipped("openvino not importable") from None
    t0 = time.perf_counter()
    core = ov.Core()
    ov_model = core.read_model(model.SerializeToString(), b"") if model.ByteSize() < 2 ** 31 \
        else None
    if ov_model is None:
        raise driver.Skipped("model over 2 GB")
    compiled = core.compile_model(ov_model, "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": str(ctx.threads), "NUM_STREAMS": "1"})
    request = compiled.create_infer_request()
    outputs = compiled.outputs

    def run(feeds):
        res = request.infer(feeds)
        return [np.asarray(res[o]) for o in outputs]

    return driver.Prepared(run, time.perf_counter() - t0)


PREPARE = {**driver.PREPARE, "openvino": openvino}


# ---------------------------------------------------------------------------- export
def export(name: str, spec: Spec, folder: Path):
    """The ONNX model and its feeds, exported on first use and cached in ``folder``."""
    import onnx

    path = folder / f"{name}.onnx"
    feeds_path = folder / f"{name}.npz"
    if not (path.exists() and feeds_path.exists()):
        import torch

        module, example, names = spec.build()
        # nn.MultiheadAttention's inference fast path exports as an op ONNX lacks.
        torch.backends.mha.set_fastpath_enabled(False)
        folder.mkdir(parents=True, exist_ok=True)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, example, str(path), input_names=names, opset_version=17,
                              dynamo=False, do_constant_folding=True)
        np.savez(feeds_path, **{n: t.numpy() for n, t in zip(names, example, strict=True)})
    model = onnx.load(str(path))
    with np.load(feeds_path) as f:
        feeds = {k: f[k] for k in f.files}
    return model, feeds


# ---------------------------------------------------------------------------- report
def _ratio(row: dict, a: str, b: str) -> float | None:
    """Median time of ``a`` over ``b`` (> 1: ``b`` faster)."""
    ca, cb = row["contenders"].get(a, {}), row["contenders"].get(b, {})
    if ca.get("median_s") and cb.get("median_s"):
        return ca["median_s"] / cb["median_s"]
    return None


def _layout(row: dict) -> str:
    lc = row.get("layout_conversions")
    return "–" if not lc else f"{lc['ops']} ({lc['alone']} alone)"


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def summary(rows: list[dict], info: dict, args) -> str:
    f2 = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    out = ["# Real-model benchmark\n",
           f"Machine: {info['cpu']}, {info['usable_cores']} usable cores, **{args.threads} "
           f"thread(s)** for every contender. TVM {info['tvm']}, onnxruntime "
           f"{info['onnxruntime']}, OpenVINO {info.get('openvino')}, torch {info['torch']}. "
           f"Median of up to {args.repeat} samples ({args.budget_s:g} s budget a model), "
           f"contenders interleaved in rotating turns with a {driver.SETTLE_S:g} s pause. "
           "Ratios are the contender's time over ours (> 1: we are faster). "
           "*: held out of tuning.\n",
           "| model | family | kernels FuseOps/ours | layout conv. | pred. ms ours | "
           "ours ms | FuseOps-plan / ours | pred. FuseOps / ours | ORT / ours | "
           "OpenVINO / ours | compile s | max rel err |",
           "|" + "---|" * 12]
    for r in rows:
        cs = r["contenders"]
        ours = cs.get("ours", {})
        k = r.get("kernels", {})
        pred = r.get("predicted") or {}
        out.append("| " + " | ".join([
            r["model"] + ("*" if r.get("held_out") else ""), r["family"],
            f"{k.get('fuseops', '–')}/{k.get('ours', '–')}", _layout(r),
            driver._ms(pred.get("predicted_time_s")),
            driver._lat(ours) if ours else "–",
            f2(_ratio(r, "fuseops", "ours")), f2(pred.get("predicted_speedup")),
            f2(_ratio(r, "onnxruntime", "ours")), f2(_ratio(r, "openvino", "ours")),
            "–" if ours.get("compile_s") is None else f"{ours['compile_s']:.0f}",
            "–" if ours.get("max_rel_err") is None else f"{ours['max_rel_err']:.1e}",
        ]) + " |")
    out.append("\n| geomean over the models timed | FuseOps-plan / ours | ORT / ours | "
               "OpenVINO / ours |\n|---|---|---|---|")
    for label, sel in (("all", rows), ("held out", [r for r in rows if r.get("held_out")]),
                       ("tuned on", [r for r in rows if not r.get("held_out")])):
        out.append(f"| {label} ({len(sel)}) | " + " | ".join(
            f2(geomean(_ratio(r, c, "ours") for r in sel))
            for c in ("fuseops", "onnxruntime", "openvino")) + " |")
    notes = [f"- {r['model']} / {n}: {c['status']}: {c['note']}" for r in rows
             for n, c in r["contenders"].items() if c.get("note")]
    notes += [f"- {r['model']}: {r['error']}" for r in rows if r.get("error")]
    if notes:
        out += ["\n## Notes\n", *notes]
    return "\n".join(out) + "\n"


def write(rows: list[dict], info: dict, args, final: bool) -> None:
    """``summary.md`` and ``results.json`` after every model; at the end the plots too."""
    if final:
        driver.CONTENDERS[:] = list(dict.fromkeys([*driver.CONTENDERS, "openvino"]))
    driver.write_results(rows, info, args, final, render=summary)


# ---------------------------------------------------------------------------- driver
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", help="registry names (default: all)")
    ap.add_argument("--family", nargs="+", help="only these families")
    ap.add_argument("--held-out", choices=["only", "exclude"], help="select by held_out")
    ap.add_argument("--list", action="store_true", help="print the registry and exit")
    ap.add_argument("--quick", action="store_true", help=f"CI mode: {', '.join(QUICK)}")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of --out/results.json and skip their models")
    ap.add_argument("--contenders", nargs="+", choices=list(PREPARE), default=CONTENDERS)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--min-repeat", type=int, default=5)
    ap.add_argument("--hw", default=None, help="fusion_tvm hardware preset for ours/fuseops")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--onnx-dir", type=Path, default=OUT / "onnx",
                    help="where exports are cached (default: benchmarks/results/real_models/onnx)")
    args = ap.parse_args(argv)
    if args.threads is None:
        args.threads = 1 if args.quick else len(os.sched_getaffinity(0))
    args.repeat = args.repeat or (10 if args.quick else 60)
    args.budget_s = args.budget_s or (4.0 if args.quick else 20.0)
    args.time_stock_anyway = False
    args.target = "llvm"
    return args


def select(specs: dict[str, Spec], args) -> list[str]:
    names = QUICK if args.quick and not args.models else (args.models or list(specs))
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; see --list")
    if args.family:
        names = [n for n in names if specs[n].family in args.family]
    if args.held_out:
        names = [n for n in names if specs[n].held_out == (args.held_out == "only")]
    return names


def bench_one(name: str, spec: Spec, args) -> dict:
    row = {"model": name, "family": spec.family, "held_out": spec.held_out}
    try:
        model, feeds = export(name, spec, args.onnx_dir)
    except ImportError as e:
        row["error"] = f"skipped: {e}"
        row["contenders"] = {}
        return row
    except Exception as e:  # an exporter / library failure, not ours
        row["error"] = f"export failed: {driver.short(e)}"
        row["contenders"] = {}
        return row
    ctx = driver.Context(args.threads, "llvm", args.hw)
    saved = dict(driver.PREPARE)
    driver.PREPARE.update(PREPARE)
    try:
        row.update(driver.bench_model(name, model, feeds, args.contenders, ctx, args))
    finally:
        driver.PREPARE.clear()
        driver.PREPARE.update(saved)
    row["model"] = name
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    specs = registry()
    if args.list:
        for name, s in specs.items():
            print(f"{name:36} {s.family:13} {'held out' if s.held_out else ''}")
        print(f"{len(specs)} models, {sum(s.held_out for s in specs.values())} held out")
        return 0
    names = select(specs, args)
    info = driver.machine_info(args.threads)
    try:
        import openvino

        info["openvino"] = openvino.__version__
    except ImportError:
        info["openvino"] = None
    rows: list[dict] = []
    if args.resume and (args.out / "results.json").exists():
        rows = [r for r in json.loads((args.out / "results.json").read_text())["models"]
                if r.get("contenders")]
        done = {r["model"] for r in rows}
        names = [n for n in names if n not in done]
    driver.progress(f"{info['cpu']}, {args.threads} thread(s); {len(names)} model(s)")
    for i, name in enumerate(names, 1):
        driver.progress(f"{i}/{len(names)} {name}")
        rows.append(bench_one(name, specs[name], args))
        write(rows, info, args, final=i == len(names))
    bad = [f"{r['model']}/{n}: {c['status']}" for r in rows for n, c in r["contenders"].items()
           if n in ("ours", "fuseops") and c["status"] in ("failed", "mismatch")]
    if bad:
        driver.progress("FAILED: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
