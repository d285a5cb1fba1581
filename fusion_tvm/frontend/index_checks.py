"""Index ranges of gathers fed by model inputs: checked before a run, not trusted.

The importers lower ONNX ``Gather`` (an embedding lookup) to ``R.take(..., mode="fast")``,
which reads ``table[index]`` without a bound check: an out-of-range token id made the
process segfault. ONNX calls such an index an error (onnxruntime raises), so
:class:`~fusion_tvm.api.CompiledModel` checks every input that reaches a fast ``take`` as
its indices (directly, or through the importer's negative-index wrap ``where(i < 0, i + n,
i)``) and raises :class:`~fusion_tvm.errors.InputMismatchError` naming the input, the
offending value and the valid range. Indices computed inside the model are not checked
(they are in range by construction in the models we know).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

_TAKE = tvm.ir.Op.get("relax.take")
_WHERE = tvm.ir.Op.get("relax.where")
_LESS = tvm.ir.Op.get("relax.less")


@dataclass(frozen=True)
class IndexRange:
    """Input ``name`` indexes a table of ``size`` rows (along the gathered axis)."""

    name: str
    size: int
    allow_negative: bool  # wrapped by the importer: [-size, size) is valid

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "allow_negative": self.allow_negative}

    @staticmethod
    def from_json(data: dict) -> IndexRange:
        return IndexRange(str(data["name"]), int(data["size"]), bool(data["allow_negative"]))

    def check(self, values: np.ndarray) -> str | None:
        """A message naming the first out-of-range value, or None."""
        if values.size == 0 or values.dtype.kind not in "iu":
            return None
        low = -self.size if self.allow_negative else 0
        if values.min() >= low and values.max() < self.size:  # every run: no mask
            return None
        bad = (values < low) | (values >= self.size)
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"input '{self.name}' has value {int(values[where])} at index {where}, out of "
                f"range [{low}, {self.size}): it indexes a gather (embedding lookup) over "
                f"{self.size} rows")


def _static(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def gather_index_ranges(mod: tvm.IRModule,
                        input_names: tuple[str, ...] | None = None) -> list[IndexRange]:
    """The inputs of ``mod["main"]`` used as indices of a fast ``take``, with the range;
    ``input_names`` (in parameter order) name them as the user feeds them."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return []
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    names = list(input_names) if input_names and len(input_names) == len(func.params) \
        else [p.name for p in func.params]
    params = dict(zip(func.params, names, strict=True))
    bound: dict[relax.Var, relax.Expr] = {}
    out: list[IndexRange] = []
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            bound[binding.var] = binding.value
            call = binding.value
            if not (isinstance(call, relax.Call) and call.op.same_as(_TAKE)):
                continue
            if str(call.attrs.mode) != "fast":
                continue
            table = call.args[0].ty
            if not isinstance(table, relax.TensorType) or not isinstance(
                    table.shape, relax.ShapeExpr):
                continue
            axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
            size = _static(table.shape.values[axis])
            if size is None:
                continue
            found = _input_of(call.args[1], params, bound)
            if found is not None:
                name, wrapped = found
                out.append(IndexRange(name, size, wrapped))
    return out


def _input_of(expr, params: dict, bound: dict) -> tuple[str, bool] | None:
    """(input name, wrapped) when ``expr`` is an input or the importer's wrap of one."""
    if expr in params:
        return params[expr], False
    value = bound.get(expr)
    if isinstance(value, relax.Call) and value.op.same_as(_WHERE):
        cond = bound.get(value.args[0], value.args[0])
        raw = value.args[2]
        if raw in params and isinstance(cond, relax.Call) and cond.op.same_as(_LESS) \
                and cond.args[0].same_as(raw):
            return params[raw], True
    return None
