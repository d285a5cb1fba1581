"""FoldAffineIntoWeights: per-channel scales and shifts after a matmul / conv folded into its
constant weights at compile time.

``y = ((x @ W + b) - mean) / std * gamma + beta`` (a BatchNorm after a Linear, decomposed for
inference), ``conv(x, W) * layer_scale`` (ConvNeXt's LayerScale), ``(x @ W) / sqrt(d)`` (a
scaled query projection): every op of the chain multiplies, divides, adds or subtracts a
constant that varies along the output channel only. The chain is one affine map per channel,
``a * z + s``, so ``W`` is rescaled along its output-channel axis and the chain becomes one
bias add: ``x @ (W * a) + s``. TVM's ``FoldBatchnormToConv2D`` covers a BatchNorm directly on
a conv2d only; this covers matmuls, a conv's bias and any order of the four ops.

Runs after ``DecomposeOpsForInference`` and before ``LegalizeOps``. The chain's inner values
must have no other use; constants may be Relax constants or small constant expressions
(``expand_dims``, ``reshape``, ``sqrt``, arithmetic), evaluated here in float64.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

_AFFINE = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide}
#: Ops a constant expression may use (``_Constants.value``).
_CONSTANT_OPS = {"expand_dims", "reshape", "sqrt", "rsqrt", *_AFFINE}


def _op_name(expr) -> str | None:
    """``"add"`` for a call of ``relax.add`` (None for anything but an operator call)."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name.removeprefix("relax.")
    return None


def _static_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    if not all(isinstance(v, tvm.tirx.IntImm) for v in ty.shape.values):
        return None
    return tuple(int(v) for v in ty.shape.values)


class _Constants:
    """Values of constant expressions (float64), through the function's bindings."""

    def __init__(self, var2val):
        self.var2val = var2val

    def value(self, expr, depth: int = 0) -> np.ndarray | None:
        """``expr``'s value, or None when it is not a (small) constant expression."""
        if depth > 8:
            return None
        if isinstance(expr, relax.Var):
            bound = self.var2val.get(expr)
            return None if bound is None else self.value(bound, depth + 1)
        if isinstance(expr, tvm.ir.GenericConst):
            return expr.value.numpy().astype(np.float64)
        name = _op_name(expr)
        if name not in _CONSTANT_OPS:
            return None
        args = [self.value(a, depth + 1) for a in expr.args
                if not isinstance(a, relax.ShapeExpr)]
        if any(a is None for a in args):
            return None
        shape = _static_shape(expr)
        if shape is None:
            return None
        if name in ("expand_dims", "reshape"):
            return args[0].reshape(shape)
        if name == "sqrt":
            return np.sqrt(args[0])
        if name == "rsqrt":
            return 1.0 / np.sqrt(args[0])
        if len(args) == 2:
            return np.broadcast_to(_AFFINE[name](args[0], args[1]), shape)
        return None


