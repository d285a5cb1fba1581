"""Structural analysis of one (legalized) TIR PrimFunc.

Everything here is derived from the IR, never from operator names: the work of each
block (by op class), whether it is a contraction (matmul / conv) or a reduction, and
how often each input element is re-read (its reuse factor), which tells the cost model
what inlining a producer into this function would recompute.

Shapes stay symbolic: extents are kept as ``PrimExpr`` and evaluated later against a
binding of symbolic dimension names (:func:`evaluate`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import tvm_ffi
from tvm import s_tir, tirx

from .ops import OpClass

#: TIR intrinsics counted as transcendental work.
TRANSCENDENTAL_OPS = frozenset(
    {
        "tirx.exp", "tirx.exp2", "tirx.exp10", "tirx.log", "tirx.log2", "tirx.log10",
        "tirx.log1p", "tirx.tanh", "tirx.sigmoid", "tirx.erf", "tirx.sqrt", "tirx.rsqrt",
        "tirx.pow", "tirx.sin", "tirx.cos", "tirx.tan", "tirx.atan", "tirx.asin", "tirx.acos",
        "tirx.sinh", "tirx.cosh", "tirx.atanh", "tirx.asinh", "tirx.acosh", "tirx.fmod",
    }
)

_ARITH = (
    tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod,
    tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And,
    tirx.Or,
)


def root_statements(func: tirx.PrimFunc) -> tuple[s_tir.SBlock, list]:
    """The root block of ``func`` and its body as a list of root statements."""
    root = func.body.block
    body = root.body
    return root, (list(body.seq) if isinstance(body, tirx.SeqStmt) else [body])


def evaluate(expr, dims: Mapping[str, int], default: int = 1) -> float:
    """Evaluate an integer ``PrimExpr`` with symbolic vars bound by name.

    Unknown vars take ``default``. Returns a float (extents can be huge).
    """
    if isinstance(expr, (int, float)):
        return float(expr)
    if isinstance(expr, tirx.IntImm):
        return float(expr.value)
    if isinstance(expr, tirx.FloatImm):
        return float(expr.value)
    if isinstance(expr, tirx.Var) or type(expr).__name__ == "Var":
        return float(dims.get(expr.name, default))
    if isinstance(expr, tirx.Cast):
        return evaluate(expr.value, dims, default)
    if isinstance(expr, (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.Div, tirx.FloorMod,
                         tirx.Mod, tirx.Min, tirx.Max)):
        a = evaluate(expr.a, dims, default)
        b = evaluate(expr.b, dims, default)
        if isinstance(expr, tirx.Add):
            return a + b
        if isinstance(expr, tirx.Sub):
            return a - b
        if isinstance(expr, tirx.Mul):
            return a * b
        if isinstance(expr, (tirx.FloorDiv, tirx.Div)):
            return math.floor(a / b) if b else 0.0
        if isinstance(expr, (tirx.FloorMod, tirx.Mod)):
            return a % b if b else 0.0
        if isinstance(expr, tirx.Min):
            return min(a, b)
        return max(a, b)
    if isinstance(expr, tirx.Select):
        return evaluate(expr.true_value, dims, default)
    return float(default)


def shape_elems(shape, dims: Mapping[str, int], default: int = 1) -> float:
    """Number of elements of a shape (sequence of PrimExpr)."""
    n = 1.0
    for d in shape:
        n *= evaluate(d, dims, default)
    return n


@dataclass
class BlockInfo:
    """Work of one TIR block."""

    name: str
    domain: tuple  # extents (PrimExpr) of all block iter vars
    num_reduce_axes: int
    ops: dict[OpClass, int]  # arithmetic ops per iteration, by class
    is_contraction: bool  # C += A * B
    loads: dict[str, int]  # buffer name -> loads per iteration
    writes: str


@dataclass
class PrimFuncInfo:
    """Summary of a PrimFunc used by :mod:`fusion_tvm.graph`."""

    blocks: list[BlockInfo] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    param_shapes: list[tuple] = field(default_factory=list)

    @property
    def op_class(self) -> OpClass:
        """The dominant kind of work: contraction > reduction > transcendental > elementwise."""
        if any(b.is_contraction for b in self.blocks):
            conv = any(b.is_contraction and b.num_reduce_axes >= 2 for b in self.blocks)
            return OpClass.CONV if conv else OpClass.MATMUL
        if any(b.num_reduce_axes for b in self.blocks):
            return OpClass.REDUCTION
        if any(b.ops.get(OpClass.TRANSCENDENTAL) for b in self.blocks):
            return OpClass.TRANSCENDENTAL
        return OpClass.ELEMENTWISE

    def flops(self, dims: Mapping[str, int]) -> dict[OpClass, float]:
        """FLOPs by op class, contractions counted as 2 per multiply-add."""
        out: dict[OpClass, float] = {}
        for b in self.blocks:
            n = shape_elems(b.domain, dims)
            for cls, k in b.ops.items():
                if b.is_contraction and cls is OpClass.ELEMENTWISE:
                    cls = OpClass.CONV if b.num_reduce_axes >= 2 else OpClass.MATMUL
                out[cls] = out.get(cls, 0.0) + n * k
        return out

    def read_ratio(self, param_index: int, dims: Mapping[str, int]) -> float:
        """Element reads of input ``param_index`` per element of it (may be < 1: a gather
        or a strided slice touches only part of its input)."""
        name = self.param_names[param_index]
        elems = max(1.0, shape_elems(self.param_shapes[param_index], dims))
        reads = 0.0
        for b in self.blocks:
            if name in b.loads:
                reads += shape_elems(b.domain, dims) * b.loads[name]
        return reads / elems

    def reuse(self, param_index: int, dims: Mapping[str, int]) -> float:
        """How many times each element of input ``param_index`` is read (>= 1)."""
        return max(1.0, self.read_ratio(param_index, dims))


def _repeated(expr, seen: set) -> bool:
    """Whether ``expr`` appeared earlier in the tree: a subexpression repeated (legalized
    fast_exp / sigmoid / tanh repeat their clamped argument a dozen times) is computed
    once after the compiler's common-subexpression elimination."""
    key = ("expr", tvm_ffi.structural_hash(expr))
    if key in seen:
        return True
    seen.add(key)
    return False


