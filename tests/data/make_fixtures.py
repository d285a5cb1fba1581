"""Regenerate the ONNX fixtures under tests/data.

Needs ``torch==2.13.0`` and ``transformers`` (the tests themselves need neither). The models
are built from tiny configs with seeded random weights (no downloads) and exported with the
TorchScript exporter (``dynamo=False``) the way most users still export them: dynamic batch and
sequence axes, and, for the CNN, ``do_constant_folding=False`` with ``TrainingMode.PRESERVE``
so the BatchNormalization nodes survive the export. The transformer models keep the library's
default attention implementation (SDPA), since that is what a user's export contains.
``bert_tiny_dynamo`` is the same BERT through the default ``torch.export``-based exporter
(``dynamo=True``, needs ``onnxscript``), which writes a different graph.

Usage::

    python tests/data/make_fixtures.py            # all fixtures
    python tests/data/make_fixtures.py bert_tiny  # one fixture
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import onnx
import torch

HERE = Path(__file__).resolve().parent
OPSET = 17
DYNAMO_OPSET = 18
MAX_BYTES = 500 * 1024


class SmallCNN(torch.nn.Module):
    """Conv-BN-ReLU twice, pooling and a classifier: what a vision export looks like."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class _Wrapper(torch.nn.Module):
    """Fixes the positional signature and returns plain tensors (HF outputs are dicts)."""

    def __init__(self, model: torch.nn.Module, arg_names: list[str], outputs: list[str]) -> None:
        super().__init__()
        self.model = model
        self.arg_names = arg_names
        self.outputs = outputs

    def forward(self, *args: torch.Tensor):
        out = self.model(**dict(zip(self.arg_names, args, strict=True)), use_cache=False)
        return tuple(getattr(out, name) for name in self.outputs)


def _randomize_bn(model: torch.nn.Module) -> None:
    # Fresh BatchNorm has mean 0 / var 1, which would hide a wrong-statistics bug.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)


def _export(model, args, path: Path, input_names, output_names, dynamic_axes, **kw) -> None:
    model.eval()
    kw.setdefault("dynamo", False)
    if kw["dynamo"]:
        # The torch.export-based exporter takes torch.export dims instead of dynamic_axes.
        dims = {
            name: torch.export.Dim(name) for axes in dynamic_axes.values() for name in axes.values()
        }
        kw["dynamic_shapes"] = {
            "args": tuple(
                {i: dims[n] for i, n in dynamic_axes[name].items()} for name in input_names
            )
        }
        kw["external_data"] = False
        kw.setdefault("opset_version", DYNAMO_OPSET)  # its lowest; no version conversion
        dynamic_axes = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            **{"opset_version": OPSET, **kw},
        )
    proto = onnx.load(str(path))
    if kw["dynamo"]:
        # Per-node debug metadata (FX node, stack, class hierarchy) is ~70% of the file; the
        # graph itself is left exactly as exported.
        for node in proto.graph.node:
            node.ClearField("metadata_props")
        onnx.save(proto, str(path))
    onnx.checker.check_model(proto)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{path.name} is {size} bytes, over the {MAX_BYTES} byte fixture limit")
    ops = sorted({n.op_type for n in proto.graph.node})
    print(f"{path.name}: {size} bytes, {len(proto.graph.node)} nodes, ops {ops}")


def make_cnn_bn() -> None:
    model = SmallCNN()
    with torch.no_grad():
        _randomize_bn(model)
    _export(
        model,
        (torch.randn(2, 3, 16, 16),),
        HERE / "cnn_bn.onnx",
        ["input"],
        ["logits"],
        {"input": {0: "batch"}, "logits": {0: "batch"}},
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.PRESERVE,
    )


_SEQ_AXES = {0: "batch", 1: "sequence"}


def _export_hf(model, inputs: dict, outputs: list[str], dynamic_axes: dict, name: str, **kw):
    wrapper = _Wrapper(model, list(inputs), outputs)
    _export(
        wrapper,
        tuple(inputs.values()),
        HERE / f"{name}.onnx",
        list(inputs),
        outputs,
        dynamic_axes,
        **kw,
    )


def _ids_and_mask(batch: int, seq: int, pad_from: int):
    ids = torch.randint(0, 100, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, pad_from:] = 0  # one padded row, so the mask matters
    return ids, mask


