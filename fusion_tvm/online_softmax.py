"""The online-softmax (flash) form of a fused attention PrimFunc.

FuseTIR turns an attention group into one block per op: ``Q K^T``, the ops between it and
the softmax (scale, mask), the row max, ``exp(s - max)``, the row sum, the division and
``P V``. With every row-local spatial block inlined, four reductions remain, and
:func:`match_attention` checks that they compute, for every row ``r`` (batch dims and the
query) and key ``j``::

    a[r, j] = sum_k  Q(r, k) * K(r, j, k)          # first contraction
    s[r, j] = score(a[r, j], r, j)                   # any elementwise function
    m[r]    = max_j  s[r, j]
    l[r]    = sum_j  exp(s[r, j] - m[r])
    o[r, d] = sum_j  (exp(s[r, j] - m[r]) / l[r]) * V(r, j, d)

with ``exp`` either ``T.exp`` or TVM's ``fast_exp`` polynomial, structurally, not by op
names. Such a function may be computed over blocks of keys with a running max ``m``, sum
``l`` and output accumulator ``o``, each block's contribution rescaled by
``exp(m_old - m_new)`` (the online softmax): no row of ``S`` scores is ever held, only
one block of them. The result is an :class:`AttentionForm` of expression templates over
canonical vars, from which a backend generates its kernel. Anything else, including
groups that are a part of the chain, returns None (the row-wise template takes them).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from tvm import s_tir, te, tirx, topi
from tvm.ir.expr import TensorLoad
from tvm.s_tir.schedule import ScheduleError

from .tir_analysis import root_statements
from .tir_expr import (
    UnsupportedExpr,
    equal,
    free_vars,
    loads,
    replace_loads,
    replace_subexpr,
    size,
    substitute,
)

logger = logging.getLogger(__name__)


class _NoMatch(Exception):
    """The function is not softmax attention (the message says why)."""


@dataclass(frozen=True)
class AttentionForm:
    """Expression templates of one ``softmax(score(Q K^T)) V`` PrimFunc.

    Templates are expressions over the canonical vars ``rows`` (batch dims, then the query
    row), ``key``, ``red`` (the ``Q K^T`` reduction) and ``col`` (a column of ``P V``), and
    load the function's own buffers; substitute index expressions for the vars to use them.

    Attributes
    ----------
    func : PrimFunc
        The function after inlining its row-local blocks (same parameters as the input).
    rows, row_extents : tuple
        Canonical row vars and their extents (the last is the query row).
    key, key_extent, red, red_extent, col, col_extent
        The key var, the ``Q K^T`` reduction var and the output column var, with extents.
    q_term, k_term : PrimExpr
        The two factors of ``Q K^T``: ``q_term`` over ``rows`` and ``red``, ``k_term`` over
        ``rows[:-1]``, ``key`` and ``red``.
    score : PrimExpr
        The softmax input over ``rows``, ``key`` and ``acc`` (the ``Q K^T`` value).
    acc : Var
        The placeholder of ``score`` for the ``Q K^T`` value.
    weight_arg, weight : Var, PrimExpr
        The exponential ``weight(weight_arg)`` (``exp`` or ``fast_exp``).
    max_init : PrimExpr
        The initial value of the row max (the lowest float, or minus infinity).
    v_term : PrimExpr
        The ``V`` factor of ``P V`` over ``rows[:-1]``, ``key`` and ``col``.
    out, out_indices
        The buffer ``P V`` writes and its indices over ``rows`` and ``col``.
    epilogue : tuple of Stmt
        The root statements after ``P V`` (an output transpose), unchanged.
    allocs : tuple of Buffer
        Root buffers the epilogue uses (``out`` when it is an intermediate).
    """

    func: tirx.PrimFunc
    rows: tuple
    row_extents: tuple
    key: tirx.Var
    key_extent: object
    red: tirx.Var
    red_extent: int
    col: tirx.Var
    col_extent: int
    q_term: object
    k_term: object
    score: object
    acc: tirx.Var
    weight_arg: tirx.Var
    weight: object
    max_init: object
    v_term: object
    out: object
    out_indices: tuple
    epilogue: tuple
    allocs: tuple

    @property
    def static_rows(self) -> int | None:
        """Score rows in all (batch dims times query rows), None when one is symbolic."""
        if not all(isinstance(e, tirx.IntImm) for e in self.row_extents):
            return None
        return math.prod(int(e.value) for e in self.row_extents)

    @property
    def dtype(self) -> str:
        """Element type of the computation (float32 only, for now)."""
        return str(self.out.dtype)

    def exp(self, x):
        """The form's exponential of ``x``."""
        return substitute(self.weight, {self.weight_arg: x})


