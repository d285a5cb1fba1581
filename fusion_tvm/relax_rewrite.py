"""One-op rewrites of Relax modules: the mutator the graph-level conv passes share.

A pass names the op it rewrites and a function returning the replacement of one call (or
None to keep it); :func:`rewrite_calls` visits every Relax function of the module with it.
The replacement may emit bindings of its own through the builder it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tvm
from tvm import relax, tirx

#: ``(call, builder) -> replacement or None``
Rewrite = Callable[[relax.Call, relax.BlockBuilder], "relax.Expr | None"]


def static_shape(expr: relax.Expr) -> list[int | tirx.PrimExpr] | None:
    """``expr``'s shape, constant dims as ints (None when the shape is not known)."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tirx.IntImm) else d for d in ty.shape.values]


@relax.expr_functor.mutator
class _CallRewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, op: tvm.ir.Op, rewrite: Rewrite):
        super().__init__(mod)
        self.op = op
        self.rewrite = rewrite
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.same_as(self.op)):
            return call
        new = self.rewrite(call, self.builder_)
        if new is None:
            return call
        self.count += 1
        return new


def rewrite_calls(mod: tvm.IRModule, op_name: str, rewrite: Rewrite,
                  canonicalize: bool = False) -> tvm.IRModule:
    """``mod`` with every call of ``op_name`` that ``rewrite`` replaces replaced; ``mod``
    itself when it replaces none. ``canonicalize``: fold the alias bindings left behind."""
    rewriter = _CallRewriter(mod, tvm.ir.Op.get(op_name), rewrite)
    out = visit_functions(rewriter, mod)
    if not rewriter.count:
        return mod
    return relax.transform.CanonicalizeBindings()(out) if canonicalize else out


def visit_functions(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every Relax function replaced by ``mutator``'s visit of it (the
    module of the mutator's builder)."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def is_nchw_conv(call: relax.Call) -> bool:
    """Whether ``call`` (a conv2d) reads NCHW data, OIHW weights and writes NCHW."""
    a = call.attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "OIHW" and a.out_layout == "NCHW"


class ConvGeometry(NamedTuple):
    """Static sizes of an NCHW conv: data, weight and output shapes, and its attributes
    as ints (``pad``: top, left, bottom, right)."""

    x: list[int]
    w: list[int]
    y: list[int]
    strides: list[int]
    dilation: list[int]
    pad: list[int]


def static_conv_geometry(call: relax.Call) -> ConvGeometry | None:
    """The :class:`ConvGeometry` of an NCHW ``conv2d`` with static 4-D shapes, else None."""
    if not is_nchw_conv(call):
        return None
    shapes = [static_shape(e) for e in (call.args[0], call.args[1], call)]
    if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s)
           for s in shapes):
        return None
    a = call.attrs
    return ConvGeometry(*shapes, [int(v) for v in a.strides], [int(v) for v in a.dilation],
                        [int(v) for v in a.padding])


def tap_outputs(size: int, out: int, kernel: int, stride: int, dilation: int,
                pad_before: int) -> list[tuple[int, int]]:
    """Per tap along one conv axis, the outputs ``[lo, hi)`` it reads data for (the
    input index ``y * stride + r * dilation - pad_before`` inside ``[0, size)``);
    ``(0, 0)`` for a tap that reads only padding."""
    spans = []
    for r in range(kernel):
        ys = [y for y in range(out) if 0 <= y * stride + r * dilation - pad_before < size]
        spans.append((ys[0], ys[-1] + 1) if ys else (0, 0))
    return spans


def conv2d_like(call: relax.Call, x: relax.Expr, weight: relax.Expr, **changes) -> relax.Call:
    """An NCHW ``relax.nn.conv2d`` with ``call``'s attributes but for ``changes``
    (``strides``, ``padding``, ``dilation``, ``groups``)."""
    a = call.attrs
    attrs = dict(strides=a.strides, padding=a.padding, dilation=a.dilation,
                 groups=int(a.groups))
    attrs.update(changes)
    return relax.op.nn.conv2d(x, weight, data_layout="NCHW", kernel_layout="OIHW",
                              out_layout="NCHW", out_dtype=a.out_dtype, **attrs)
