"""ONNX model → Relax IRModule, with errors that name the file, the operator and the node.

The conversion itself is TVM's Relax ONNX importer, run through a thin subclass that takes its
converters from :func:`.overrides.converter_map` and turns failures inside a converter into
:class:`~fusion_tvm.errors.UnsupportedOperatorError` naming the node. Before conversion the graph
is checked here (operators against the converter map, every tensor a node reads against what is
defined before it), so a user error never surfaces as a TVM traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from tvm import IRModule, relax
from tvm.relax.frontend.onnx import onnx_frontend as _stock

from ..errors import (
    FusionTVMError,
    InternalError,
    ModelLoadError,
    UnsupportedOperatorError,
    UserInputError,
)
from ..origins import Origins, import_origins
from .onnx_fold import fold_constants
from .overrides import converter_map

# Op types the stock importer handles outside its converter map.
_DIRECT_OPS = frozenset({"If"})
_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
#: Non-standard domains whose ops TVM's importer implements (contrib fused ops).
_CONTRIB_DOMAINS = frozenset({"com.microsoft"})
_MIN_IR_VERSION = 3  # the importer's own floor (ONNX 1.1)

Dim = int | str
ShapeDict = Mapping[str, Sequence[Dim]]


def read_onnx(model: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Read a model from a path, or take a ``ModelProto`` as is.

    Returns
    -------
    (model, where)
        The model and a short description of where it came from, used in error messages.

    Raises
    ------
    ModelLoadError
        The file is missing, unreadable, not ONNX, or truncated. The message names the path.
    """
    if isinstance(model, onnx.ModelProto):
        where = f"ONNX model '{model.graph.name}'" if model.graph.name else "ONNX model"
        _check_header(model, where)
        return model, where

    path = Path(model)
    where = str(path)
    if not path.exists():
        raise ModelLoadError(f"model file not found: {where}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {where}")
    try:
        proto = onnx.load(where)
    except DecodeError as err:
        raise ModelLoadError(
            f"{where}: not a readable ONNX model (the file is truncated or not ONNX): {err}"
        ) from None
    except Exception as err:  # noqa: BLE001 - e.g. a missing external-data file
        raise ModelLoadError(f"{where}: cannot load ONNX model: {_one_line(err)}") from None
    _check_header(proto, where)
    return proto, where


def _check_header(model: onnx.ModelProto, where: str) -> None:
    # Protobuf parses an empty (or lucky) byte string into an empty message without error.
    if not model.HasField("graph") or model.ir_version == 0:
        raise ModelLoadError(f"{where}: not an ONNX model (no graph or IR version)")
    if model.ir_version < _MIN_IR_VERSION:
        raise ModelLoadError(
            f"{where}: ONNX IR version {model.ir_version} is too old "
            f"(the importer needs {_MIN_IR_VERSION} or newer)"
        )