def match_attention(func: tirx.PrimFunc) -> AttentionForm | None:
    """The :class:`AttentionForm` of ``func``, or None when it is not softmax attention."""
    try:
        return _match(func)
    except (_NoMatch, UnsupportedExpr, ScheduleError, ValueError) as err:
        logger.debug("online softmax: %s", err)
        return None


# ------------------------------------------------------------------------------- matching
#: Expression nodes an inline may give a consumer. Polynomial exps read their argument
#: ~18 times: inlining a chain of them multiplies (TVM #20342's eight exps: 18^8 nodes).
MAX_INLINED_NODES = 20000


def _inline_row_local(sch: s_tir.Schedule) -> None:
    """Inline every spatial root block that has a consumer, until none can be; raise
    :class:`_NoMatch` before an inline would exceed :data:`MAX_INLINED_NODES`."""
    root = sch.get_sblock("root")
    changed = True
    while changed:
        changed = False
        outputs = [sch.get(b) for b in sch.get_output_blocks(root)]
        for block in sch.get_child_blocks(root):
            stmt = sch.get(block)
            if any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
                continue
            if any(stmt.same_as(o) for o in outputs) or not isinstance(stmt.body,
                                                                       tirx.BufferStore):
                continue
            produced = size(stmt.body.value, MAX_INLINED_NODES)
            buf = stmt.body.buffer
            for consumer in sch.get_consumers(block):
                body = sch.get(consumer).body
                value = getattr(body, "value", None)
                reads = sum(1 for ld in loads(value) if ld.source.same_as(buf)) \
                    if value is not None else 0
                if size(value, MAX_INLINED_NODES) + reads * produced > MAX_INLINED_NODES:
                    raise _NoMatch("inlining the row-local chain grows too large")
            try:
                sch.compute_inline(block)
            except ScheduleError:
                continue
            changed = True
            break


def _reduction(stmt, combiner) -> tuple:
    """``(buffer, store indices, operand, init value)`` of ``buf[i] = combiner(buf[i], x)``."""
    body, init = stmt.body, stmt.init
    if not isinstance(body, tirx.BufferStore) or not isinstance(init, tirx.BufferStore):
        raise _NoMatch(f"{stmt.name_hint} is not one store")
    if not isinstance(body.value, combiner):
        raise _NoMatch(f"{stmt.name_hint} does not combine with {combiner.__name__}")
    for own, operand in ((body.value.a, body.value.b), (body.value.b, body.value.a)):
        if isinstance(own, TensorLoad) and own.source.same_as(body.buffer) and all(
            equal(a, b) for a, b in zip(own.indices, body.indices, strict=True)
        ):
            return body.buffer, list(body.indices), operand, init.value
    raise _NoMatch(f"{stmt.name_hint} does not accumulate into its own element")


