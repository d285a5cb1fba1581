"""Model files → Relax IRModule, with our own clear errors.

>>> loaded = load_model("bert.onnx")          # or an onnx.ModelProto, or a tvm.IRModule
>>> loaded.mod, loaded.input_names, loaded.input_shapes
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
from tvm import IRModule

from ..errors import UserInputError
from .loaded import LoadedModel, describe, from_irmodule
from .onnx_loader import ShapeDict, convert_onnx, graph_input_names, read_onnx

__all__ = ["LoadedModel", "from_irmodule", "load_model", "load_torch"]


def load_model(
    model: str | os.PathLike | onnx.ModelProto | IRModule,
    shape_dict: ShapeDict | None = None,
    dtype_dict: Mapping[str, str] | None = None,
) -> LoadedModel:
    """Load a model into a Relax IRModule.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto or tvm.IRModule
        An ONNX file, an ONNX model in memory, or a Relax module (taken as is; it must have a
        Relax function ``main``).
    shape_dict : dict of str to sequence of (int or str), optional
        ONNX only: replace the declared shape of some inputs. A string dim stays symbolic and
        is shared with every other dim of the same name.
    dtype_dict : dict of str to str, optional
        ONNX only: override the declared dtype of some inputs.

    Returns
    -------
    LoadedModel

    Raises
    ------
    ModelLoadError
        The file is missing, not ONNX, or truncated.
    UnsupportedOperatorError
        An operator (named with its node) cannot be converted.
    UserInputError
        The graph reads an undefined tensor, or the arguments are inconsistent.
    """
    if isinstance(model, IRModule):
        if shape_dict or dtype_dict:
            raise UserInputError("shape_dict / dtype_dict apply to ONNX models, not an IRModule")
        return from_irmodule(model, source="irmodule")
    if isinstance(model, str | os.PathLike | onnx.ModelProto):
        proto, where = read_onnx(model)
        mod, origins = convert_onnx(proto, where, shape_dict, dtype_dict)
        loaded = describe(
            mod, "onnx", graph_input_names(proto.graph), [o.name for o in proto.graph.output]
        )
        return dataclasses.replace(loaded, origins=origins)
    raise UserInputError(
        f"cannot load a model from {type(model).__name__}: give an ONNX path, an "
        "onnx.ModelProto or a tvm.IRModule (torch modules go through load_torch)"
    )


def load_torch(module: Any, example_inputs: Sequence[Any], dynamic_shapes: Any = None):
    """Load a ``torch.nn.Module`` through ``torch.export``; see :mod:`.torch_loader`."""
    from .torch_loader import load_torch as _load_torch

    return _load_torch(module, example_inputs, dynamic_shapes)
