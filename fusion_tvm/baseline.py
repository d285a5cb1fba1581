"""TVM's own FuseOps partition, read back as groups of our graph nodes.

Every call_tir binding is first given a PrimFunc of its own (the same PrimFunc with a tag
attribute, so that FuseOps cannot de-duplicate identical groups), then stock ``FuseOps``
runs; the names inside each Primitive function it creates tell which bindings it grouped.
This lets the cost model price FuseOps's plan on the same graph as ours.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax

from .graph import is_kernel_call

_TAG = re.compile(r"__ftvm_(\d+)_(\d+)_(\d+)$")


def _tag_module(mod: tvm.IRModule, funcs: list[str]) -> tvm.IRModule:
    bb = relax.BlockBuilder(mod)
    new_funcs = {}
    for fi, fname in enumerate(funcs):
        func = mod[fname]
        blocks = []
        for bi, block in enumerate(func.body.blocks):
            bindings = []
            for ki, b in enumerate(block.bindings):
                v = b.value
                if is_kernel_call(v):
                    tag = f"__ftvm_{fi}_{bi}_{ki}"
                    gv = bb.add_func(mod[v.args[0]].with_attr("fusion_tvm.tag", tag), tag)
                    v = relax.Call(v.op, [gv, *v.args[1:]], v.attrs, v.ty_args)
                    b = relax.VarBinding(b.var, v) if isinstance(b, relax.VarBinding) else b
                bindings.append(b)
            cls = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) \
                else relax.BindingBlock
            blocks.append(cls(bindings))
        new_funcs[fname] = relax.Function(
            func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
            func.attrs,
        )
    out = bb.get()
    funcs_out = {gv: new_funcs.get(gv.name_hint, f) for gv, f in out.functions.items()}
    return tvm.IRModule(funcs_out, attrs=out.attrs, global_infos=out.global_infos)


def fuseops_groups(mod: tvm.IRModule, funcs: list[str]) -> dict[tuple[int, int], list[set[int]]]:
    """FuseOps's groups keyed by (function index, block index), as binding indices."""
    tagged = _tag_module(mod, funcs)
    fused = relax.transform.FuseOps()(relax.transform.Normalize()(tagged))
    result: dict[tuple[int, int], list[set[int]]] = {}
    for _gv, func in fused.functions.items():
        if not isinstance(func, relax.Function) or func.attrs is None:
            continue
        if "Primitive" not in func.attrs:
            continue
        members: list[tuple[int, int, int]] = []

        def visit(e, members=members):
            if is_kernel_call(e):
                m = _TAG.match(e.args[0].name_hint)
                if m:
                    members.append(tuple(int(x) for x in m.groups()))

        relax.analysis.post_order_visit(func.body, visit)
        if len(members) > 1:
            key = members[0][:2]
            result.setdefault(key, []).append({k for _, _, k in members})
    return result