def _iters(stmt) -> tuple[list, list]:
    """Spatial and reduction iter vars of a block (no other kinds)."""
    spatial = [iv for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(stmt.iter_vars) or len(reduce) != 1:
        raise _NoMatch(f"{stmt.name_hint} is not a single-axis reduction")
    return spatial, reduce


def _canonical_by_loads(stmt, expr, acc, rows, key, extra: tirx.Var | None = None) -> dict:
    """Map a row block's iter vars to the canonical ones through its loads of ``acc``
    (``acc[rows..., key]``); unit-extent iters left over map to 0, at most one other to
    ``extra`` (the output column of ``P V``)."""
    spatial, reduce = _iters(stmt)
    found = [ld for ld in loads(expr) if ld.source.same_as(acc)]
    if not found:
        raise _NoMatch(f"{stmt.name_hint} does not read the scores")
    first = found[0].indices
    if any(not all(equal(a, b) for a, b in zip(ld.indices, first, strict=True))
           for ld in found[1:]):
        raise _NoMatch(f"{stmt.name_hint} reads the scores at several positions")
    mapping: dict = {}
    for idx, canon in zip(first, (*rows, key), strict=True):
        if not isinstance(idx, tirx.Var) or idx in mapping:
            raise _NoMatch(f"{stmt.name_hint} reads the scores off its own row")
        mapping[idx] = canon
    if mapping.get(reduce[0].var) is not key:
        raise _NoMatch(f"{stmt.name_hint} does not reduce along the keys")
    rest = [iv for iv in spatial if iv.var not in mapping]
    wide = [iv for iv in rest if not _is_one(iv.dom.extent)]
    if (extra is None and wide) or len(wide) > 1:
        raise _NoMatch(f"{stmt.name_hint} has iters beyond the score rows")
    if extra is not None:
        pick = wide[0] if wide else (rest[-1] if rest else None)
        if pick is None:
            raise _NoMatch(f"{stmt.name_hint} has no output column")
        mapping[pick.var] = extra
        rest = [iv for iv in rest if iv is not pick]
    for iv in rest:
        mapping[iv.var] = tirx.IntImm(iv.var.ty, 0)
    return mapping


def _is_one(extent) -> bool:
    return isinstance(extent, tirx.IntImm) and int(extent.value) == 1


def _static(extent) -> int | None:
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


@lru_cache(maxsize=4)
def _fast_exp_template(dtype: str) -> tuple:
    """``(x, fast_exp(x))``: TOPI's polynomial exponential as an expression of a var."""
    a = te.placeholder((1,), dtype, name="a")
    func = te.create_prim_func([a, topi.fast_exp(a)])
    sch = s_tir.Schedule(func)
    (only,) = sch.get_child_blocks(sch.get_sblock("root"))
    block = sch.get(only)
    x = tirx.Var("x", dtype)
    return x, replace_loads(block.body.value, func.params[0], lambda _: x)


def _is_exp(expr, x) -> bool:
    """Whether ``expr`` (over ``x`` only) is ``exp(x)`` or TOPI's ``fast_exp(x)``."""
    if equal(expr, tirx.exp(x)):
        return True
    ref_x, ref = _fast_exp_template(str(x.ty))
    return equal(expr, substitute(ref, {ref_x: x}))


def _match(func: tirx.PrimFunc) -> AttentionForm:
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    kinds = [any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(b).iter_vars)
             for b in sch.get_child_blocks(root)]
    if sum(kinds) != 4:
        raise _NoMatch(f"{sum(kinds)} reductions, not 4")
    _inline_row_local(sch)
    blocks = [sch.get(b) for b in sch.get_child_blocks(root)]
    if any(sch.get_child_blocks(b) for b in sch.get_child_blocks(root)):
        raise _NoMatch("nested blocks")
    reds = [k for k, b in enumerate(blocks)
            if any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars)]
    if len(reds) != 4 or reds != list(range(4)):
        raise _NoMatch(f"{len(reds)} reductions, or a spatial block before the last one")
    c1, rmax, rsum, c2 = blocks[:4]
    epilogue_blocks = blocks[4:]

    # Q K^T: acc[r..., j] = sum_k a * b, written at its own iters.
    acc, acc_idx, prod, init = _reduction(c1, tirx.Add)
    if not isinstance(prod, tirx.Mul) or not _is_zero(init):
        raise _NoMatch("the first contraction is not a sum of products")
    spatial, reduce = _iters(c1)
    if len(acc_idx) != len(spatial) or len(spatial) < 2 or not all(
            i.same_as(iv.var) for i, iv in zip(acc_idx, spatial, strict=True)):
        raise _NoMatch("the scores are not written at their own iters")
    dtype = str(acc.dtype)
    if dtype != "float32":
        raise _NoMatch(f"scores in {dtype}")
    ity = spatial[0].var.ty
    rows = tuple(tirx.Var(f"r{i}", ity) for i in range(len(spatial) - 1))
    key, red, col = tirx.Var("j", ity), tirx.Var("k", ity), tirx.Var("d", ity)
    c1_map = {iv.var: v for iv, v in zip(spatial, (*rows, key), strict=True)}
    c1_map[reduce[0].var] = red
    a, b = (substitute(x, c1_map) for x in (prod.a, prod.b))
    query = rows[-1]
    if key not in free_vars(a) and query not in free_vars(b):
        q_term, k_term = a, b
    elif key not in free_vars(b) and query not in free_vars(a):
        q_term, k_term = b, a
    else:
        raise _NoMatch("the first contraction does not multiply a query row by a key row")
    red_extent = _static(reduce[0].dom.extent)
    if red_extent is None:
        raise _NoMatch("symbolic head dim")
    row_extents = tuple(iv.dom.extent for iv in spatial[:-1])
    key_extent = spatial[-1].dom.extent

    # m[r] = max_j score(acc[r, j])
    m_buf, m_idx, score_raw, max_init = _reduction(rmax, tirx.Max)
    mp = _canonical_by_loads(rmax, score_raw, acc, rows, key)
    score_c = substitute(score_raw, mp)
    m_load = tirx.BufferLoad(m_buf, [substitute(i, mp) for i in m_idx])
    if not isinstance(max_init, tirx.FloatImm):
        raise _NoMatch("the row max does not start from a constant")
    acc_var = tirx.Var("acc", dtype)
    score = replace_loads(score_c, acc, lambda idx: acc_var)
    if any(ld.source.same_as(b) for ld in loads(score) for b in (acc, m_buf)):
        raise _NoMatch("the score reads more than its own Q K^T element")

    # l[r] = sum_j exp(score - m[r])
    l_buf, l_idx, summand, sum_init = _reduction(rsum, tirx.Add)
    if not _is_zero(sum_init):
        raise _NoMatch("the row sum does not start from zero")
    sp = _canonical_by_loads(rsum, summand, acc, rows, key)
    weight_c = substitute(summand, sp)
    x = tirx.Var("x", dtype)
    weight = replace_subexpr(weight_c, tirx.Sub(score_c, m_load), x)
    if loads(weight) or free_vars(weight) - {x}:
        raise _NoMatch("the row sum is not a function of (score - max)")
    if not _is_exp(weight, x):
        raise _NoMatch("the row sum's function of (score - max) is not exp")
    l_load = tirx.BufferLoad(l_buf, [substitute(i, sp) for i in l_idx])

    # o[r, d] = sum_j (exp(score - m) / l) * v
    out, out_idx, pv, pv_init = _reduction(c2, tirx.Add)
    if not isinstance(pv, tirx.Mul) or not _is_zero(pv_init) or str(out.dtype) != dtype:
        raise _NoMatch("the second contraction is not a float32 sum of products")
    p_raw, v_raw = (pv.a, pv.b) if any(ld.source.same_as(acc) for ld in loads(pv.a)) \
        else (pv.b, pv.a)
    op = _canonical_by_loads(c2, p_raw, acc, rows, key, extra=col)
    p, v_term = substitute(p_raw, op), substitute(v_raw, op)
    if not (isinstance(p, tirx.Div) and equal(p.a, weight_c) and equal(p.b, l_load)):
        raise _NoMatch("P is not exp(score - max) / sum")
    if query in free_vars(v_term) or any(
            ld.source.same_as(b) for ld in loads(v_term) for b in (acc, m_buf, l_buf)):
        raise _NoMatch("V depends on the query row")
    col_extent = None
    for iv in c2.iter_vars:
        if op.get(iv.var) is col:
            col_extent = _static(iv.dom.extent)
    if col_extent is None:
        raise _NoMatch("symbolic output columns")
    out_indices = tuple(substitute(i, op) for i in out_idx)

    # Nothing else may read the scores, max or sum.
    private = (acc, m_buf, l_buf)
    for blk in epilogue_blocks:
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in blk.iter_vars):
            raise _NoMatch("a reduction after P V")
        if any(r.source.same_as(b) for r in blk.reads for b in private):
            raise _NoMatch("a block after P V reads the softmax")
    if any(p.same_as(b) for p in func.params for b in private):
        raise _NoMatch("the scores, max or sum are function outputs")
    new = sch.mod["main"]
    root_stmt, stmts = root_statements(new)
    if len(stmts) != len(blocks):
        raise _NoMatch("root statements do not match the blocks")
    allocs = tuple(buf for buf in root_stmt.alloc_buffers
                   if not any(buf.same_as(p) for p in private))
    return AttentionForm(
        func=new, rows=rows, row_extents=row_extents, key=key, key_extent=key_extent,
        red=red, red_extent=red_extent, col=col, col_extent=col_extent, q_term=q_term,
        k_term=k_term, score=score, acc=acc_var, weight_arg=x, weight=weight,
        max_init=max_init, v_term=v_term, out=out, out_indices=out_indices,
        epilogue=tuple(stmts[4:]), allocs=allocs,
    )


def _is_zero(value) -> bool:
    return isinstance(value, (tirx.FloatImm, tirx.IntImm)) and float(value.value) == 0.0

