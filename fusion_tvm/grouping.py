"""Rewrite a dataflow block so that each multi-node group is one Primitive function.

Each group becomes a private ``relax.Function`` with ``{"Primitive": True}`` whose body
re-emits the members' ``call_tir`` bindings; its parameters are the group's external
inputs (vars and constants alike, as FuseOps does) and it returns every value used
outside the group (a tuple when there are several). Stock ``FuseTIR`` then makes one
PrimFunc per group. Bindings are re-ordered topologically (original order as the
tie-break), which keeps ``match_cast`` definitions before their uses.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import tvm
from tvm import relax

from .errors import InternalError
from .graph import FusionGraph


def group_name(graph: FusionGraph, members: Sequence[int]) -> str:
    parts = []
    for i in members:
        name = graph.nodes[i].func_name
        if name and name not in parts:
            parts.append(name)
    name = "fused_" + "_".join(parts)
    return name[:80]


def _is_symbolic_scalar(expr) -> bool:
    """A symbolic dim (or other scalar) passed as a call_tir argument."""
    return isinstance(getattr(expr, "ty", None), tvm.ir.PrimType) or isinstance(
        expr, relax.ShapeExpr
    )


def published_vars(graph: FusionGraph, members: Sequence[int], used_later: set) -> list:
    """The binding vars of ``members`` used outside the group, in member order."""
    inner = set(members)
    published = []
    for i in members:
        var = graph.nodes[i].binding.var
        t = graph.tensors[graph.nodes[i].outputs[0]]
        if var in used_later or any(c not in inner for c in t.consumers) or t.escapes:
            published.append(var)
    return published


def _emit_group(
    bb: relax.BlockBuilder, graph: FusionGraph, members: list[int], used_later: set
) -> tuple[relax.GlobalVar, list, list]:
    """Create the Primitive function of a group.

    Returns the function's GlobalVar, the call arguments, and the list of
    (original binding var) it publishes, in return order.
    """
    params: list[relax.Var] = []
    args: list = []
    arg_index: dict = {}
    remap: dict = {}
    bindings = []
    for i in members:
        call = graph.nodes[i].binding.value
        new_fields = []
        for f in call.args[1].fields:
            if isinstance(f, relax.Var) and f in remap:
                new_fields.append(remap[f])
                continue
            if _is_symbolic_scalar(f):  # a shape variable passed to the PrimFunc: keep inline
                new_fields.append(f)
                continue
            if f not in arg_index:
                p = relax.Var(f"p{len(params)}", f.ty)
                arg_index[f] = p
                params.append(p)
                args.append(f)
            new_fields.append(arg_index[f])
        new_call = relax.Call(
            call.op, [call.args[0], relax.Tuple(new_fields)], call.attrs, call.ty_args
        )
        var = graph.nodes[i].binding.var
        new_var = relax.DataflowVar(var.name, var.ty)
        remap[var] = new_var
        bindings.append(relax.VarBinding(new_var, new_call))
    published = published_vars(graph, members, used_later)
    if not published:
        raise InternalError(f"group {group_name(graph, members)} publishes no output")
    if len(published) == 1:
        out_var = relax.Var("gv", published[0].ty)
        bindings.append(relax.VarBinding(out_var, remap[published[0]]))
    else:
        tup = relax.Tuple([remap[v] for v in published])
        out_var = relax.Var("gv", relax.TupleType([v.ty for v in published]))
        bindings.append(relax.VarBinding(out_var, tup))
    # Symbolic dims used inside the group but not definable from its tensor parameters
    # (e.g. only ``batch * seq`` appears) come in through one extra shape parameter.
    definable = set()
    for p in params:
        definable.update(v.name for v in relax.analysis.definable_tir_vars_in_type(p.ty))
    needed: dict[str, object] = {}
    for b in bindings:
        for v in relax.analysis.tir_vars_in_type(b.var.ty):
            if v.name not in definable:
                needed.setdefault(v.name, v)
        for f in b.value.args[1].fields if isinstance(b.value, relax.Call) else ():
            if isinstance(getattr(f, "ty", None), tvm.ir.PrimType) and f.name not in definable:
                needed.setdefault(f.name, f)
    if needed:
        dims = [needed[k] for k in sorted(needed)]
        params.append(relax.Var("dims", relax.ShapeType(dims)))
        args.append(relax.ShapeExpr(dims))
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], out_var)
    func = relax.Function(params, body, out_var.ty, is_pure=True)
    # Symbolic dims must not be shared with the caller: give the group its own copies.
    func = relax.utils.copy_with_new_vars(func).with_attr("Primitive", True)
    gv = bb.add_func(func, group_name(graph, members))
    return gv, args, published


def rewrite_block(
    bb: relax.BlockBuilder,
    graph: FusionGraph,
    block: relax.DataflowBlock,
    groups: Sequence[frozenset[int]],
    used_later: set,
    kernel_names: dict[frozenset[int], str] | None = None,
    dropped: list[frozenset[int]] | None = None,
) -> relax.DataflowBlock:
    """The block with every multi-node group replaced by a call to its function.

    ``kernel_names``, when given, receives each multi-node group's function name (which
    ``FuseTIR`` gives to the group's PrimFunc). A group none of whose values is used (dead
    code) is dropped, as FuseOps drops it; ``dropped``, when given, receives those groups.
    """
    n = len(graph.nodes)
    item_of = list(range(n))
    items: dict[int, list[int]] = {i: [i] for i in range(n)}
    for g in groups:
        if len(g) < 2:
            continue
        ms = sorted(g)
        head = ms[0]
        for i in ms:
            item_of[i] = head
            if i != head:
                items.pop(i, None)
        items[head] = ms
    # topological order of items, ties broken by original position
    indeg = dict.fromkeys(items, 0)
    succ: dict[int, set[int]] = {k: set() for k in items}
    for u in range(n):
        for v in graph.succs[u]:
            a, b = item_of[u], item_of[v]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
    ready = [k for k, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != len(items):
        raise InternalError("fusion groups form a cycle; the partition is not legal")

    new_bindings = []
    for k in order:
        ms = items[k]
        if len(ms) == 1:
            new_bindings.append(graph.nodes[ms[0]].binding)
            continue
        if not published_vars(graph, ms, used_later):  # dead: its bindings are pure
            if dropped is not None:
                dropped.append(frozenset(ms))
            continue
        gv, args, published = _emit_group(bb, graph, ms, used_later)
        if kernel_names is not None:
            kernel_names[frozenset(ms)] = gv.name_hint
        call = relax.Call(gv, args)
        if len(published) == 1:
            new_bindings.append(relax.VarBinding(published[0], call))
        else:
            tup = relax.DataflowVar(
                "fused_out", relax.TupleType([v.ty for v in published])
            )
            new_bindings.append(relax.VarBinding(tup, call))
            for idx, var in enumerate(published):
                new_bindings.append(relax.VarBinding(var, relax.TupleGetItem(tup, idx)))
    return relax.DataflowBlock(new_bindings, block.span)


def vars_used_after(func: relax.Function, block_index: int) -> set:
    """Vars referenced by later blocks of ``func`` or by its result."""
    used: set = set()
    body = func.body
    for blk in list(body.blocks)[block_index + 1:]:
        for b in blk.bindings:
            used.update(relax.analysis.free_vars(b.value))
    used.update(relax.analysis.free_vars(body.body))
    return used


__all__ = ["published_vars", "rewrite_block", "vars_used_after"]