def _count_load(expr, loads: dict[str, int], seen: set) -> None:
    src = getattr(expr, "source", None)
    if src is None:
        src = getattr(expr, "buffer", None)
    name = getattr(src, "name", str(src))
    # distinct elements read per iteration: the same index read twice (a polynomial
    # using x several times) is one memory access
    key = (name, str(list(expr.indices)))
    if key not in seen:
        seen.add(key)
        loads[name] = loads.get(name, 0) + 1


def _count_call(expr, ops: dict[OpClass, int], loads: dict[str, int], seen: set) -> None:
    op_name = getattr(expr.op, "name", "")
    if op_name == "tirx.pow" and _small_integer_exponent(expr.args[1]):
        ops[OpClass.ELEMENTWISE] = ops.get(OpClass.ELEMENTWISE, 0) + 1  # x*x, x*x*x
    elif op_name in TRANSCENDENTAL_OPS:
        ops[OpClass.TRANSCENDENTAL] = ops.get(OpClass.TRANSCENDENTAL, 0) + 1
    elif op_name not in ("tirx.reinterpret",):
        ops[OpClass.ELEMENTWISE] = ops.get(OpClass.ELEMENTWISE, 0) + 1
    for a in expr.args:
        if not isinstance(a, (str, int, float)):
            _count(a, ops, loads, seen)


