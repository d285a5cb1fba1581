"""RowReduction: fused reduction chains dlight declines, one thread block per row.

dlight's ``GeneralReduction`` wants the reductions over the innermost axes and every
block on the same row domain; our groups also hold a residual ``add`` before a
``layer_norm``, an ``add + relu`` before a global ``mean``, and similar prologues, which
it rejects. This rule inlines what it can (dlight's ``try_inline``), then, block by block:

* a block with reduction iters runs one thread block per output element (its fused
  spatial loops on ``blockIdx.x``) and splits its fused reduction loops over
  ``threadIdx.x``: TVM lowers that to a cross-thread (warp shuffle + shared memory)
  all-reduce;
* a spatial block (normalisation, epilogue) is fused and split over blocks x threads;
* every earlier block is moved under the row loop of the block after it (``compute_at``)
  when its iters cover the same rows, so the chain runs whole-row in one launch with one
  thread count; when not, it stays its own launch in the same PrimFunc. TVM refuses to
  move a block that writes a function output, so a residual sum the group publishes
  (``add`` before ``layer_norm``) is one extra launch before the row kernel.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.schedule import ScheduleError

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from .verify import lowers


def _threads_for(extent: int | None, cap: int) -> int:
    """Threads for a reduction of ``extent`` elements: a power of two in [32, cap]."""
    if extent is None:
        return cap
    t = 32
    while t < cap and t < extent:
        t *= 2
    return t


def _static(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


class RowReduction(ScheduleRule):
    """Reduction chains with prologues: rows on blocks, reductions across threads."""

    name = "row_reduction"

    def __init__(self, max_threads: int = 256):
        self.max_threads = max_threads

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None or not any(info.is_reduction() for info in infos):
            return None
        infos = try_inline(sch, infos)
        cap = min(self.max_threads, hw.gpu.max_threads_per_block if hw.gpu else 1024)
        if any(len(sch.get_loops(i.block_rv)) != len(i.dom_kind()) for i in infos):
            return None
        if any(set(i.dom_kind()) - {"S", "R"} for i in infos):
            return None
        # Bind the last block first; earlier blocks try to join its row loop.
        n_rows = _row_iters(infos)
        row_loop, row_threads = None, cap
        for idx in range(len(infos) - 1, -1, -1):
            block = infos[idx].block_rv
            kinds = infos[idx].dom_kind()
            loops = sch.get_loops(block)
            s_loops = [lp for lp, k in zip(loops, kinds, strict=True) if k == "S"]
            r_loops = [lp for lp, k in zip(loops, kinds, strict=True) if k == "R"]
            if r_loops:
                sch.reorder(*s_loops, *r_loops)
            if row_loop is not None:
                try:
                    sch.compute_at(block, row_loop, preserve_unit_loops=True)
                except ScheduleError:  # an output block, or rows that do not match
                    pass
                else:
                    # Reductions spread their reduction loops on the row's threads; a
                    # spatial producer (a published residual sum) its part of the row.
                    below = sch.get_loops(block)[1:]
                    inner = below[-len(r_loops):] if r_loops else below
                    if inner:
                        r = sch.fuse(*inner) if len(inner) > 1 else inner[0]
                        _, tx = sch.split(r, factors=[None, row_threads])
                        sch.bind(tx, "threadIdx.x")
                    continue
            if r_loops:
                bx = _fuse(sch, block, s_loops)
                r = sch.fuse(*r_loops) if len(r_loops) > 1 else r_loops[0]
                row_threads = _threads_for(_static(sch, r), cap)
                _, tx = sch.split(r, factors=[None, row_threads])
            elif n_rows and idx == len(infos) - 1 and len(loops) > n_rows:
                # Last spatial block of a chain over rows: one row per thread block too.
                bx = _fuse(sch, block, list(loops[:n_rows]))
                inner = sch.fuse(*loops[n_rows:]) if len(loops) > n_rows + 1 else loops[-1]
                row_threads = _threads_for(_static(sch, inner), cap)
                _, tx = sch.split(inner, factors=[None, row_threads])
            else:
                bx, tx = sch.split(_fuse(sch, block, list(loops)), factors=[None, cap])
                sch.bind(bx, "blockIdx.x")
                sch.bind(tx, "threadIdx.x")
                row_loop = None
                continue
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            row_loop = bx
        # Decline rather than hand the build a kernel TVM cannot lower.
        return sch if lowers(sch, target) is None else None


def _fuse(sch: s_tir.Schedule, block, loops: list):
    if not loops:
        return sch.add_unit_loop(block)
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def _row_iters(infos) -> int:
    """Leading spatial iters of the last reduction block (its rows), 0 if none."""
    for info in reversed(infos):
        kinds = info.dom_kind()
        if "R" in kinds:
            return len(kinds) - len(kinds.lstrip("S")) if kinds.startswith("S") else 0
    return 0