def _per_channel(value: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``value`` as a vector over the output channels, if it broadcasts into ``out_shape``
    varying along ``axis`` only (a scalar counts: the same for every channel)."""
    if value.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - value.ndim) + value.shape
    for k, (d, n) in enumerate(zip(full, out_shape, strict=True)):
        if d != 1 and (k != axis or d != n):
            return None
    if full[axis] == out_shape[axis]:
        return value.reshape(-1)
    return np.full(out_shape[axis], float(value.reshape(-1)[0]))


def _anchor(call, constants: _Constants):
    """``(kind, data, weight value, channel axis of the output, channel axis of W)`` of a
    matmul / conv2d with a constant weight, else None."""
    name = _op_name(call)
    if not isinstance(call.ty, relax.TensorType) or not str(call.ty.dtype).startswith(
            ("float", "bfloat")):
        return None  # an integer product (quantised) keeps its exact weights
    if name == "matmul":
        weight = constants.value(call.args[1])
        if weight is None or weight.ndim != 2 or call.attrs.out_dtype not in ("", "void",
                                                                             None):
            return None
        return "matmul", call.args[0], weight, -1, 1
    if name == "nn.conv2d":
        attrs = call.attrs
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW",
                                                                          "NCHW"):
            return None
        weight = constants.value(call.args[1])
        if weight is None or weight.ndim != 4:
            return None
        return "conv2d", call.args[0], weight, 1, 0
    return None


def _chain(var, out_shape: tuple[int, ...], axis: int, users, var2val, constants):
    """Follow single-use affine ops from ``var`` (an ``out_shape`` tensor whose channels lie
    along ``axis``): ``(vars bound by the chain, a, s, ops)`` or None."""
    a, s = np.ones(out_shape[axis]), np.zeros(out_shape[axis])
    cur, ops, bound = var, [], []
    while isinstance(cur, relax.DataflowVar):  # a function output must keep its value
        uses = users.get(cur, [])
        if len(uses) != 1:
            break
        call = var2val.get(uses[0])
        name = _op_name(call)
        if name not in _AFFINE or _static_shape(call) != out_shape:
            break
        first = call.args[0].same_as(cur)
        other = call.args[1] if first else call.args[0]
        if other.same_as(cur):
            break
        value = constants.value(other)
        vec = None if value is None else _per_channel(value, out_shape, axis)
        if vec is None:
            break
        if name == "add":
            s = s + vec
        elif name == "multiply":
            a, s = a * vec, s * vec
        elif name == "subtract" and first:
            s = s - vec
        elif name == "subtract":
            a, s = -a, vec - s
        elif name == "divide" and first:
            a, s = a / vec, s / vec
        else:
            break  # c / z is not affine in z
        ops.append(name)
        cur = uses[0]
        bound.append(cur)
    if not ops or not (set(ops) & {"multiply", "divide"} or len(ops) > 1):
        return None
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(s))):
        return None
    return bound, a, s, ops


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod, rewrites):
        super().__init__(mod)
        self.rewrites = rewrites  # last var of a chain -> (new matmul / conv, bias or None)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: D102
        new = self.rewrites.get(binding.var)
        if new is None:
            super().visit_var_binding_(binding)
            return
        anchor, bias = new
        value = self.builder_.normalize(self.visit_expr(anchor))
        if bias is not None:
            value = self.builder_.normalize(relax.op.add(self.builder_.emit(value), bias))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def _rewrites(func: relax.Function) -> dict:
    var2val = relax.analysis.get_var2val(func)
    constants = _Constants(var2val)
    users: dict = {}
    for var, val in var2val.items():
        for used in _vars_in(val):
            users.setdefault(used, []).append(var)
    for used in _vars_in(func.body.body):  # returned values: a use outside the chain
        users.setdefault(used, []).append(None)
    out, chained = {}, set()
    for var, val in var2val.items():
        anchor = _anchor(val, constants) if isinstance(val, relax.Call) else None
        if anchor is None or not isinstance(var, relax.DataflowVar):
            continue
        kind, data, weight, axis, w_axis = anchor
        out_shape = _static_shape(val)
        found = None if out_shape is None else _chain(
            var, out_shape, axis % len(out_shape), users, var2val, constants)
        if found is None:
            continue
        bound, a, s, _ops = found
        chained.update([var, *bound])
        shape = [1] * weight.ndim
        shape[w_axis] = -1
        dtype = str(val.ty.dtype)
        folded = relax.const((weight * a.reshape(shape)).astype(dtype))
        if kind == "matmul":
            new = relax.op.matmul(data, folded)
            bias_shape = (-1,)
        else:
            at = val.attrs
            new = relax.op.nn.conv2d(data, folded, strides=at.strides, padding=at.padding,
                                     dilation=at.dilation, groups=at.groups)
            bias_shape = (1, -1, 1, 1)
        bias = relax.const(s.reshape(bias_shape).astype(dtype)) if np.any(s) else None
        out[bound[-1]] = (new, bias)
    for var in var2val:
        if var not in chained and isinstance(var, relax.DataflowVar):
            found = _collapsed(var, users, var2val, constants)
            if found is not None:
                bound, new, bias = found
                chained.update(bound)
                out[bound[-1]] = (new, bias)
    return out


def _collapsed(var, users, var2val, constants):
    """A chain of per-channel affine ops on ``var`` with no weight to fold into (after a
    concat, BatchNorm before an activation) as one multiply and one add: ``(vars bound by
    the chain, scaled var, bias or None)``, or None when that is not fewer ops or keeps a
    divide (DenseNet's and MixNet's ``(z - mean) / std * gamma + beta`` after a concat: 4
    ops, one a division, on every element)."""
    ty = var.ty
    shape = _static_shape(var)
    if shape is None or not str(ty.dtype).startswith(("float", "bfloat")) or not shape:
        return None
    best, axis = None, 0
    for k in range(len(shape)):
        found = _chain(var, shape, k, users, var2val, constants)
        if found is not None and (best is None or len(found[3]) > len(best[3])):
            best, axis = found, k
    if best is None:
        return None
    bound, a, s, ops = best
    scale, shift = bool(np.any(a != 1.0)), bool(np.any(s != 0.0))
    if not (scale or shift) or scale + shift >= len(ops) and "divide" not in ops:
        return None
    vshape = [1] * len(shape)
    vshape[axis] = -1
    dtype = str(ty.dtype)

    def const(v):  # a scalar stays a scalar (hard-swish's / 6 becomes * (1 / 6))
        return relax.const(np.asarray(v[0] if np.all(v == v[0]) else v.reshape(vshape),
                                      dtype=dtype))
    new = relax.op.multiply(var, const(a)) if scale else var
    return bound, new, const(s) if shift else None


def _vars_in(expr) -> list:
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e)
                                    if isinstance(e, relax.Var) else None)
    return found


@tvm.transform.module_pass(opt_level=0, name="FoldAffineIntoWeights")
class FoldAffineIntoWeights:
    """Fold per-channel affine chains after constant-weight matmuls / conv2ds into the
    weights (and one bias add)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every Relax function of ``mod``; dead chain ops are removed."""
        clean = relax.transform.DeadCodeElimination()(mod)  # dead uses would block chains
        changed = False
        for gv, func in list(clean.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            rewrites = _rewrites(func)
            if not rewrites:
                continue
            folder = _Folder(clean, rewrites)
            folder.builder_.update_func(gv, folder.visit_expr(func))
            clean = folder.builder_.get()
            changed = True
        return relax.transform.DeadCodeElimination()(clean) if changed else mod
