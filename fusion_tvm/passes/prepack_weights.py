"""PrepackWeights: run the weight-packing stage of a kernel once, at compile time.

A schedule rule that repacks a constant input (the matmul rule's B panels) marks the
packing block with :data:`PREPACK_ATTR`. The block's root-level loop nest reads one
parameter that every caller passes as a constant (``MarkConstantParams``) and writes one
buffer of the kernel. This pass splits such a kernel in two: the packing loop nest becomes
a PrimFunc of its own, built and run here on each caller's constant; the kernel keeps its
name and now takes the packed buffer in place of the original parameter. At run time the
packing costs nothing (BERT-base packs 7 M weights a layer on every call otherwise).
Runs after the schedule rules.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, s_tir, tirx

from ..attrs import CONSTANT_PARAMS_ATTR, PREPACK_ATTR
from ..errors import InternalError
from ..relax_rewrite import visit_functions
from ..tir_analysis import root_statements


def _blocks(stmt) -> list:
    """The SBlocks inside ``stmt`` (outermost first)."""
    found = []
    pending = [stmt]
    while pending:
        s = pending.pop()
        if s is None:
            continue
        if isinstance(s, tirx.SeqStmt):
            pending.extend(s.seq)
        elif isinstance(s, s_tir.SBlockRealize):
            pending.append(s.block)
        elif isinstance(s, s_tir.SBlock):
            found.append(s)
            pending.append(s.body)
        elif isinstance(s, tirx.IfThenElse):
            pending.extend((s.then_case, s.else_case))
        elif getattr(s, "body", None) is not None:
            pending.append(s.body)
    return found


def _marked(block) -> bool:
    return block.annotations is not None and PREPACK_ATTR in block.annotations


def split_prepack(func: tirx.PrimFunc) -> tuple[list, tirx.PrimFunc] | None:
    """Split ``func`` into its compile-time packing stages and the kernel that remains.

    Returns ``(stages, kernel)`` with one ``(param_index, pack_func)`` per packed
    parameter, or None when ``func`` has no packing stage that can run at compile time.
    """
    constant = {int(i) for i in (func.attrs or {}).get(CONSTANT_PARAMS_ATTR, [])}
    root_realize = func.body
    if not constant or not isinstance(root_realize, s_tir.SBlockRealize):
        return None
    root, stmts = root_statements(func)
    params = list(func.params)
    stages, kept, packed_vars = [], [], []
    for stmt in stmts:
        blocks = _blocks(stmt)
        if not blocks or not all(_marked(b) for b in blocks):
            kept.append(stmt)
            continue
        sources = {r.source for b in blocks for r in b.reads}
        targets = {w.source for b in blocks for w in b.writes}
        index = next((i for i, p in enumerate(params) if p in sources), None)
        if len(sources) != 1 or len(targets) != 1 or index is None or index not in constant:
            kept.append(stmt)
            continue
        src, dst = params[index], next(iter(targets))
        if not any(dst.same_as(a) for a in root.alloc_buffers):
            kept.append(stmt)
            continue
        body = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", stmt))
        pack = tirx.PrimFunc([src, dst], body).with_attr("tirx.noalias", True)
        stages.append((index, pack))
        params[index] = dst
        packed_vars.append(dst)
    if not stages or not kept:
        return None
    allocs = [a for a in root.alloc_buffers if not any(a.same_as(p) for p in packed_vars)]
    new_root = s_tir.SBlock(
        [], [], [], root.name_hint, tirx.SeqStmt(kept) if len(kept) > 1 else kept[0],
        root.init, allocs, root.match_buffers, root.annotations,
    )
    kernel = tirx.PrimFunc(
        params, s_tir.SBlockRealize([], True, new_root), func.ret_type, func.attrs
    )
    return stages, kernel


def _run_pack(function, src: tvm.runtime.Tensor, dst_var) -> tvm.runtime.Tensor:
    shape = [int(d) for d in dst_var.ty.shape]
    out = tvm.runtime.tensor(np.zeros(shape, dtype=str(dst_var.ty.dtype)))
    function(src, out)
    return out


@relax.expr_functor.mutator
class _ConstantSwapper(relax.PyExprMutator):
    """Calls of a split kernel go to its new GlobalVar with the packed constants."""

    def __init__(self, mod, replace):
        super().__init__(mod)
        self.replace = replace  # kernel name -> (new GlobalVar, fields -> new fields)

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or len(call.args) < 2:
            return call
        callee = call.args[0]
        if not isinstance(callee, tvm.ir.GlobalVar) or callee.name_hint not in self.replace:
            return call
        new_gv, swap = self.replace[callee.name_hint]
        fields = swap(call.args[1].fields)
        return relax.Call(call.op, [new_gv, relax.Tuple(fields), *call.args[2:]], call.attrs,
                          call.ty_args)


@tvm.transform.module_pass(opt_level=0, name="PrepackWeights")
class PrepackWeights:
    """Move marked packing stages of constant inputs out of the kernels, run them now.

    Parameters
    ----------
    target : tvm.target.Target
        Where the packing functions are built to run at compile time (the host).
    """

    def __init__(self, target: tvm.target.Target | None = None):
        self.target = target

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Return ``mod`` with prepacked constants and kernels that read them."""
        splits = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                result = split_prepack(func)
                if result is not None:
                    splits[gv] = result
        if not splits:
            return mod
        target = self.target or tvm.target.Target("llvm")
        # Every packing function in one module: one LLVM build for the whole model.
        packs = {}
        for gv, (stages, _kernel) in splits.items():
            for index, pack in stages:
                name = f"pack_{len(packs)}"
                packs[name] = (gv.name_hint, index, pack.with_attr("global_symbol", name))
        try:
            executable = tvm.compile(
                tvm.IRModule({n: p for n, (_, _, p) in packs.items()}), target=target
            )
        except Exception as err:  # noqa: BLE001 - reported with the kernels' names
            raise InternalError(
                "building the compile-time weight packing of "
                f"{sorted({k for k, _, _ in packs.values()})} failed: {err}"
            ) from err
        replace = {}
        for gv in splits:
            built = [(index, executable[n], p.params[1])
                     for n, (kernel, index, p) in packs.items() if kernel == gv.name_hint]

            def swap(fields, built=built):
                fields = list(fields)
                for index, function, dst in built:
                    fields[index] = relax.const(_run_pack(function, fields[index].value, dst))
                return fields

            replace[gv.name_hint] = swap
        # The kernels change signature: they get new GlobalVars (same names).
        names = {gv.name_hint for gv in splits}
        base = tvm.IRModule(
            {gv: f for gv, f in mod.functions_items() if gv.name_hint not in names},
            attrs=mod.attrs, global_infos=mod.global_infos,
        )
        swapper = _ConstantSwapper(base, {})
        for gv, (_stages, kernel) in splits.items():
            new_gv = swapper.builder_.add_func(kernel, gv.name_hint)
            swapper.replace[gv.name_hint] = (new_gv, replace[gv.name_hint])
        return visit_functions(swapper, base)
