"""ExpandSmallPowers: rewrite ``R.power(x, c)`` with a small integer constant ``c`` into
multiplies.

``x ** 3`` (GELU-tanh) and ``x ** 2`` (layer norms as ONNX exports them) legalize to
``tirx.pow``, a scalar ``powf`` call on CPU: a GELU-tanh kernel ran 75-113 us against
4.5 us for its fast-tanh part. As multiplies the kernel vectorises. Runs before
``LegalizeOps``.

Only scalar floating-point constant exponents in {0, 1, 2, 3, 4} are rewritten, whose
results keep ``powf``'s special values: ``pow(x, 0) = 1`` for every x (NaN included, as
``ones_like``), ``x * x`` is exactly ``pow(x, 2)`` in IEEE arithmetic, and NaN / +-Inf
propagate through the products with the same sign rules. ``x ** 3`` and ``x ** 4`` round
twice (at most ~1 ulp from a correctly rounded ``powf``). ``c = 0.5`` is *not* rewritten
to ``sqrt``: ``pow(-0, 0.5) = +0`` and ``pow(-inf, 0.5) = +inf`` where ``sqrt`` gives
``-0`` and NaN.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_rewrite import visit_functions

_POWER = tvm.ir.Op.get("relax.power")

#: Exponents rewritten into products (by construction ``pow`` of these is exact or
#: within an ulp as products).
MAX_EXPONENT = 4


def _small_exponent(expr: relax.Expr, x: relax.Expr) -> int | None:
    """The exponent as an int when ``expr`` is a scalar float constant in 0..MAX_EXPONENT
    that broadcasting against ``x`` does not reshape; else None."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    arr = expr.value.numpy()
    if arr.size != 1 or arr.dtype.kind != "f":
        return None
    xty = x.ty
    if not isinstance(xty, relax.TensorType) or xty.ndim < 0 or arr.ndim > xty.ndim:
        return None  # a [1]-shaped exponent would give a 0-d x a new axis
    if arr.ndim and arr.ndim == xty.ndim and not isinstance(xty.shape, relax.ShapeExpr):
        return None
    value = float(arr.reshape(()))
    if not value.is_integer() or not 0 <= value <= MAX_EXPONENT:
        return None
    return int(value)


@relax.expr_functor.mutator
class _PowerRewriter(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not call.op.same_as(_POWER):
            return call
        x, c = call.args
        xty, oty = x.ty, call.ty
        if not (isinstance(xty, relax.TensorType) and isinstance(oty, relax.TensorType)):
            return call
        if xty.dtype != oty.dtype or not str(xty.dtype).startswith(("float", "bfloat")):
            return call
        n = _small_exponent(c, x)
        if n is None:
            return call
        if n == 0:
            return relax.op.ones_like(x)
        if n == 1:
            return x
        sq = self.builder_.emit(relax.op.multiply(x, x)) if n >= 3 else None
        if n == 2:
            return relax.op.multiply(x, x)
        if n == 3:
            return relax.op.multiply(sq, x)
        return relax.op.multiply(sq, sq)


@tvm.transform.module_pass(opt_level=0, name="ExpandSmallPowers")
class ExpandSmallPowers:
    """Replace ``R.power(x, c)`` with a scalar constant ``c`` in {0..4} by multiplies."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite all Relax functions of ``mod``."""
        rewriter = _PowerRewriter(mod)
        return visit_functions(rewriter, mod)