def _count(expr, ops: dict[OpClass, int], loads: dict[str, int], seen: set) -> None:
    kind = type(expr).__name__
    compound = isinstance(expr, (*_ARITH, tirx.Select)) or kind == "Call"
    if compound and _repeated(expr, seen):
        return
    if isinstance(expr, _ARITH):
        ops[OpClass.ELEMENTWISE] = ops.get(OpClass.ELEMENTWISE, 0) + 1
        _count(expr.a, ops, loads, seen)
        _count(expr.b, ops, loads, seen)
        return
    if kind in ("TensorLoad", "BufferLoad"):
        _count_load(expr, loads, seen)
    elif isinstance(expr, tirx.Cast):
        _count(expr.value, ops, loads, seen)
    elif isinstance(expr, tirx.Select):
        ops[OpClass.ELEMENTWISE] = ops.get(OpClass.ELEMENTWISE, 0) + 1
        for sub in (expr.condition, expr.true_value, expr.false_value):
            _count(sub, ops, loads, seen)
    elif isinstance(expr, tirx.Not):
        _count(expr.a, ops, loads, seen)
    elif kind == "Call":
        _count_call(expr, ops, loads, seen)


def count_ops(expr) -> dict[OpClass, int]:
    """Arithmetic of one expression by op class (as a block's body is counted)."""
    ops: dict[OpClass, int] = {}
    _count(expr, ops, {}, set())
    return ops


def _small_integer_exponent(expr) -> bool:
    """Exponents LLVM's pow simplification expands (1, x, x * x); any other ``pow`` stays a
    scalar libm call (``pow(x, 3)``: 7.4 ms against 0.34 ms as multiplies on 1x128x3072).
    ``ExpandSmallPowers`` rewrites the Relax ones up to 4 before legalization."""
    value = getattr(expr.value if isinstance(expr, tirx.Cast) else expr, "value", None)
    return isinstance(value, (int, float)) and float(value).is_integer() and 0 <= value <= 2


def _is_contraction(store, num_reduce: int) -> bool:
    if not num_reduce:
        return False
    v = store.value
    if not isinstance(v, tirx.Add):
        return False
    def load_source(e):
        e = e.value if isinstance(e, tirx.Cast) else e
        if type(e).__name__ in ("TensorLoad", "BufferLoad"):
            src = getattr(e, "source", None)
            return src if src is not None else getattr(e, "buffer", None)
        return None

    for lhs, rhs in ((v.a, v.b), (v.b, v.a)):
        if load_source(lhs) is None:
            continue
        inner = rhs.value if isinstance(rhs, tirx.Cast) else rhs
        if isinstance(inner, tirx.Mul):
            # A * B over two different tensors; (x - m) * (x - m) is a variance, not a matmul
            a, b = load_source(inner.a), load_source(inner.b)
            if a is not None and b is not None and not a.same_as(b):
                return True
    return False


def analyze_primfunc(func: tirx.PrimFunc) -> PrimFuncInfo:
    """Collect :class:`PrimFuncInfo` by walking the blocks of ``func``."""
    info = PrimFuncInfo()
    for p in func.params:
        shape = getattr(p, "shape", None)
        info.param_names.append(getattr(p, "name", str(p)))
        info.param_shapes.append(tuple(shape) if shape is not None else ())

    def visit(stmt):
        if stmt is None:
            return
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, s_tir.SBlockRealize):
            visit(stmt.block)
        elif isinstance(stmt, s_tir.SBlock):
            body = stmt.body
            if isinstance(body, tirx.BufferStore) and stmt.iter_vars:
                nred = sum(1 for iv in stmt.iter_vars if int(iv.iter_type) == 2)
                ops: dict[OpClass, int] = {}
                loads: dict[str, int] = {}
                _count(body.value, ops, loads, set())
                info.blocks.append(
                    BlockInfo(
                        name=stmt.name_hint,
                        domain=tuple(iv.dom.extent for iv in stmt.iter_vars),
                        num_reduce_axes=nred,
                        ops=ops,
                        is_contraction=_is_contraction(body, nred),
                        loads=loads,
                        writes=getattr(body.buffer, "name", ""),
                    )
                )
            else:
                visit(body)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case)
            visit(stmt.else_case)
        elif getattr(stmt, "body", None) is not None:
            visit(stmt.body)

    visit(func.body)
    return info