def model_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset the model was exported with (1 if it declares none)."""
    for entry in model.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    return 1


def graph_input_names(graph: onnx.GraphProto) -> list[str]:
    """Graph inputs that are real inputs (older exporters also list initializers as inputs)."""
    inits = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in inits]


def check_graph(graph: onnx.GraphProto, where: str, outer: Iterable[str] = ()) -> None:
    """Check operators and tensor wiring before conversion.

    Raises
    ------
    UnsupportedOperatorError
        A node's op type has no converter (naming op type and node).
    UserInputError
        A node reads a tensor nothing defines (a missing initializer or dangling input), an
        initializer has no name, or a graph output is never produced.
    """
    table = converter_map()
    defined = set(outer)
    for init in graph.initializer:
        if not init.name.strip():
            raise UserInputError(f"{where}: graph '{graph.name}' has an initializer with no name")
        defined.add(init.name)
    defined.update(i.name for i in graph.input)
    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS and node.domain not in _CONTRIB_DOMAINS:
            # the importer matches op types by name only: a custom-domain op must not be
            # silently converted as the standard op of the same name
            raise UnsupportedOperatorError(node.op_type, node.name, f"domain '{node.domain}'")
        if node.op_type not in table and node.op_type not in _DIRECT_OPS:
            detail = "" if node.domain in _DEFAULT_DOMAINS else f"domain '{node.domain}'"
            raise UnsupportedOperatorError(node.op_type, node.name, detail or f"in {where}")
        if node.op_type == "BatchNormalization" and any(
                a.name == "training_mode" and a.i for a in node.attribute):
            # the inference passes (DecomposeOpsForInference, the conv fold) normalise with
            # the running statistics: training mode would give silently wrong outputs
            raise UnsupportedOperatorError(
                node.op_type, node.name, "training_mode=1 (fusion_tvm compiles for inference)")
        for name in node.input:
            if name and name not in defined:
                raise UserInputError(
                    f"{where}: node '{node.name}' ({node.op_type}) reads tensor '{name}', which "
                    "is not a graph input, an initializer or the output of an earlier node "
                    "(missing initializer or dangling input?)"
                )
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                check_graph(sub, where, defined)
        defined.update(o for o in node.output if o)
    for out in graph.output:
        if out.name not in defined:
            raise UserInputError(f"{where}: graph output '{out.name}' is never produced")


def _name_unnamed_nodes(graph: onnx.GraphProto) -> None:
    # Converter errors name the node; an empty name would say nothing, so give one.
    for index, node in enumerate(graph.node):
        if not node.name:
            first = node.output[0] if node.output else "?"
            node.name = f"#{index} {node.op_type} -> {first}"


def _name_unknown_dims(graph: onnx.GraphProto) -> None:
    # The importer makes one tir variable per dim_param, and one shared variable for *all*
    # unnamed dynamic dims, which would tie unrelated dims together. Name each one apart.
    for name in graph_input_names(graph):
        info = next(i for i in graph.input if i.name == name)
        base = re.sub(r"\W", "_", name)
        base = base if base[:1].isalpha() else f"input_{base}"
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if not dim.dim_param and not dim.dim_value:
                dim.dim_param = f"{base}_dim{axis}"


def _apply_shape_dict(graph: onnx.GraphProto, shape_dict: ShapeDict, where: str) -> None:
    # Rewriting the declared input shapes (rather than passing shape_dict to the importer)
    # keeps a string dim shared with other inputs' dim_params as one symbolic variable.
    inputs = {i.name: i for i in graph.input}
    real = set(graph_input_names(graph))
    for name, dims in shape_dict.items():
        if name not in real:
            raise UserInputError(
                f"{where}: shape_dict names '{name}', which is not a model input "
                f"(inputs: {sorted(real)})"
            )
        shape = inputs[name].type.tensor_type.shape
        shape.ClearField("dim")
        for dim in dims:
            entry = shape.dim.add()
            if isinstance(dim, str):
                entry.dim_param = dim
            elif isinstance(dim, int) and dim >= 0:
                entry.dim_value = dim
            else:
                raise UserInputError(
                    f"{where}: shape_dict['{name}'] has dim {dim!r}; use a non-negative int "
                    "or a string for a symbolic dim"
                )


def _check_dtype_dict(graph: onnx.GraphProto, dtype_dict: Mapping[str, str], where: str) -> None:
    real = set(graph_input_names(graph))
    for name in dtype_dict:
        if name not in real:
            raise UserInputError(
                f"{where}: dtype_dict names '{name}', which is not a model input "
                f"(inputs: {sorted(real)})"
            )


def _run_checker(model: onnx.ModelProto, where: str) -> None:
    # TVM imports many models the checker rejects (newer IR versions, contrib domains), so a
    # checker complaint is a warning; our own check_graph raises on the real wiring errors.
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        warnings.warn(f"{where}: onnx.checker: {err}", stacklevel=3)


class _Importer(_stock.ONNXGraphImporter):
    """The stock graph importer with our converter map and node-naming errors."""

    def __init__(self, dtype_dict, table):
        super().__init__(None, dtype_dict, keep_params_in_input=False, sanitize=True)
        self._table = table
        self.origins: Origins = {}

    def from_onnx(self, graph, opset):
        mod = super().from_onnx(graph, opset)
        # which bindings each node emitted: the plan names its ops by their ONNX nodes
        nodes = [(n.name, [self._nodes.get(o) for o in n.output if o]) for n in graph.node]
        self.origins = import_origins(mod["main"], nodes)
        return mod

    def _check_for_unsupported_ops(self, graph):
        # check_graph has already done this, against our (overridden) map.
        pass

    def _convert_operator(self, op_name, inputs, attrs, opset):
        node_name = attrs["tvm_custom"]["name"]
        converter = self._table.get(op_name)
        if converter is None:
            raise UnsupportedOperatorError(op_name, node_name)
        # The stock converters special-case literal shape expressions (Gather / Slice /
        # Concat of a ``Shape`` output); a shape that went through a binding reached them as
        # a variable ("shape_of expects a tensor input", "Slice requires a statically known
        # input rank": dynamic GPT-NeoX export). A shape whose dims are known is literal;
        # one whose dims are not is what ONNX says a Shape output is, an int64 tensor.
        for k, value in enumerate(inputs):
            ty = getattr(value, "ty", None)
            if isinstance(ty, relax.ShapeType) and not isinstance(value, relax.ShapeExpr):
                inputs[k] = relax.ShapeExpr(ty.values) if ty.values is not None else \
                    self.bb.normalize(relax.op.shape_to_tensor(value))
        try:
            expr = converter.get_converter(opset)(
                self.bb, inputs, attrs, [self._nodes, self._params]
            )
            if isinstance(expr, relax.Expr):
                expr = self.bb.normalize(expr)
        except FusionTVMError:
            raise
        except Exception as err:  # noqa: BLE001 - any converter failure is reported per node
            raise UnsupportedOperatorError(
                op_name, node_name, f"the Relax importer failed: {_one_line(err)}"
            ) from None
        return expr


def _one_line(err: BaseException, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def convert_onnx(
    model: onnx.ModelProto,
    where: str,
    shape_dict: ShapeDict | None = None,
    dtype_dict: Mapping[str, str] | None = None,
) -> tuple[IRModule, Origins]:
    """Check ``model`` and convert it to a Relax IRModule (params embedded as constants),
    with the ONNX node(s) each binding of ``main`` came from (:mod:`fusion_tvm.origins`).

    ``model`` is not modified. ``where`` names the model in error messages.
    """
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    graph = proto.graph
    _name_unnamed_nodes(graph)
    if shape_dict:
        _apply_shape_dict(graph, shape_dict, where)
    _name_unknown_dims(graph)
    if dtype_dict:
        _check_dtype_dict(graph, dtype_dict, where)
    check_graph(graph, where)
    _run_checker(proto, where)
    fold_constants(proto)  # shape arithmetic on static shapes, as onnxruntime folds it

    importer = _Importer(dict(dtype_dict or {}), converter_map())
    # The stock importer prints the failing node's inputs to stdout before re-raising; our
    # error already names the node, so keep that noise off the user's terminal.
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            # LoadedModel keeps the ONNX names, so the importer's renaming notes are noise.
            warnings.filterwarnings("ignore", message="Renaming name")
            mod = importer.from_onnx(graph, model_opset(proto))
        sys.stdout.write(printed.getvalue())  # anything else it says on success still shows
        return mod, importer.origins
    except FusionTVMError:
        raise
    except Exception as err:  # noqa: BLE001 - failures outside a converter are TVM's
        raise InternalError(f"{where}: the Relax ONNX importer failed: {_one_line(err)}") from None
