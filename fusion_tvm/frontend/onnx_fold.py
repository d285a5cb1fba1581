"""Fold an ONNX graph's shape computations whose values are known before import.

Exporters (``torch.onnx`` legacy and dynamo, tf2onnx) compute reshape targets, paddings,
slice bounds and masks at run time from ``Shape`` nodes even when every input shape is
static: ``Shape -> Gather -> Concat -> Reshape``, TF-style "same" padding, window
partitions. TVM's Relax importer needs many of those values as constants ("Dynamic pads
are not supported yet", "Reshape expects the input tensor to have known shape"), and where
it does not they become run-time shape arithmetic between kernels. onnxruntime folds them
when it loads a model; so do we, before import:

* a ``Shape`` (or the part its start/end selects) / ``Size`` whose dims are static is its
  value;
* a node whose inputs are all known constants is evaluated (``onnx.reference``), when it
  is deterministic, has no subgraph, is in the default domain and its outputs are small;
* shape inference runs again after each round, since a folded reshape target makes more
  shapes static, until nothing more folds.

Nothing that depends on a symbolic dimension or on a graph input's values is folded.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

#: Outputs larger than this (elements) are left to run time: folding is for shape-like
#: values and masks, not for precomputing weights.
MAX_FOLDED_ELEMENTS = 1 << 16
#: Rounds of fold + shape inference.
MAX_ROUNDS = 8
_NONDETERMINISTIC = ("Random", "Multinomial", "Bernoulli")


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Tensor name -> shape (None for a dim not known statically), for every tensor whose
    rank shape inference knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - an uninferable model is simply not folded
        return {}
    graph = inferred.graph
    shapes: dict[str, list[int]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        ttype = info.type.tensor_type
        if not ttype.HasField("shape"):
            continue
        shapes[info.name] = [int(d.dim_value) if d.HasField("dim_value") else None
                             for d in ttype.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _shape_entries(node: onnx.NodeProto, shape: list[int | None]) -> list[int | None]:
    """The dims a ``Shape`` node returns (its start/end applied), None where symbolic."""
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return list(shape[start:end])


def _from_partial(node: onnx.NodeProto, partial: dict, known: dict) -> list | None:
    """``Gather`` / ``Slice`` of a shape with symbolic entries (``x.shape[-1]`` with a
    dynamic batch): its value when every entry it selects is static. A slice with a
    symbolic entry is recorded as a partial shape itself."""
    entries = partial[node.input[0]]
    index = np.arange(len(entries))
    if node.op_type == "Gather":
        if len(node.input) < 2 or node.input[1] not in known:
            return None
        picked = index[known[node.input[1]]]
    else:
        bounds = [known.get(i) if i else None for i in node.input[1:]]
        if any(i and i not in known for i in node.input[1:]) or len(bounds) < 2:
            return None
        starts, ends = bounds[0], bounds[1]
        axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else [0]
        steps = bounds[3] if len(bounds) > 3 and bounds[3] is not None else [1]
        if len(starts) != 1 or list(axes) not in ([0], [-1]):
            return None
        picked = index[int(starts[0]):int(ends[0]):int(steps[0])]
    chosen = [entries[int(k)] for k in np.ravel(picked)]
    if None in chosen:
        if node.op_type == "Slice":
            partial[node.output[0]] = chosen
        return None
    return [np.array(chosen, dtype=np.int64).reshape(np.shape(picked))]


def _reads(node: onnx.NodeProto) -> set[str]:
    """Names ``node`` reads, those its subgraphs (If / Loop / Scan bodies) read included."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in sub.node:
                names |= _reads(inner)
    return names


def _live(nodes: list, outputs: set[str]) -> list:
    """``nodes`` without the pure ones whose every output is unused (backwards)."""
    used = set(outputs)
    live = []
    for node in reversed(nodes):
        if not _foldable(node) or any(o in used for o in node.output if o):
            live.append(node)
            used |= _reads(node)
    return live[::-1]


def _evaluate(node: onnx.NodeProto, known: dict[str, np.ndarray], opset) -> list | None:
    """Outputs of ``node`` on known inputs (None when the reference runtime cannot)."""
    from onnx.reference import ReferenceEvaluator

    inputs = [i for i in node.input if i]
    graph = onnx.helper.make_graph(
        [node], "fold",
        [onnx.helper.make_tensor_value_info(
            i, onnx.helper.np_dtype_to_tensor_dtype(known[i].dtype), known[i].shape)
         for i in inputs],
        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
         for o in node.output if o],
    )
    model = onnx.helper.make_model(graph, opset_imports=opset)
    try:
        return ReferenceEvaluator(model).run(None, {i: known[i] for i in inputs})
    except Exception:  # noqa: BLE001 - left to the importer, as before
        return None


def _foldable(node: onnx.NodeProto) -> bool:
    return (node.domain in ("", "ai.onnx") and not node.op_type.startswith(_NONDETERMINISTIC)
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for a in node.attribute))


def fold_constants(model: onnx.ModelProto) -> int:
    """Fold ``model``'s statically known shape computations in place; return how many
    nodes were removed."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    overridable = {i.name for i in graph.input}  # an initializer listed as an input
    opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    folded = 0
    for _ in range(MAX_ROUNDS):
        shapes = _static_shapes(model)
        known: dict[str, np.ndarray] = {
            init.name: numpy_helper.to_array(init) for init in graph.initializer
            if math.prod(init.dims) <= MAX_FOLDED_ELEMENTS and init.name not in overridable
        }
        keep, values, real = [], {}, 0
        partial: dict[str, list[int | None]] = {}  # Shape outputs with symbolic entries
        for node in graph.node:
            result = None
            if node.op_type in ("Shape", "Size") and node.input and node.input[0] in shapes \
                    and node.domain in ("", "ai.onnx"):
                shape = shapes[node.input[0]]
                dims = shape if node.op_type == "Size" else _shape_entries(node, shape)
                if None not in dims:
                    result = [np.array(math.prod(dims) if node.op_type == "Size" else dims,
                                       dtype=np.int64)]
                elif node.op_type == "Shape":
                    partial[node.output[0]] = dims
            elif node.op_type in ("Gather", "Slice") and node.input[0] in partial:
                result = _from_partial(node, partial, known)
            elif node.op_type == "Constant" or (
                    _foldable(node) and node.input and all(not i or i in known
                                                            for i in node.input)):
                result = _evaluate(node, known, opset)
            if result is None or any(o in outputs for o in node.output) or any(
                    np.asarray(r).size > MAX_FOLDED_ELEMENTS for r in result):
                keep.append(node)
                continue
            real += node.op_type != "Constant"
            for name, value in zip(node.output, result, strict=False):
                if name:
                    known[name] = values[name] = np.asarray(value)
        if not real:
            break
        # a Shape read only by folded nodes goes too; copies outlive the cleared list
        keep = [onnx.NodeProto.FromString(n.SerializeToString()) for n in _live(keep, outputs)]
        used = set().union(*(_reads(n) for n in keep)) | outputs
        folded += len(graph.node) - len(keep)
        del graph.node[:]
        graph.node.extend(keep)
        graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in values.items()
                                 if name in used)
        del graph.value_info[:]  # stale for folded tensors; inferred again next round
    return folded
