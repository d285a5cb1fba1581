"""The Relax ``main`` of a fused, scheduled module as a straight-line list of kernel calls.

What the emitter needs from Relax: model inputs, weights (constants), one
:class:`KernelCall` per ``call_tir`` (in order), and the outputs. Reshapes (``call_tir``
of a reshape PrimFunc, ``R.reshape`` after ``RewriteDataflowReshape``) become aliases:
row-major order is unchanged, so the same stream carries the data. Variable aliases,
tuples and ``TupleGetItem`` are resolved; anything else raises a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ...errors import UnsupportedOperatorError, UserInputError
from .analysis import int_value

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
Constant = tvm.ir.expr.Constant
_RESHAPE_OPS = {"relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims"}


@dataclass
class TensorVal:
    """A tensor of the program (input, weight or kernel output)."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "weight" | "kernel"
    data: np.ndarray | None = None  # weights
    producer: int | None = None  # kernel index
    consumers: list[int] = field(default_factory=list)  # kernel indices (with repeats)
    is_output: bool = False

    @property
    def elems(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class KernelCall:
    """One ``call_tir`` of a (fused) PrimFunc."""

    index: int
    func_name: str
    func: tvm.tirx.PrimFunc
    args: list[int]  # tensor ids, in PrimFunc parameter order
    outs: list[int]


@dataclass
class Program:
    """The whole model as kernels over tensors."""

    tensors: list[TensorVal]
    inputs: list[int]
    kernels: list[KernelCall]
    outputs: list[int]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)

    def producer_kernel(self, tid: int) -> KernelCall | None:
        p = self.tensors[tid].producer
        return self.kernels[p] if p is not None else None


def _static_shape(sinfo, what: str) -> tuple[tuple[int, ...], str]:
    if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
        raise UserInputError(f"HLS backend: {what} is not a tensor with a known shape")
    shape = sinfo.shape
    if not isinstance(shape, relax.ShapeExpr):
        raise UserInputError(f"HLS backend: {what} has no static shape")
    try:
        dims = tuple(int_value(d) for d in shape.values)
    except ValueError as err:
        raise UserInputError(
            f"HLS backend: {what} has a symbolic shape {list(shape.values)}; pass "
            "shape_dict to compile() to fix every dimension"
        ) from err
    return dims, str(sinfo.dtype)


def extract_program(mod: tvm.IRModule, func_name: str = "main") -> Program:
    """Read ``mod[func_name]`` into a :class:`Program`."""
    main = mod[func_name]
    tensors: list[TensorVal] = []
    env: dict = {}  # relax var -> tensor id or tuple of ids
    const_ids: dict = {}

    def new_tensor(name, sinfo, kind, data=None) -> int:
        shape, dtype = _static_shape(sinfo, f"'{name}'")
        t = TensorVal(len(tensors), name, shape, dtype, kind, data)
        tensors.append(t)
        return t.id

    def value_of(expr, where: str):
        if isinstance(expr, relax.Var):
            if expr not in env:
                raise UserInputError(f"HLS backend: '{expr.name}' used before definition")
            return env[expr]
        if isinstance(expr, Constant):
            if expr not in const_ids:
                const_ids[expr] = new_tensor(f"w{len(const_ids)}", expr.ty, "weight",
                                             expr.value.numpy())
            return const_ids[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(value_of(f, where) for f in expr.fields)
        raise UnsupportedOperatorError(type(expr).__name__, where,
                                       "the HLS emitter cannot use this expression as an argument")

    inputs = []
    for p in main.params:
        tid = new_tensor(p.name, p.ty, "input")
        env[p] = tid
        inputs.append(tid)
    kernels: list[KernelCall] = []
    body = main.body
    for block in body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            where = var.name
            if isinstance(value, relax.Call) and value.op.same_as(CALL_TIR):
                gv = value.args[0]
                func = mod[gv]
                args = value_of(value.args[1], where)
                args = list(args) if isinstance(args, tuple) else [args]
                if any(isinstance(a, tuple) for a in args):
                    raise UnsupportedOperatorError("call_tir", where, "nested tuple arguments")
                if relax.analysis.has_reshape_pattern(func) and len(args) == 1:
                    env[var] = _alias(tensors, args[0], var)
                    continue
                if isinstance(var.ty, relax.TupleType):
                    outs = [new_tensor(f"{where}_{k}", s, "kernel")
                            for k, s in enumerate(var.ty.fields)]
                    env[var] = tuple(outs)
                else:
                    outs = [new_tensor(where, var.ty, "kernel")]
                    env[var] = outs[0]
                k = KernelCall(len(kernels), gv.name_hint, func, args, outs)
                for a in args:
                    tensors[a].consumers.append(k.index)
                for o in outs:
                    tensors[o].producer = k.index
                kernels.append(k)
            elif isinstance(value, relax.Call) and getattr(value.op, "name", "") in _RESHAPE_OPS:
                src = value_of(value.args[0], where)
                env[var] = _alias(tensors, src, var)
            elif isinstance(value, (relax.Var, Constant, relax.Tuple)):
                env[var] = value_of(value, where)
            elif isinstance(value, relax.TupleGetItem):
                tup = value_of(value.tuple_value, where)
                if not isinstance(tup, tuple):
                    raise UnsupportedOperatorError("TupleGetItem", where, "not a tuple")
                env[var] = tup[value.index]
            else:
                op = getattr(getattr(value, "op", None), "name", type(value).__name__)
                raise UnsupportedOperatorError(
                    str(op), where,
                    "the HLS backend emits call_tir kernels, reshapes and tuples only; this "
                    "binding was not legalized to TIR",
                )
    result = value_of(body.body, "result")
    outputs = list(result) if isinstance(result, tuple) else [result]
    for o in outputs:
        if isinstance(o, tuple):
            raise UnsupportedOperatorError("Tuple", "result", "nested tuple outputs")
        tensors[o].is_output = True
    sinfo = body.body.ty
    fields = sinfo.fields if isinstance(sinfo, relax.TupleType) else [sinfo]
    shapes = [_static_shape(s, "an output")[0] for s in fields]
    return Program(tensors, inputs, kernels, outputs, shapes)


def _alias(tensors: list[TensorVal], src, var) -> int:
    """A reshape: the same data under the new shape (weights get reshaped copies)."""
    if isinstance(src, tuple):
        raise UnsupportedOperatorError("reshape", var.name, "reshape of a tuple")
    shape, dtype = _static_shape(var.ty, f"'{var.name}'")
    t = tensors[src]
    if t.kind == "weight":
        tid = len(tensors)
        tensors.append(TensorVal(tid, f"{t.name}_r{tid}", shape, dtype, "weight",
                                 t.data.reshape(shape)))
        return tid
    # Same elements in the same order: consumers read the source's stream, so the view
    # keeps the id of its source; kernels see their own parameter shapes anyway.
    return src
