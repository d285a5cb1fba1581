"""Our replacements for Relax ONNX importer converters that fail on real exports.

Each override is a converter class in the importer's own style (``_impl_v<opset>`` class
methods) registered under the ONNX op type it replaces. :func:`converter_map` merges them over
the stock map; our importer subclass (see :mod:`.onnx_loader`) consults that merged map, so TVM's
module state is never patched and a plain ``tvm.relax.frontend.onnx.from_onnx`` call elsewhere in
the process behaves exactly as stock.

Every override names the export that needed it and has a test in ``tests/test_frontend.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _stock
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter, get_constant, get_numpy
from tvm.sym import Analyzer, ConstIntBound

_OVERRIDES: dict[str, type[OnnxOpConverter]] = {}


def register_override(op_type: str) -> Callable[[type[OnnxOpConverter]], type[OnnxOpConverter]]:
    """Register a converter class replacing the stock one for ``op_type``.

    Raises
    ------
    ValueError
        If ``op_type`` already has an override: two fixes for one op would silently shadow
        each other.
    """

    def wrap(cls: type[OnnxOpConverter]) -> type[OnnxOpConverter]:
        if op_type in _OVERRIDES:
            raise ValueError(
                f"ONNX converter override for '{op_type}' already registered "
                f"({_OVERRIDES[op_type].__qualname__})"
            )
        _OVERRIDES[op_type] = cls
        return cls

    return wrap


def overridden_ops() -> frozenset[str]:
    """ONNX op types whose stock converter we replace."""
    return frozenset(_OVERRIDES)


def converter_map() -> dict[str, type[OnnxOpConverter]]:
    """The stock importer's converter map with our overrides applied."""
    table = dict(_stock._get_convert_map())
    table.update(_OVERRIDES)
    return table


@register_override("ConstantOfShape")
class ConstantOfShape(OnnxOpConverter):
    """ConstantOfShape whose ``value`` is a one-element 1-D tensor, as torch exports it.

    Stock TVM turns ``value`` into a rank-1 constant and broadcasts it to the target shape,
    which fails for a rank-0 target (``broadcast_to`` cannot drop a dimension); every BERT,
    GPT-2 and T5 export from ``torch.onnx.export`` has such a node in its attention-mask code.
    Stock also folds only rank-1 constant shapes. We take ``value`` as the scalar the spec
    defines and fold any fully constant shape.
    """

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        attr_value = attr.get("value")
        if attr_value is None:
            value = np.zeros((), "float32")  # the spec's default: float32 zero
        else:
            value = get_numpy(attr_value).reshape(())
        dtype = str(value.dtype)

        shape = get_constant(inputs[0], params)
        if isinstance(shape, tvm.ir.GenericConst):
            shape = relax.ShapeExpr([int(v) for v in shape.value.numpy().reshape(-1)])
        if isinstance(shape, relax.ShapeExpr) and all(
            isinstance(v, tirx.IntImm) for v in shape.values
        ):
            dims = [int(v) for v in shape.values]
            return relax.const(np.full(dims, value, dtype), dtype)
        if not isinstance(shape, relax.ShapeExpr):
            shape = relax.op.tensor_to_shape(shape)
        return relax.op.broadcast_to(relax.const(value, dtype), shape)


@register_override("Range")
class Range(OnnxOpConverter):
    """Range whose limit is a sequence length, as in ``torch.arange(input_ids.shape[1])``.

    Stock TVM computes the length of every dynamic Range at run time and names it with a
    fresh symbolic variable, so GPT-2's position ids get length ``range_len_0`` instead of
    ``sequence``; adding the position embeddings then loses the static rank of the shape and
    the next ``Shape`` → ``Slice`` fails ("Slice requires a statically known input rank").
    When start and delta are integer constants (start <= 0 < delta) and the limit is a
    symbolic shape value, the length ``max(ceil((limit - start) / delta), 0)`` is a shape
    expression we can write down; other cases go to the stock converter.
    """

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        start, limit, delta = (get_constant(x, params) for x in inputs[:3])
        start_v, delta_v = _int_scalar(start), _int_scalar(delta)
        if (
            start_v is not None
            and delta_v is not None
            and start_v <= 0 < delta_v
            and tvm.ir.is_prim_expr(limit)
            and _prim_dtype(limit).startswith("int")
        ):
            dtype = str(start.ty.dtype)
            if _prim_dtype(limit) != "int64":
                limit = tirx.Cast("int64", limit)
            span = limit - start_v if start_v else limit
            count = span if delta_v == 1 else tirx.floordiv(span + (delta_v - 1), delta_v)
            count = _clamp_to_empty(count)
            positions = relax.op.arange(0, count, 1, dtype)
            if delta_v != 1:
                positions = relax.op.multiply(positions, relax.const(delta_v, dtype))
            if start_v:
                positions = relax.op.add(positions, relax.const(start_v, dtype))
            return positions
        return _stock.Range._impl_v12(bb, inputs, attr, params)


def _clamp_to_empty(count):
    """``max(count, 0)``: a negative length is an empty range, as the spec says.

    The variables in a symbolic limit are tensor dims, hence >= 0; with that known the max
    simplifies away in the common cases (``sequence``, ``(sequence + 1) // 2``) and the result
    shape stays comparable with the inputs' shapes.
    """
    analyzer = Analyzer()
    for var in tirx.analysis.undefined_vars(count):
        analyzer.update(var, ConstIntBound(0, ConstIntBound.POS_INF))
    return analyzer.simplify(tirx.max(count, 0))


def _int_scalar(value) -> int | None:
    """The Python int held by a one-element integer constant, else None."""
    if not isinstance(value, tvm.ir.GenericConst):
        return None
    array = value.value.numpy()
    if array.size != 1 or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(()))


def _prim_dtype(expr) -> str:
    # A tirx.Var's ``dtype`` property raises unless it is a buffer var; ``ty`` always works.
    return str(expr.ty)


@register_override("Expand")
class Expand(_stock.Expand):
    """Expand to a constant shape from data with symbolic dims (Bloom's ALiBi with a
    dynamic batch and sequence): the stock constant-shape branch reads every data dim as an
    integer; its shape-expression branch handles symbolic dims, so the constant goes there.
    """

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, shape = inputs[0], inputs[1]
        dims = getattr(getattr(data, "ty", None), "shape", None)
        if isinstance(shape, tvm.ir.GenericConst) and dims is not None and any(
                not isinstance(d, tirx.IntImm) for d in dims):
            target = [int(v) for v in shape.value.numpy().reshape(-1)]
            inputs = [data, relax.ShapeExpr(target), *inputs[2:]]
        return super()._impl_v13(bb, inputs, attr, params)
