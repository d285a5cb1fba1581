"""Kernels compiled for a target of our choosing inside a Relax pipeline.

``tvm.compile(mod, "llvm", relax_pipeline=...)`` generates the TIR of the pipeline's output
for its own target, after the pipeline: an ``llvm`` target without ``mcpu`` gets generic
x86-64 code (no AVX, no F16C: an fp16 1024^3 matmul 17.7 s instead of 0.09 s). The
pipeline cannot change that target, so it builds the PrimFuncs itself for the host's and
hands them to the VM as an external module (as BYOC codegens do): Relax calls them by
their global symbol through ``ExternFunc``; the PrimFuncs leave the module.
"""

from __future__ import annotations

import tvm
from tvm import relax


@relax.expr_functor.mutator
class _CallBySymbol(relax.PyExprMutator):
    """Every reference to a PrimFunc's GlobalVar becomes an ExternFunc of its symbol."""

    def __init__(self, symbols: dict[str, str]):
        super().__init__()
        self.symbols = symbols

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:
        name = self.symbols.get(op.name_hint)
        return relax.ExternFunc(name) if name is not None else op


def prebuild_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` (lowered for the VM: shape functions and symbols attached) with its PrimFuncs
    compiled for ``target`` into an entry of the ``external_mods`` attribute."""
    prims = {gv: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    if not prims:
        return mod
    lib = tvm.tirx.build(tvm.IRModule(prims), target=target)
    symbols = {gv.name_hint: str(f.attrs.get("global_symbol", gv.name_hint))
               for gv, f in prims.items()}
    funcs = {
        gv: _CallBySymbol(symbols).visit_expr(f) if isinstance(f, relax.Function) else f
        for gv, f in mod.functions.items()
        if gv not in prims
    }
    attrs = dict(mod.attrs) if mod.attrs is not None else {}
    attrs["external_mods"] = [*attrs.get("external_mods", []), lib]
    return _with_attrs(tvm.IRModule(funcs, global_infos=mod.global_infos), attrs)


def _with_attrs(mod: tvm.IRModule, attrs: dict) -> tvm.IRModule:
    for key, value in attrs.items():
        mod = mod.with_attr(key, value)
    return mod


__all__ = ["prebuild_kernels"]
