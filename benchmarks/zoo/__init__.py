"""A model zoo generated locally: ONNX built with ``onnx.helper``, fixed seeds, no downloads.

>>> from benchmarks import zoo
>>> model = zoo.get_model("bert_2l", seq=16, dynamic=True)
>>> feeds = zoo.example_inputs(model, S=16)

Every entry is a preset: a builder plus default keyword arguments; ``get_model(name, **kw)``
overrides them (``batch``, ``seq``, ``layers``, ``image``, ``dynamic`` ... as the builder takes).
``small_kwargs(name)`` gives test-sized dimensions with the same graph structure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from .cnn import mobilenet_v2, resnet
from .detection import detection_head
from .mlp import mlp
from .transformer import bert, gpt2, vit

__all__ = ["ModelSpec", "default_dims", "example_inputs", "get_model", "get_spec",
           "input_shapes", "list_models", "register_model", "small_kwargs"]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: ``builder(**defaults, **overrides)`` returns the ONNX model."""

    name: str
    builder: Callable[..., onnx.ModelProto]
    defaults: dict = field(default_factory=dict)
    small: dict = field(default_factory=dict)  # test-sized overrides, same graph structure
    family: str = ""
    large: bool = False  # slow to compile / run unscheduled: skipped by quick runs


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(name: str, builder, defaults=None, small=None, family="", large=False):
    """Add a preset to the zoo; duplicates are refused."""
    if name in _REGISTRY:
        raise ValueError(f"zoo model {name!r} is already registered")
    _REGISTRY[name] = ModelSpec(name, builder, dict(defaults or {}), dict(small or {}), family,
                                large)
    return _REGISTRY[name]


_TINY_TRANSFORMER = {"hidden": 64, "heads": 4, "vocab": 1000, "max_pos": 64, "seq": 16,
                     "layers": 1}
register_model("mlp", mlp, family="mlp", small={"sizes": (64, 32, 16, 10)})
register_model("detection_head", detection_head, family="cnn", small={"image": 32, "width": 4})
register_model("resnet18", resnet, {"depth": 18}, {"image": 32, "width": 8}, "cnn")
register_model("resnet50", resnet, {"depth": 50}, {"image": 32, "width": 8}, "cnn", large=True)
register_model("mobilenetv2", mobilenet_v2, {}, {"image": 32, "width_mult": 0.25}, "cnn",
               large=True)
register_model("bert_base", bert, {"layers": 12, "seq": 128},
               {**_TINY_TRANSFORMER, "ffn": 128}, "transformer", large=True)
register_model("bert_2l", bert, {"layers": 2, "seq": 128}, {**_TINY_TRANSFORMER, "ffn": 128},
               "transformer")
register_model("bert_2l_s16", bert, {"layers": 2, "seq": 16}, {**_TINY_TRANSFORMER, "ffn": 128},
               "transformer")
register_model("gpt2", gpt2, {"layers": 12, "seq": 128}, _TINY_TRANSFORMER, "transformer",
               large=True)
register_model("gpt2_2l", gpt2, {"layers": 2, "seq": 128}, _TINY_TRANSFORMER, "transformer")
register_model("vit_tiny", vit, {}, {"layers": 1, "image": 32, "patch": 8, "hidden": 64,
                                     "heads": 2, "mlp": 128, "classes": 10}, "transformer",
               large=True)


def list_models() -> list[str]:
    """Names of every zoo preset, in registration order (small models first)."""
    return list(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(_REGISTRY)}") from None


def small_kwargs(name: str) -> dict:
    """Test-sized overrides for ``name`` (same operators, tiny dimensions)."""
    return dict(get_spec(name).small)


def get_model(name: str, **kw) -> onnx.ModelProto:
    """Build the zoo model ``name``; keyword arguments override the preset's defaults.

    Common keywords: ``batch`` (1 or 8), ``dynamic`` (dim_param ``N`` for batch and ``S`` for
    sequence), ``seed``; transformers also take ``seq``, ``layers``, ``hidden``, ``heads``;
    CNNs ``image`` and ``width`` / ``width_mult``. ``small=True`` applies ``small_kwargs``.
    """
    spec = get_spec(name)
    args = dict(spec.defaults)
    if kw.pop("small", False):
        args.update(spec.small)
    args.update(kw)
    return spec.builder(**args)


_NP_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64,
             onnx.TensorProto.INT32: np.int32, onnx.TensorProto.BOOL: np.bool_}


def _meta(model: onnx.ModelProto, key: str) -> dict:
    for prop in model.metadata_props:
        if prop.key == key:
            return json.loads(prop.value)
    return {}


def default_dims(model: onnx.ModelProto) -> dict[str, int]:
    """Sizes the model was built for, by symbolic dim name ({} for a static model)."""
    return dict(_meta(model, "zoo.default_dims"))


def input_shapes(model: onnx.ModelProto, **dims) -> dict[str, tuple[int, ...]]:
    """Concrete input shapes, resolving symbolic dims from ``dims`` or the model's defaults."""
    sizes = {"N": 1, "S": 16, **_meta(model, "zoo.default_dims"), **dims}
    init = {t.name for t in model.graph.initializer}
    shapes = {}
    for inp in model.graph.input:
        if inp.name in init:
            continue
        shape = []
        for d in inp.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in sizes:
                shape.append(int(sizes[d.dim_param]))
            else:
                raise ValueError(f"input {inp.name}: give a size for dim {d.dim_param!r}")
        shapes[inp.name] = tuple(shape)
    return shapes


def example_inputs(model: onnx.ModelProto, seed: int = 0, **dims) -> dict[str, np.ndarray]:
    """Random feeds for ``model``: images ~ N(0, 1), token ids in range, valid 0/1 masks.

    ``dims`` sizes the symbolic dimensions (``N=8, S=64``); a mask keeps its first row full and
    pads the other rows at the end (at least one attended token per row).
    """
    rng = np.random.default_rng(seed)
    kinds = _meta(model, "zoo.input_kinds")
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    feeds = {}
    for name, shape in input_shapes(model, **dims).items():
        kind = kinds.get(name, "float")
        dtype = _NP_TYPES[types[name]]
        if kind.startswith("ids:"):
            feeds[name] = rng.integers(0, int(kind[4:]), size=shape).astype(dtype)
        elif kind == "mask":
            n, s = shape
            lengths = rng.integers(max(1, s // 2), s + 1, size=n)
            lengths[0] = s
            feeds[name] = (np.arange(s)[None, :] < lengths[:, None]).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds
