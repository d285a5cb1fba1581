"""Walking the (fused, s_tir) PrimFuncs the HLS emitter prints: leaf blocks and their loops.

A *leaf block* is an ``SBlock`` whose body is a single ``BufferStore``: one pipelined loop
nest of the generated C++. Operators are counted by kind on its value (floating-point
only: index arithmetic becomes wires, not DSPs), which the FPGA cost model prices.
:func:`direct_ports` tells which parameters the printer streams directly (no local copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx

from ...tir_analysis import TRANSCENDENTAL_OPS
from .cost_model import NestCost

#: Loop annotations written by the schedule rule, read by the emitter.
PIPELINE_ATTR = "hls.pipeline_ii"
UNROLL_ATTR = "hls.unroll"

_CMP = (tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.Select)


def dtype_of(expr) -> str:
    """The dtype of a PrimExpr as a string (``"float32"``, ``"int64"``, ``"bool"``)."""
    ty = getattr(expr, "ty", None)
    dt = getattr(ty, "dtype", None)
    return str(dt) if dt is not None else str(getattr(expr, "dtype", ""))


def is_float(expr) -> bool:
    """Whether ``expr`` is floating point."""
    return dtype_of(expr).startswith(("float", "bfloat"))


def int_value(expr) -> int:
    """A constant integer extent (raises ValueError for a symbolic one)."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    raise ValueError(f"symbolic extent {expr} (the HLS backend needs static shapes)")


def children(expr) -> list:
    """Sub-expressions of ``expr``."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)) or type(expr).__name__ == "Var":
        return []
    kind = type(expr).__name__
    if kind in ("TensorLoad", "BufferLoad"):
        return list(expr.indices)
    if isinstance(expr, tirx.Select):
        return [expr.condition, expr.true_value, expr.false_value]
    if isinstance(expr, (tirx.Cast, tirx.Not, tirx.BitwiseNot)):
        return [expr.value if isinstance(expr, tirx.Cast) else expr.a]
    if kind == "Call":
        return [a for a in expr.args if not isinstance(a, (str, int, float))]
    if hasattr(expr, "a") and hasattr(expr, "b"):
        return [expr.a, expr.b]
    return []


def count_ops(expr, ops: dict[str, float]) -> None:
    """Add the floating-point operators of ``expr`` to ``ops`` by DSP class."""
    kind = type(expr).__name__
    if is_float(expr) or isinstance(expr, _CMP):
        key = None
        if isinstance(expr, tirx.Mul):
            key = "mul"
        elif isinstance(expr, (tirx.Add, tirx.Sub)):
            key = "add"
        elif isinstance(expr, (tirx.Div, tirx.FloorDiv)):
            key = "div"
        elif isinstance(expr, _CMP) and all(is_float(c) for c in children(expr)[-2:]):
            key = "cmp"
        elif kind == "Call":
            name = "tirx." + getattr(expr.op, "name", "").split(".")[-1]
            if name in TRANSCENDENTAL_OPS:
                key = "transcendental"
            elif name == "tirx.if_then_else":
                key = "cmp"
        if key is not None:
            ops[key] = ops.get(key, 0.0) + 1
    for c in children(expr):
        count_ops(c, ops)


@dataclass
class LeafBlock:
    """A leaf block with the loops around it (outermost first)."""

    realize: s_tir.SBlockRealize
    loops: list[tirx.For]

    @property
    def block(self) -> s_tir.SBlock:
        return self.realize.block

    @property
    def name(self) -> str:
        return self.block.name_hint

    @property
    def has_reduce(self) -> bool:
        return any(int(iv.iter_type) == 2 for iv in self.block.iter_vars)

    def nest(self, stream_bound: bool = False) -> NestCost:
        """The block as a loop nest for :mod:`fusion_tvm.targets.hls.cost_model`."""
        trips = 1.0
        for lp in self.loops:
            trips *= int_value(lp.extent)
        inner = int_value(self.loops[-1].extent) if self.loops else 1
        ops: dict[str, float] = {}
        count_ops(self.block.body.value, ops)
        inner_red = self.innermost_reduces
        return NestCost(self.name, trips, inner, ops, accumulates=inner_red,
                        stream_bound=stream_bound, recurrence=self.has_reduce and not inner_red)

    @property
    def innermost_reduces(self) -> bool:
        """Whether the innermost loop drives a reduction iter var (a carried accumulation)."""
        if not self.has_reduce or not self.loops:
            return self.has_reduce
        var = self.loops[-1].loop_var
        for iv, val in zip(self.block.iter_vars, self.realize.iter_values, strict=True):
            if int(iv.iter_type) == 2 and _uses_var(val, var):
                return True
        return False


def leaf_blocks(func: tirx.PrimFunc) -> list[LeafBlock]:
    """Leaf blocks of ``func`` in program order."""
    out: list[LeafBlock] = []

    def visit(stmt, loops):
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, loops)
        elif isinstance(stmt, tirx.For):
            visit(stmt.body, loops + [stmt])
        elif isinstance(stmt, s_tir.SBlockRealize):
            body = stmt.block.body
            if isinstance(body, tirx.BufferStore) and len(stmt.block.iter_vars):
                out.append(LeafBlock(stmt, loops))
            else:
                visit(body, loops)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case, loops)
            if stmt.else_case is not None:
                visit(stmt.else_case, loops)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body, loops)

    visit(func.body, [])
    return out


def alloc_buffers(func: tirx.PrimFunc) -> list:
    """Buffers allocated inside ``func`` (intermediates), in order."""
    out = []

    def visit(stmt):
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, s_tir.SBlockRealize):
            out.extend(stmt.block.alloc_buffers)
            visit(stmt.block.body)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case)
            if stmt.else_case is not None:
                visit(stmt.else_case)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body)

    visit(func.body)
    return out


def loop_annotation(loop: tirx.For, key: str) -> int | None:
    """An integer loop annotation, or None."""
    ann = loop.annotations
    if ann is None or key not in ann:
        return None
    v = ann[key]
    return int(v.value) if hasattr(v, "value") else int(v)


# ------------------------------------------------------------------- direct streaming
def _identity_leaf(lb) -> bool:
    rz, blk = lb.realize, lb.block
    if lb.has_reduce or blk.init is not None or len(blk.iter_vars) != len(lb.loops):
        return False
    if not (isinstance(rz.predicate, tirx.IntImm) and int(rz.predicate.value) == 1):
        return False
    for iv, val, lp in zip(blk.iter_vars, rz.iter_values, lb.loops, strict=True):
        if not val.same_as(lp.loop_var) or int_value(lp.min) != 0:
            return False
        if int_value(iv.dom.extent) != int_value(lp.extent):
            return False
    return True


def buffer_accesses(func):
    """Per buffer name: (leaf, kind, indices, conditional) for every load and store."""
    acc: dict[str, list] = {}

    def visit(e, lb, cond):
        kind = type(e).__name__
        if kind in ("TensorLoad", "BufferLoad"):
            src = e.source if hasattr(e, "source") else e.buffer
            acc.setdefault(src.name, []).append((lb, "load", list(e.indices), cond))
        if kind == "Call" and getattr(e.op, "name", "").endswith("if_then_else"):
            visit(e.args[0], lb, cond)
            for a in e.args[1:]:
                visit(a, lb, True)
            return
        if isinstance(e, tirx.Select):
            visit(e.condition, lb, cond)
            visit(e.true_value, lb, True)
            visit(e.false_value, lb, True)
            return
        for c in children(e):
            visit(c, lb, cond)

    for lb in leaf_blocks(func):
        st = lb.block.body
        acc.setdefault(st.buffer.name, []).append((lb, "store", list(st.indices), False))
        visit(st.value, lb, False)
        for i in st.indices:
            visit(i, lb, False)
        if lb.block.init is not None:
            ist = lb.block.init
            acc.setdefault(ist.buffer.name, []).append((lb, "store", list(ist.indices), False))
            visit(ist.value, lb, False)
    return acc


def _identity_access(lb, indices, shape) -> bool:
    ivs = [iv.var for iv in lb.block.iter_vars]
    if len(indices) != len(ivs) or len(shape) != len(ivs):
        return False
    for idx, iv, extent, dim in zip(indices, ivs, (iv.dom.extent for iv in lb.block.iter_vars),
                                    shape, strict=True):
        if not idx.same_as(iv) or int_value(extent) != int_value(dim):
            return False
    return True


def direct_ports(func: tirx.PrimFunc) -> tuple[set[int], set[int]]:
    """Parameter indices that can be streamed directly: (inputs read, outputs written)."""
    acc = buffer_accesses(func)
    ins, outs = set(), set()
    for k, p in enumerate(func.params):
        uses = acc.get(p.name, [])
        loads = [u for u in uses if u[1] == "load"]
        stores = [u for u in uses if u[1] == "store"]
        if len(uses) != 1:
            continue
        lb, _, indices, cond = uses[0]
        if cond or not _identity_leaf(lb) or not _identity_access(lb, indices, p.shape):
            continue
        if loads:
            ins.add(k)
        elif stores:
            outs.add(k)
    return ins, outs


def stream_bound_blocks(func: tirx.PrimFunc) -> set[str]:
    """Leaf blocks that read or write a parameter directly from / to a stream."""
    ins, outs = direct_ports(func)
    acc = buffer_accesses(func)
    names: set[str] = set()
    for k in ins | outs:
        for lb, *_ in acc.get(func.params[k].name, []):
            names.add(lb.name)
    return names


def _uses_var(expr, var) -> bool:
    if type(expr).__name__ == "Var":
        return expr.same_as(var)
    return any(_uses_var(c, var) for c in children(expr))
