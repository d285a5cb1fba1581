"""Attention rule: ``matmul -> elementwise -> row reductions -> matmul`` as one kernel.

Recognised by structure, not by op names: the fused PrimFunc holds one or two
*contractions* (reduction blocks multiplying two buffers) and at least one *row reduction*
(a reduction block over one buffer: softmax max / sum), every intermediate read at the
reading block's own row (batch, head, query). Scheduled row-wise: one parallel loop over
query rows; inside it the scores row (``1 x S``) is computed, reduced and normalised in
cache, then multiplied by V. Scores never go to DRAM. Operands read by every row (K^T and
V after their transposes) are materialised once, before the row loop, in the layout the
row loop reads contiguously.

A symbolic sequence length keeps blocks of 4 query rows: the row loop runs serially
under a parallel (batch, head) loop and TVM's LoopPartition peels its partial last block;
key loops are split by the SIMD width with their tail peeled the same way (a guarded
vector loop is otherwise scalarised). Static lengths that are not a multiple of the vector
width get the same split from ``loop_partition``. Row reductions become vector partials
only for rows a multiple of the width; symbolic ones stay scalar.

The schedule is row-wise, not flash-style: TIR schedule primitives cannot rewrite softmax
into its online (running max / rescaled accumulator) form, so a row holds all ``S``
scores (4 S bytes; L1-resident up to S ~ 8k).
"""

from __future__ import annotations

import contextlib

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from ._util import (
    constant_param,
    dtype_bits,
    inline_spatial,
    is_contraction,
    is_reduction,
    is_spatial,
    iter_kinds,
    lanes,
    parallel_vectorize,
    root_blocks,
    static_extent,
    static_flops,
)
from .parallel import parallel_pays, serial_seconds
from .row_schedule import (
    hint_partition,
    rfactor_rows,
    row_local,
    shared_rows,
    vectorize_partials,
    vectorize_row,
)


def _named(sch: s_tir.Schedule, name: str) -> list[SBlockRV]:
    """The block called ``name`` (empty if none)."""
    try:
        return [sch.get_sblock(name)]
    except (ScheduleError, ValueError):
        return []


