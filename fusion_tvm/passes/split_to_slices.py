"""SplitToSlices: rewrite ``R.split`` into a tuple of ``R.strided_slice`` calls.

A split legalizes to one PrimFunc with a tuple output; the consumers then read it through
``TupleGetItem``, which cuts every fusion chain at the split. As independent slices, each
piece is an ordinary injective op that the search can fold into its consumer (a prologue
read), and the split kernel disappears. Runs before ``LegalizeOps``; splits whose pieces
have symbolic sizes along the axis are left alone.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..relax_rewrite import visit_functions

_SPLIT = tvm.ir.Op.get("relax.split")


@relax.expr_functor.mutator
class _SplitRewriter(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(_SPLIT):
            return call
        ty = call.ty
        if not isinstance(ty, relax.TupleType):
            return call
        axis = int(call.attrs.axis)
        x = call.args[0]
        ndim = len(x.ty.shape.values) if isinstance(x.ty, relax.TensorType) and \
            isinstance(x.ty.shape, relax.ShapeExpr) else None
        if ndim is None:
            return call
        axis = axis + ndim if axis < 0 else axis
        begin = 0
        pieces = []
        for field in ty.fields:
            if not isinstance(field, relax.TensorType) or not isinstance(
                field.shape, relax.ShapeExpr
            ):
                return call
            extent = field.shape.values[axis]
            if not isinstance(extent, tirx.IntImm):
                return call
            end = begin + int(extent)
            pieces.append(
                relax.op.strided_slice(x, axes=[axis], begin=[begin], end=[end],
                                       assume_inbound=True)
            )
            begin = end
        return relax.Tuple([self.builder_.normalize(p) for p in pieces])


@tvm.transform.module_pass(opt_level=0, name="SplitToSlices")
class SplitToSlices:
    """Replace every statically-sized ``R.split`` by independent strided slices."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite all Relax functions of ``mod``."""
        rewriter = _SplitRewriter(mod)
        return visit_functions(rewriter, mod)
