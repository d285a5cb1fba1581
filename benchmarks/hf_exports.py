"""Real exports: tiny Hugging Face models through torch.onnx, compiled, vs onnxruntime.

    python benchmarks/hf_exports.py                        # every model, every export mode
    python benchmarks/hf_exports.py --models swin llama --modes legacy dynamic

Each architecture is built from a small config with seeded random weights (no download;
convolution and BatchNorm weights re-drawn so activations neither vanish nor saturate),
exported with the TorchScript exporter (``legacy``), the same with dynamic batch and
sequence axes (``dynamic``, text models) and the ``torch.export``-based exporter
(``dynamo``), then compiled with ``fusion_tvm.compile`` and run against onnxruntime (two
input shapes for the dynamic exports). Prints a table and writes
``benchmarks/results/hf_exports.json``. Needs ``torch`` and ``transformers`` (and
``onnxscript`` for ``dynamo``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hf_exports.json"
MODES = ("legacy", "dynamic", "dynamo")


def _text(config_cls, model_cls, **kw):
    import torch

    inner = model_cls(config_cls(**kw)).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids).last_hidden_state

    return LastHidden(), torch.randint(0, 100, (2, 16)), "input_ids"


def _image(config_cls, model_cls, size=64, **kw):
    import torch

    model = model_cls(config_cls(**kw)).eval()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
            elif isinstance(mod, torch.nn.Conv2d):
                mod.weight.normal_(0, (2.0 / mod.weight[0].numel()) ** 0.5)
    return model, torch.randn(1, 3, size, size), "pixel_values"


def _whisper():
    import torch
    import transformers as T

    config = T.WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2,
                             encoder_attention_heads=4, encoder_ffn_dim=128,
                             max_source_positions=8, decoder_layers=1,
                             decoder_attention_heads=4)
    return T.WhisperModel(config).get_encoder().eval(), torch.randn(1, 16, 16), \
        "input_features"


def models() -> dict:
    """name -> (builder, is_text)."""
    import transformers as T

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4)
    return {
        "llama": (lambda: _text(T.LlamaConfig, T.LlamaModel, vocab_size=100,
                                num_key_value_heads=4, max_position_embeddings=64, **small),
                  True),
        "distilbert": (lambda: _text(T.DistilBertConfig, T.DistilBertModel, vocab_size=100,
                                     dim=64, hidden_dim=128, n_layers=2, n_heads=4), True),
        "roberta": (lambda: _text(T.RobertaConfig, T.RobertaModel, vocab_size=100, **small),
                    True),
        "t5_encoder": (lambda: _text(T.T5Config, T.T5EncoderModel, vocab_size=100, d_model=64,
                                     d_kv=16, d_ff=128, num_layers=2, num_heads=4), True),
        "gpt_neox": (lambda: _text(T.GPTNeoXConfig, T.GPTNeoXModel, vocab_size=100, **small),
                     True),
        "bert": (lambda: _text(T.BertConfig, T.BertModel, vocab_size=100, **small), True),
        "albert": (lambda: _text(T.AlbertConfig, T.AlbertModel, vocab_size=100,
                                 embedding_size=32, **small), True),
        "electra": (lambda: _text(T.ElectraConfig, T.ElectraModel, vocab_size=100,
                                  embedding_size=32, **small), True),
        "deberta_v2": (lambda: _text(T.DebertaV2Config, T.DebertaV2Model, vocab_size=100,
                                     **small), True),
        "mpnet": (lambda: _text(T.MPNetConfig, T.MPNetModel, vocab_size=100, **small), True),
        "gpt2": (lambda: _text(T.GPT2Config, T.GPT2Model, vocab_size=100, n_embd=64, n_layer=2,
                               n_head=4), True),
        "opt": (lambda: _text(T.OPTConfig, T.OPTModel, vocab_size=100, hidden_size=64,
                              ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                              word_embed_proj_dim=64), True),
        "bloom": (lambda: _text(T.BloomConfig, T.BloomModel, vocab_size=100, hidden_size=64,
                                n_layer=2, n_head=4), True),
        "falcon": (lambda: _text(T.FalconConfig, T.FalconModel, vocab_size=100, hidden_size=64,
                                 num_hidden_layers=2, num_attention_heads=4), True),
        "mistral": (lambda: _text(T.MistralConfig, T.MistralModel, vocab_size=100,
                                  num_key_value_heads=4, **small), True),
        "qwen2": (lambda: _text(T.Qwen2Config, T.Qwen2Model, vocab_size=100,
                                num_key_value_heads=4, **small), True),
        "phi": (lambda: _text(T.PhiConfig, T.PhiModel, vocab_size=100, **small), True),
        "whisper_encoder": (_whisper, False),
        "vit": (lambda: _image(T.ViTConfig, T.ViTModel, size=32, image_size=32, patch_size=8,
                               **small), False),
        "swin": (lambda: _image(T.SwinConfig, T.SwinModel, image_size=64, embed_dim=16,
                                depths=[1, 1], num_heads=[2, 4], window_size=4), False),
        "convnext": (lambda: _image(T.ConvNextConfig, T.ConvNextModel,
                                    hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), False),
        "resnet": (lambda: _image(T.ResNetConfig, T.ResNetModel, embedding_size=16,
                                  hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), False),
        "mobilenet_v2": (lambda: _image(T.MobileNetV2Config, T.MobileNetV2Model,
                                        image_size=64), False),
        "efficientnet": (lambda: _image(T.EfficientNetConfig, T.EfficientNetModel,
                                        image_size=64, depth_coefficient=0.25), False),
        "mobilevit": (lambda: _image(T.MobileViTConfig, T.MobileViTModel, image_size=64), False),
        "segformer": (lambda: _image(T.SegformerConfig, T.SegformerModel,
                                     hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                     decoder_hidden_size=64), False),
    }


def check(name: str, build, mode: str, folder: Path) -> dict:
    """Export one model in one mode, compile it, compare with onnxruntime."""
    import onnxruntime as ort
    import torch

    import fusion_tvm

    torch.manual_seed(0)
    row = {"model": name, "mode": mode}
    path = folder / f"{name}_{mode}.onnx"
    try:
        model, example, input_name = build()
        axes = {input_name: {0: "batch", 1: "sequence"}} if mode == "dynamic" else None
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), str(path), input_names=[input_name],
                              opset_version=18 if mode == "dynamo" else 17,
                              dynamo=mode == "dynamo", dynamic_axes=axes)
    except Exception as err:  # noqa: BLE001 - the exporter's failure, not ours
        row.update(status="export failed", detail=f"{type(err).__name__}: {err}"[:200])
        return row
    feeds = [{input_name: example.numpy()}]
    if mode == "dynamic":
        feeds.append({input_name: np.random.default_rng(1).integers(0, 100, (3, 11))})
    try:
        start = time.perf_counter()
        cm = fusion_tvm.compile(str(path))
        row["compile_s"] = round(time.perf_counter() - start, 2)
        row["kernels"] = cm.num_kernels
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        errs = []
        for feed in feeds:
            for got, want in zip(cm.run(feed), sess.run(None, feed), strict=True):
                errs.append(float(np.abs(got - want).max() / (np.abs(want).max() + 1e-12)))
        row["max_rel_err"] = max(errs)
        row["status"] = "ok" if max(errs) < 1e-3 else "mismatch"
    except Exception as err:  # noqa: BLE001 - reported per model
        row.update(status="failed", detail=f"{type(err).__name__}: {err}"[:300])
        traceback.print_exc(limit=2)
    return row


def main(argv: list[str] | None = None) -> int:
    table = models()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(table), choices=list(table))
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            build, is_text = table[name]
            for mode in args.modes:
                if mode == "dynamic" and not is_text:
                    continue
                row = check(name, build, mode, Path(tmp))
                rows.append(row)
                print(f"{name:16} {mode:8} {row['status']:13} kernels={row.get('kernels', '-')!s:4}"
                      f" compile={row.get('compile_s', '-')!s:5}s"
                      f" max rel err={row.get('max_rel_err', float('nan')):.1e}"
                      f" {row.get('detail', '')}", flush=True)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} ok")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "when": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
