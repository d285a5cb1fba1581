"""Writing TIR loop by loop, for the kernels a rule generates rather than schedules.

The online-softmax attention kernels (LLVM-CPU and CUDA ``flash_attention``) cannot be
reached with schedule primitives from the fused function; they are written as loops,
stores and one block per parallel tile, then handed to ``s_tir.Schedule`` like any other
function. :class:`TirWriter` holds what such a writer needs whatever the target.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx


def seq(*stmts):
    """One statement of ``stmts`` (Nones dropped, nested sequences flattened)."""
    flat = []
    for s in stmts:
        if s is not None:
            flat.extend(s.seq if isinstance(s, tirx.SeqStmt) else [s])
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def block_name(stmt) -> str | None:
    """Name of the block a root loop nest computes (None when it computes no one block)."""
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt.block.name_hint if isinstance(stmt, s_tir.SBlockRealize) else None


def static_int(extent) -> int | None:
    """``extent`` as an int when it is a constant (a Python int or an ``IntImm``)."""
    if isinstance(extent, int):
        return extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


class TirWriter:
    """Constants, fresh loop vars, loops and block nests of one index and element type."""

    def __init__(self, index_type, dtype: str):
        self.ity = index_type
        self.dtype = dtype
        self._names: dict[str, int] = {}

    def c(self, value: int):
        """An index constant."""
        return tirx.IntImm(self.ity, value)

    def f(self, value: float):
        """An element constant."""
        return tirx.FloatImm(self.dtype, value)

    def var(self, name: str) -> tirx.Var:
        """A fresh index var (``name``, ``name1``, ...)."""
        self._names[name] = self._names.get(name, -1) + 1
        return tirx.Var(f"{name}{self._names[name] or ''}", self.ity)

    def loop(self, name: str, extent, body_fn, kind=tirx.ForKind.SERIAL):
        """``for v in range(extent): body_fn(v)`` of loop kind ``kind``."""
        v = self.var(name)
        extent = self.c(extent) if isinstance(extent, int) else extent
        return tirx.For(v, self.c(0), extent, kind, body_fn(v))

    @staticmethod
    def ld(buf, idx):
        return tirx.BufferLoad(buf, idx)

    @staticmethod
    def st(buf, value, idx):
        return tirx.BufferStore(buf, value, idx)

    def iter_vars(self, extents, names) -> list:
        """Spatial block iter vars over ``extents`` (vars named ``names``)."""
        return [tirx.IterVar(tvm.ir.Range.from_min_extent(self.c(0), e), v,
                             tirx.IterVar.DataPar) for e, v in zip(extents, names, strict=True)]

    def nest(self, block, extents, buffers: dict):
        """``block`` (read / write regions inferred from its body over ``buffers``, the
        buffers outside it) under one serial loop per iter var."""
        reads, writes = s_tir.analysis.get_sblock_read_write_region(block, buffers)
        block = s_tir.SBlock(block.iter_vars, reads, writes, block.name_hint, block.body,
                             alloc_buffers=block.alloc_buffers)
        lvars = [self.var("i") for _ in extents]
        stmt = s_tir.SBlockRealize(lvars, True, block)
        for v, e in reversed(list(zip(lvars, extents, strict=True))):
            stmt = tirx.For(v, self.c(0), e, tirx.ForKind.SERIAL, stmt)
        return stmt


class AttentionWriter(TirWriter):
    """A writer of one :class:`~fusion_tvm.online_softmax.AttentionForm`'s kernel, with the
    form's vars and extents by role: ``batch`` / ``query`` rows (``batch_ext`` / ``sq``),
    keys ``sk``, ``Q K^T`` reduction ``dk`` and output columns ``dv``."""

    def __init__(self, form):
        super().__init__(form.rows[0].ty, form.dtype)
        self.form = form
        self.batch, self.query = form.rows[:-1], form.rows[-1]
        self.batch_ext, self.sq = form.row_extents[:-1], form.row_extents[-1]
        self.sk, self.dk, self.dv = form.key_extent, form.red_extent, form.col_extent