def _is_row_reduction(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """A reduction block reading one buffer (max / sum over a row)."""
    stmt = sch.get(block)
    return is_reduction(sch, block) and len({r.source for r in stmt.reads}) == 1


def _reads_whole_rows_of(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> bool:
    """Whether every consumer of ``block`` reads it other than at its own row index (the K
    or V operand of a contraction: every query row needs all of it)."""
    out = sch.get(block).writes[0].source
    for consumer in sch.get_consumers(block):
        stmt = sch.get(consumer)
        row_vars = [iv.var for iv in stmt.iter_vars][:rows]
        for access in stmt.reads:
            if not access.source.same_as(out):
                continue
            starts = access.region[:rows]
            if all(rng.min.same_as(v) for rng, v in zip(starts, row_vars, strict=False)):
                return False
    return True


#: Vectors of output columns per register tile of a row contraction.
REG_TILE = 4
#: Query rows computed together (static sequence lengths divisible by it).
ROW_TILE = 4


def _multiple_of(extent, factor: int) -> bool:
    """Whether a (possibly symbolic) loop extent is provably a multiple of ``factor``."""
    return bool(tvm.sym.Analyzer().can_prove(tirx.floormod(extent, factor) == 0))


def _shape_contraction(
    sch: s_tir.Schedule, block: SBlockRV, width: int, rows: int, first: int = 1,
    peel: bool = True,
) -> None:
    """Inside a block of query rows: loops (column block, reduction, row, column tile,
    vector), the row and column-tile loops unrolled.

    ``out[i, j] += a[i, k] * b[k, j]`` with ``j`` innermost reads ``b`` contiguously (K^T,
    V rows); the ``rows x REG_TILE`` vector accumulators stay in registers over the whole
    reduction, and each loaded vector of ``b`` serves every row of the block.
    """
    loops = sch.get_loops(block)
    stmt = sch.get(block)
    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    reduce_loop = col_loop = row_loop = None
    for k, (iv, value) in enumerate(zip(stmt.iter_vars, realize.iter_values, strict=True)):
        used = set(tirx.analysis.undefined_vars(value))
        for loop in loops[first:]:
            if sch.get(loop).loop_var in used:
                if iv.iter_type == tirx.IterVar.CommReduce:
                    reduce_loop = loop
                elif k == rows:
                    col_loop = loop
                elif k == rows - 1 and (static_extent(sch, loop) or 1) > 1:
                    row_loop = loop
    if reduce_loop is None or col_loop is None:
        return
    extent = static_extent(sch, col_loop)
    tile = REG_TILE if row_loop is None else max(1, REG_TILE // 2)
    span = sch.get(col_loop).extent
    tiles = _multiple_of(span, tile * width) and (extent is None or extent >= tile * width)
    if peel and not tiles and extent is not None and extent > tile * width:
        # Register tiles over the columns a whole tile covers, vectors over the rest:
        # partitioned with the column loop outermost, so the rows stay inside each part.
        # (loop_partition refuses symbolic extents.)
        with contextlib.suppress(ScheduleError):
            if row_loop is not None:
                sch.reorder(col_loop, row_loop)
            main = tirx.floordiv(span, tile * width) * (tile * width)
            for part in sch.loop_partition(col_loop, [main, None]):
                for blk in sch.get_child_blocks(part):  # below an opaque block
                    _shape_contraction(sch, blk, width, rows, first=0, peel=False)
        return
    with contextlib.suppress(ScheduleError):
        lead = [] if row_loop is None else [row_loop]
        if tiles:
            outer, tiled, vec = sch.split(col_loop, [None, tile, width])
            sch.reorder(outer, reduce_loop, *lead, tiled, vec)
            sch.unroll(tiled)
        elif extent is None:
            # Symbolic keys: vectors, their tail peeled off by LoopPartition. A register tile
            # of several vectors would leave up to tile * width - 1 columns to the scalar
            # tail (all of them at S = 16), and loop_partition refuses symbolic extents.
            outer, vec = sch.split(col_loop, [None, width])
            sch.reorder(outer, reduce_loop, *lead, vec)
            hint_partition(sch, outer)
        else:
            vec = col_loop
            if extent > width:
                _, vec = sch.split(col_loop, [None, width])
            sch.reorder(reduce_loop, *lead, vec)
        if row_loop is not None:
            sch.unroll(row_loop)
        sch.vectorize(vec)
        init = sch.decompose_reduction(block, reduce_loop)
        with contextlib.suppress(ScheduleError):
            sch.vectorize(sch.get_loops(init)[-1])


def attention_parallel_pays(hw: HardwareSpec, func: tirx.PrimFunc, rows: int | None) -> bool:
    """Whether the query-row loop runs in parallel: the kernel's serial time (its FLOPs at
    the matmul rule's calibrated rate) against the thread pool's fork/join
    (:func:`parallel.parallel_pays`); symbolic extents are assumed large."""
    flops = static_flops(func)
    if rows is None or flops is None:
        return parallel_pays(hw, None, None)
    return parallel_pays(hw, serial_seconds(hw, flops, 0.0, "matmul", "small"),
                         -(-rows // ROW_TILE))


class Attention(ScheduleRule):
    """Row-wise ``softmax(Q K^T + mask) V``: one parallel loop over query rows."""

    name = "attention"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if any(sch.get_child_blocks(b) for b in blocks):
            return None
        if not all(is_spatial(sch, b) or is_reduction(sch, b) for b in blocks):
            return None
        contractions = [b for b in blocks if is_contraction(sch, b)]
        row_reductions = [b for b in blocks if _is_row_reduction(sch, b)]
        if not contractions or len(contractions) > 2 or not row_reductions:
            return None
        if any(constant_param(func, r.source) for c in contractions for r in sch.get(c).reads):
            return None  # a weight matmul after a norm: the matmul rule stages the norm
        loops = sch.get_loops(contractions[0])
        if len(contractions) == 1 and len(loops) >= 3 and (static_extent(sch, loops[-3]) or 0) \
                % ROW_TILE:
            return None  # Q K^T + softmax with ragged rows: the matmul rule's row pass
        if len(contractions) + len(row_reductions) != sum(
            1 for b in blocks if is_reduction(sch, b)
        ):
            return None
        blocks = inline_spatial(sch)
        reductions = [b for b in blocks if not is_spatial(sch, b)]
        rows = shared_rows(sch, reductions)
        if rows == 0:
            return None
        # Operands every row reads whole (K^T, V): computed once, before the row loop;
        # blocks after the last reduction (an output transpose) are the row's epilogue.
        last = max(k for k, b in enumerate(blocks) if not is_spatial(sch, b))
        epilogue = blocks[last + 1:]
        shared = [
            b for b in blocks[:last] if is_spatial(sch, b) and _reads_whole_rows_of(sch, b, rows)
        ]
        shared_stmts = [sch.get(b) for b in shared]
        in_row = [b for b in blocks[:last + 1]
                  if not any(sch.get(b).same_as(s) for s in shared_stmts)]
        if any(
            not any(sch.get(p).same_as(s) for s in shared_stmts)
            for b in shared for p in sch.get_producers(b)
        ):
            return None  # a shared operand computed from row values: not this workload
        rows = shared_rows(sch, in_row)
        if rows == 0 or not row_local(sch, in_row, rows):
            return None
        width = lanes(hw, dtype_bits(sch, in_row[-1]))
        # Row reductions as vector partials: an IEEE max / sum chain is not vectorised by
        # LLVM and runs at one element per add latency. Only for rows a multiple of the
        # vector width: rfactor needs the block at the root, so the split comes before
        # compute_at, and a guarded split there widened the producers' regions past the
        # row (NaN results at S = 77). Symbolic rows keep scalar reductions.
        partials = []
        for block in in_row:
            if _is_row_reduction(sch, block):
                rf = rfactor_rows(sch, block, width)
                if rf is not None:  # by name: a stmt changes when a producer is inlined
                    partials.append(sch.get(rf).name_hint)
        if partials:
            others = [*shared_stmts, *(sch.get(b) for b in epilogue)]
            in_row = [b for b in root_blocks(sch)
                      if not any(sch.get(b).same_as(o) for o in others)]
        outputs = [sch.get(b) for b in sch.get_output_blocks(sch.get_sblock("root"))]
        anchor = in_row[-1]
        if any(sch.get(b).same_as(o) for b in in_row[:-1] for o in outputs):
            return None  # several outputs: the row chain could not be anchored at one block
        if any(not is_spatial(sch, b) for b in epilogue):
            return None

        loops = sch.get_loops(anchor)
        extents = [static_extent(sch, lp) for lp in loops[:rows]]
        work = None if None in extents else 1
        for ext in extents if work is not None else ():
            work *= ext
        outer = list(loops[:rows])
        if extents[-1] is None or extents[-1] % ROW_TILE == 0:
            # Blocks of ROW_TILE query rows: every K^T / V vector loaded serves all of them.
            # A symbolic query count ends in a partial block, peeled off below. A static
            # count that is not a multiple keeps one row at a time: LoopPartition leaves
            # constant loops alone, and the row guards left in every vector update made
            # the kernel 1.4x slower than one row at a time (197 rows, 3 heads, znver4).
            outer[-1], _ = sch.split(outer[-1], [None, ROW_TILE])
        heads = 1
        for ext in extents[:-1]:
            heads = heads * ext if ext is not None and heads is not None else None
        parallel = attention_parallel_pays(hw, func, work)
        if extents[-1] is None and len(outer) > 1 and heads is not None \
                and heads >= hw.num_cores:
            # Symbolic query rows: parallel over (batch, head), the row blocks a serial loop
            # whose partial last block LoopPartition peels off, so the full blocks run
            # without a row guard around every vector update.
            bh = sch.fuse(*outer[:-1]) if len(outer) > 2 else outer[0]
            if parallel:
                sch.parallel(bh)
            row = outer[-1]
            hint_partition(sch, row)
        else:
            row = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            if parallel:
                sch.parallel(row)
        for block in reversed(in_row[:-1]):
            sch.compute_at(block, row, preserve_unit_loops=True)
        for block in epilogue:
            sch.reverse_compute_at(block, row, preserve_unit_loops=True)
        for block in shared:
            parallel_vectorize(sch, block, hw)
            inner = sch.get_loops(block)
            if len(inner) > 1 and static_extent(sch, inner[-1]) is not None:
                hint_partition(sch, inner[-2])
        for block in epilogue:
            vectorize_row(sch, block, width)
        for block in in_row:
            kinds = iter_kinds(sch, block)
            name = sch.get(block).name_hint
            if name in partials:
                vectorize_partials(sch, block, width)
                for blk in (block, *_named(sch, name + "_init")):
                    with contextlib.suppress(ScheduleError):
                        hint_partition(sch, sch.get_loops(blk)[-2])
            elif is_contraction(sch, block) and kinds[rows:] in ("SR", "R"):
                _shape_contraction(sch, block, width, rows)
            elif is_spatial(sch, block):
                vectorize_row(sch, block, width)
        return sch
