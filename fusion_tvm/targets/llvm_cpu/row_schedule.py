"""Row-wise schedule helpers shared by the reduction, attention and flash-attention rules.

The row space a chain of blocks shares, whether every block stays within its own row,
row reductions split into vector partial sums, and the vectorisation of a row's innermost
loop (a static tail partitioned off, a symbolic one left to LoopPartition).
"""

from __future__ import annotations

import contextlib

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from ._util import iter_kinds, static_extent, vector_friendly


def _leading_spatial(sch: s_tir.Schedule, block: SBlockRV) -> int:
    kinds = iter_kinds(sch, block)
    return len(kinds) - len(kinds.lstrip("S"))


def shared_rows(sch: s_tir.Schedule, blocks: list[SBlockRV]) -> int:
    """Leading spatial iterators every block shares, with equal extents: the row space.

    A block's third spatial axis may be a column (768) in one block and a kept unit
    dimension (1) in a reduction: only the common prefix is a row.
    """
    rows = min(_leading_spatial(sch, b) for b in blocks)
    doms = [[iv.dom.extent for iv in sch.get(b).iter_vars] for b in blocks]
    for r in range(rows):
        first = doms[0][r]
        if not all(tvm_ffi.structural_equal(d[r], first) for d in doms[1:]):
            return r
    return rows


def row_local(sch: s_tir.Schedule, blocks: list[SBlockRV], rows: int) -> bool:
    """Whether every block reads and writes the group's intermediates at its own row.

    Computing the chain row by row is only right when row ``r`` of each block needs row
    ``r`` of its producers and nothing else: the first ``rows`` indices of every access to
    a buffer written inside the group must be the accessing block's own row iterators.
    (A convolution reads neighbouring rows; a reduction over the row axis reads them all.)
    """
    written = [w.source for b in blocks for w in sch.get(b).writes]

    def inside(buf) -> bool:
        return any(buf.same_as(w) for w in written)

    for block in blocks:
        stmt = sch.get(block)
        row_vars = [iv.var for iv in stmt.iter_vars][:rows]
        for access in (*stmt.reads, *stmt.writes):
            if not inside(access.source):
                continue
            if len(access.region) < rows:
                return False
            for rng, var in zip(access.region[:rows], row_vars, strict=True):
                if not (rng.min.same_as(var) and isinstance(rng.extent, tirx.IntImm)
                        and rng.extent.value == 1):
                    return False
    return True


def vectorize_innermost(sch: s_tir.Schedule, block: SBlockRV, width: int, first: int) -> None:
    """Vectorise the innermost loop below position ``first`` (the row loop)."""
    loops = sch.get_loops(block)[first:]
    if not loops or not vector_friendly(sch, block):
        return
    inner = loops[-1]
    extent = static_extent(sch, inner)
    if extent is not None and extent > width and extent % width:
        # A static row that is not a multiple of the vector: the whole vectors and the tail
        # as two loops (a guarded vector loop is scalarised: softmax over 197 columns).
        with contextlib.suppress(ScheduleError):
            for part in sch.loop_partition(inner, [extent - extent % width, None]):
                for blk in sch.get_child_blocks(part):
                    vectorize_innermost(sch, blk, width, 0)
            return
    with contextlib.suppress(ScheduleError):
        if extent is not None and extent <= width:
            if extent >= 4:
                sch.vectorize(inner)
            return
        _, vec = sch.split(inner, [None, width])
        sch.vectorize(vec)


def rfactor_rows(sch: s_tir.Schedule, block: SBlockRV, width: int) -> SBlockRV | None:
    """Split a row reduction into ``width`` vector partial sums; the rf block or None.

    Several reduction loops after the spatial ones (a mean over H and W of NCHW: the
    squeeze of a squeeze-excitation block, 784 pixels) are fused into one first: left
    apart, the row ran as one scalar add chain (MixNet's 240 x 28 x 28: 142 us)."""
    loops = sch.get_loops(block)
    kinds = iter_kinds(sch, block)
    if len(loops) != len(kinds) or "R" not in kinds:
        return None
    first = kinds.index("R")
    if kinds[first:] != "R" * (len(kinds) - first):
        return None
    if len(kinds) - first > 1:
        try:
            sch.fuse(*loops[first:])
        except ScheduleError:
            return None
        loops = sch.get_loops(block)
        kinds = kinds[:first + 1]
    extent = static_extent(sch, loops[-1])
    if extent is None or extent % width or extent < 2 * width:
        return None
    _, inner = sch.split(loops[-1], [None, width])
    try:
        return sch.rfactor(inner, factor_axis=len(kinds) - 1)
    except ScheduleError:
        return None


def vectorize_partials(sch: s_tir.Schedule, block: SBlockRV, width: int) -> None:
    """Order the rf block as (row, k_outer, k_lane) and vectorise the lane loop."""
    stmt = sch.get(block)
    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    loops = sch.get_loops(block)[1:]
    reduce_loop = lane_loop = None
    for iv, value in zip(stmt.iter_vars, realize.iter_values, strict=True):
        used = set(tirx.analysis.undefined_vars(value))
        for loop in loops:
            if sch.get(loop).loop_var in used:
                if iv.iter_type == tirx.IterVar.CommReduce:
                    reduce_loop = loop
                elif static_extent(sch, loop) == width:
                    lane_loop = loop
    if reduce_loop is None or lane_loop is None:
        return
    with contextlib.suppress(ScheduleError):
        sch.reorder(reduce_loop, lane_loop)
        # Vectorise while the block still has its init: after decompose_reduction the
        # update alone no longer counts as a reduction block and vectorize refuses it.
        sch.vectorize(lane_loop)
        init = sch.decompose_reduction(block, reduce_loop)
        sch.vectorize(sch.get_loops(init)[-1])


#: Loop annotation read by TVM's LoopPartition pass: the loop is split into a guard-free
#: body and a tail. A vector loop over a symbolic extent otherwise keeps its bound check
#: inside, and VectorizeLoop scalarises it (measured 22x slower than the static kernel at
#: S = 128, znver4).
PARTITION_HINT = "pragma_loop_partition_hint"


def hint_partition(sch: s_tir.Schedule, loop) -> None:
    """Ask LoopPartition to peel ``loop``'s guarded tail when its extent is symbolic."""
    if static_extent(sch, loop) is None:
        sch.annotate(loop, PARTITION_HINT, 1)


def _peel(sch: s_tir.Schedule, loop, extent: int, width: int) -> list:
    """Split a static ``extent`` loop into a multiple-of-``width`` part and its tail, each
    with its own block copy: a split with a guarded tail would be scalarised, and
    LoopPartition leaves constant loops alone."""
    return list(sch.loop_partition(loop, [extent - extent % width, None]))


def vectorize_row(sch: s_tir.Schedule, block: SBlockRV, width: int) -> None:
    """Vectorise the innermost (column) loop of an in-row spatial block, a symbolic
    extent split by ``width`` with its tail peeled off (see :data:`PARTITION_HINT`)."""
    extent = static_extent(sch, sch.get_loops(block)[-1])
    if extent is not None and extent > width and extent % width:
        for part in _peel(sch, sch.get_loops(block)[-1], extent, width):
            for blk in sch.get_child_blocks(part):  # below an opaque block: no row loop
                vectorize_innermost(sch, blk, width, 0)
        return
    if extent is not None:
        vectorize_innermost(sch, block, width, 1)
        return
    with contextlib.suppress(ScheduleError):
        outer, vec = sch.split(sch.get_loops(block)[-1], [None, width])
        sch.vectorize(vec)
        hint_partition(sch, outer)
