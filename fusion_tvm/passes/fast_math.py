"""FastMath: stock ``FastMathTransform`` that leaves calls of non-operators alone.

TVM's ``FastMathTransform`` reads ``call.op.name`` on every call, so a model with a
data-dependent shape (``R.call_packed("vm.builtin.tensor_to_shape", ...)``, an ``ExternFunc``)
or a call of another Relax function (a ``GlobalVar``) fails with ``AttributeError`` (ONNX
conformance ``test_expand_dim_unchanged``: stock TVM passes, ours failed). Same rewrites
(softmax, exp, erf, tanh to their vectorisable polynomial versions), operators only, and
sigmoid as ``1 / (1 + fast_exp(-x))``: TVM lowers ``T.sigmoid`` to a scalar ``expf`` call
per element (a SiLU epilogue took 3 ns an element, twice the conv it followed).

Half-precision inputs (float16, bfloat16) are computed in float32 and rounded back: TVM's
polynomials exist for float32 only, and for other types fall back to a scalar libm call
(TVM #20342's chain of eight fp16 exps: 2.4 ns an element per exp, 13x the float32
polynomial; rounding the float32 result is what a libm ``expf`` on a half does too).
"""

from __future__ import annotations

import functools

import tvm
from tvm import te, topi
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from ..relax_rewrite import visit_functions


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``1 / (1 + exp(-x))`` with TVM's polynomial ``fast_exp`` (inputs clamped to its
    range: the result saturates to 0 or 1 as the exact one does)."""
    e = topi.fast_exp(topi.negative(x))
    one = tvm.tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="fast_sigmoid")


#: Types computed in float32 by the fast versions (no polynomial of their own in TOPI).
_WIDENED = ("float16", "bfloat16")


def _widened(fn):
    """``fn`` applied in float32 to a half-precision tensor, the result cast back."""

    @functools.wraps(fn)  # call_te names the PrimFunc after it
    def apply(x: te.Tensor, *args) -> te.Tensor:
        if x.dtype not in _WIDENED:
            return fn(x, *args)
        return topi.cast(fn(topi.cast(x, "float32"), *args), x.dtype)

    return apply


_FAST = {
    "relax.sigmoid": fast_sigmoid,
    "relax.exp": topi.fast_exp,
    "relax.erf": topi.fast_erf,
    "relax.tanh": topi.fast_tanh,
}


@expr_functor.mutator
class _FastMathMutator(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.nn.softmax":
            return self.builder_.call_te(_widened(topi.nn.fast_softmax), call.args[0],
                                         call.attrs.axis)
        if call.op.name in _FAST:
            return self.builder_.call_te(_widened(_FAST[call.op.name]), call.args[0])
        return call


@tvm.transform.module_pass(opt_level=0, name="FastMath")
class FastMath:
    """Replace softmax / exp / erf / tanh by TVM's fast approximations (as FastMathTransform)
    and sigmoid by one built on ``fast_exp``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Return ``mod`` with the fast versions in every Relax function."""
        mutator = _FastMathMutator(mod)
        return visit_functions(mutator, mod)
