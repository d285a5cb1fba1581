"""Rewriting TIR expressions: substitution of vars and of whole subexpressions.

This TVM exposes no expression mutator to Python, so templates taken out of one
PrimFunc (a score, an exponential, an operand load) are rebuilt here node by node. Only
the node kinds of legalized elementwise / reduction bodies are known; anything else
raises :class:`UnsupportedExpr`, which callers treat as "not this workload".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call, TensorLoad

_BINARY = (
    tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod,
    tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And,
    tirx.Or, tirx.LShift, tirx.RShift, tirx.BitwiseAnd, tirx.BitwiseOr, tirx.BitwiseXor,
)
_LEAVES = (tirx.Var, tirx.IntImm, tirx.FloatImm)


class UnsupportedExpr(ValueError):
    """An expression node the rewriter does not know."""


def rewrite(expr, replace: Callable):
    """``expr`` rebuilt bottom-up, every node for which ``replace(node)`` returns an
    expression swapped for it (tried before descending: a replaced node's children are not
    visited)."""
    new = replace(expr)
    if new is not None:
        return new
    if isinstance(expr, _LEAVES):
        return expr
    if isinstance(expr, _BINARY):
        a, b = rewrite(expr.a, replace), rewrite(expr.b, replace)
        return expr if a.same_as(expr.a) and b.same_as(expr.b) else type(expr)(a, b)
    if isinstance(expr, (tirx.Not, tirx.BitwiseNot)):
        return type(expr)(rewrite(expr.a, replace))
    if isinstance(expr, tirx.Select):
        return tirx.Select(rewrite(expr.condition, replace), rewrite(expr.true_value, replace),
                           rewrite(expr.false_value, replace))
    if isinstance(expr, tirx.Cast):
        return tirx.Cast(expr.ty, rewrite(expr.value, replace))
    if isinstance(expr, TensorLoad):
        return tirx.BufferLoad(expr.source, [rewrite(i, replace) for i in expr.indices])
    if isinstance(expr, Call):
        return Call(expr.op, [rewrite(a, replace) for a in expr.args], expr.attrs,
                    list(expr.ty_args), ret_ty=expr.ty)
    if isinstance(expr, tirx.Let):
        return tirx.Let(expr.var, rewrite(expr.value, replace), rewrite(expr.body, replace))
    raise UnsupportedExpr(f"cannot rewrite a {type(expr).__name__}")


def substitute(expr, mapping: Mapping):
    """``expr`` with every var in ``mapping`` replaced by its value."""
    if not mapping:
        return expr
    return rewrite(expr, lambda e: mapping.get(e) if isinstance(e, tirx.Var) else None)


def replace_subexpr(expr, target, value):
    """``expr`` with every subexpression structurally equal to ``target`` replaced by
    ``value``."""
    return rewrite(expr, lambda e: value if tvm_ffi.structural_equal(e, target) else None)


def replace_loads(expr, buffer, value: Callable):
    """``expr`` with each load of ``buffer`` replaced by ``value(indices)``."""
    return rewrite(expr, lambda e: value(list(e.indices))
                   if isinstance(e, TensorLoad) and e.source.same_as(buffer) else None)


def loads(expr) -> list:
    """Every buffer load in ``expr`` (outer loads before the loads in their indices)."""
    found: list = []

    def visit(e):
        if isinstance(e, TensorLoad):
            found.append(e)
        return None

    rewrite(expr, visit)
    return found


def size(expr, limit: int) -> int:
    """Nodes of ``expr``, counted up to ``limit`` (then ``limit``: the walk stops)."""
    count = 0

    class _Full(Exception):
        pass

    def visit(_e):
        nonlocal count
        count += 1
        if count >= limit:
            raise _Full
        return None

    try:
        rewrite(expr, visit)
    except _Full:
        return limit
    return count


def free_vars(expr) -> set:
    """The vars ``expr`` reads."""
    return set(tirx.analysis.undefined_vars(expr))


def equal(a, b) -> bool:
    """Structural equality of two expressions over the same vars and buffers."""
    return bool(tvm_ffi.structural_equal(a, b))
