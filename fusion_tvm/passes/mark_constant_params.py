"""MarkConstantParams: tell each PrimFunc which of its inputs are compile-time constants.

A parameter is constant when every ``call_tir`` of the function passes a constant
in that position. The indices go to the ``fusion_tvm.constant_params`` attribute, where
schedule rules read them: a matmul whose B operand is constant packs it at compile time
(:class:`~fusion_tvm.passes.prepack_weights.PrepackWeights`) instead of on every call.
Runs after ``FuseTIR``, before the schedule rules.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

from ..attrs import CONSTANT_PARAMS_ATTR

__all__ = ["CONSTANT_PARAMS_ATTR", "MarkConstantParams", "call_sites"]


def call_sites(mod: tvm.IRModule) -> dict[str, list[relax.Call]]:
    """Every ``call_tir`` of each PrimFunc (by name) in the Relax functions of ``mod``."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    sites: dict[str, list[relax.Call]] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            sites.setdefault(expr.args[0].name_hint, []).append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return sites


@tvm.transform.module_pass(opt_level=0, name="MarkConstantParams")
class MarkConstantParams:
    """Set ``fusion_tvm.constant_params`` on PrimFuncs called with constant arguments."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Return ``mod`` with the attribute on every function that has a constant input."""
        sites = call_sites(mod)
        updates = {}
        for gv, func in mod.functions_items():
            calls = sites.get(gv.name_hint)
            if not isinstance(func, tirx.PrimFunc) or not calls:
                continue
            # A call whose arguments are not a literal tuple (a tuple variable) says nothing.
            if any(not isinstance(c.args[1], relax.Tuple) for c in calls):
                continue
            constant = [
                i
                for i in range(len(calls[0].args[1].fields))
                if all(
                    i < len(c.args[1].fields) and isinstance(c.args[1].fields[i], Constant)
                    for c in calls
                )
            ]
            if constant:
                updates[gv] = func.with_attr(CONSTANT_PARAMS_ATTR, constant)
        if not updates:
            return mod
        functions = {gv: updates.get(gv, func) for gv, func in mod.functions_items()}
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