def make_bert_tiny(name: str = "bert_tiny", **kw) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=64,
    )
    ids, mask = _ids_and_mask(2, 8, 5)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    axes = {name: _SEQ_AXES for name in inputs}
    axes.update(last_hidden_state=_SEQ_AXES, pooler_output={0: "batch"})
    outputs = ["last_hidden_state", "pooler_output"]
    _export_hf(BertModel(config), inputs, outputs, axes, name, **kw)


def make_bert_tiny_dynamo() -> None:
    make_bert_tiny("bert_tiny_dynamo", dynamo=True)


def _gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        vocab_size=100,
        bos_token_id=0,
        eos_token_id=0,
    )


def make_gpt2_tiny() -> None:
    from transformers import GPT2Model

    ids, mask = _ids_and_mask(2, 8, 6)
    inputs = {"input_ids": ids, "attention_mask": mask}
    axes = {name: _SEQ_AXES for name in [*inputs, "last_hidden_state"]}
    _export_hf(GPT2Model(_gpt2_config()), inputs, ["last_hidden_state"], axes, "gpt2_tiny")


class _GPT2DecodeStep(torch.nn.Module):
    """One decoding step with a KV cache, flattened to tensors in and out (past.i.key, ...)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.last_hidden_state, *present)


def make_gpt2_tiny_past() -> None:
    from transformers import GPT2Model

    config = _gpt2_config()
    head_dim = config.n_embd // config.n_head
    kv = [
        f"{k}.{i}.{t}" for k in ("past",) for i in range(config.n_layer) for t in ("key", "value")
    ]
    present = [name.replace("past", "present") for name in kv]
    args = (
        torch.randint(0, 100, (2, 1)),
        torch.ones(2, 5, dtype=torch.int64),
        *(torch.randn(2, config.n_head, 4, head_dim) for _ in kv),
    )
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "last_hidden_state": {0: "batch", 1: "sequence"},
        **{name: {0: "batch", 2: "past_sequence"} for name in kv},
        **{name: {0: "batch", 2: "total_sequence"} for name in present},
    }
    _export(
        _GPT2DecodeStep(GPT2Model(config)),
        args,
        HERE / "gpt2_tiny_past.onnx",
        ["input_ids", "attention_mask", *kv],
        ["last_hidden_state", *present],
        axes,
    )


def make_t5_tiny() -> None:
    from transformers import T5Config, T5Model

    config = T5Config(
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        vocab_size=100,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    ids, mask = _ids_and_mask(2, 8, 5)
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": torch.randint(0, 100, (2, 4)),
    }
    dec_axes = {0: "batch", 1: "decoder_sequence"}
    axes = {
        "input_ids": _SEQ_AXES,
        "attention_mask": _SEQ_AXES,
        "decoder_input_ids": dec_axes,
        "last_hidden_state": dec_axes,
    }
    _export_hf(T5Model(config), inputs, ["last_hidden_state"], axes, "t5_tiny")


def make_swin_tiny() -> None:
    """Swin, static 32 x 32 image: its window partition reshapes to targets computed from
    ``Shape`` nodes (folded before import: onnx_fold)."""
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                        num_heads=[2, 4], window_size=4)
    inputs = {"pixel_values": torch.randn(1, 3, 32, 32)}
    _export_hf(SwinModel(config), inputs, ["last_hidden_state"], {}, "swin_tiny")


class _LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state  # use_cache=False: aten::diff


def make_gpt_neox_tiny() -> None:
    """GPT-NeoX, dynamic batch and sequence: its rotary slices are bounded by values read
    off partly symbolic shapes (``x.shape[-1]``), and shapes reach Gather / Slice through
    bindings."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    config = GPTNeoXConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64)
    _export(_LastHidden(GPTNeoXModel(config)), (torch.randint(0, 100, (2, 16)),),
            HERE / "gpt_neox_tiny.onnx", ["input_ids"], ["last_hidden_state"],
            {"input_ids": _SEQ_AXES, "last_hidden_state": _SEQ_AXES})


FIXTURES = {
    "cnn_bn": make_cnn_bn,
    "gpt_neox_tiny": make_gpt_neox_tiny,
    "swin_tiny": make_swin_tiny,
    "bert_tiny": make_bert_tiny,
    "bert_tiny_dynamo": make_bert_tiny_dynamo,
    "gpt2_tiny": make_gpt2_tiny,
    "gpt2_tiny_past": make_gpt2_tiny_past,
    "t5_tiny": make_t5_tiny,
}


def main(names: list[str]) -> None:
    for name in names or FIXTURES:
        torch.manual_seed(0)
        FIXTURES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
