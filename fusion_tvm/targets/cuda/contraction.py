"""SimtContraction: a matmul / conv with fused prologue and epilogue dlight declines.

dlight's ``Matmul`` wants the contraction's operands to be (after inlining) plain
buffer reads it can stage through shared memory; a residual ``add + relu`` fused as the
*prologue* of a padded convolution, for instance, defeats its index analysis and it
returns None. Rather than fall back to one thread per output with the accumulator in
global memory, this rule:

* inlines the prologue into the contraction's reads and the epilogue into its write
  (dlight's ``try_inline``): the fused ops never touch global memory;
* gives each thread ``vec`` adjacent outputs of the innermost spatial axis when it
  divides evenly (register tiling: one operand load feeds ``vec`` FMAs);
* keeps the accumulators in registers (``cache_write`` to ``local``) and writes them
  once, through the epilogue.

It reaches far below a shared-memory tiled GEMM, but it always verifies and it keeps
the fusion the cost model chose.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from .verify import lowers


def _is_contraction(sch: s_tir.Schedule, block) -> bool:
    """A reduction block whose update multiplies two distinct inputs (C += A * B)."""
    stmt = sch.get(block)
    written = {r.source.name for r in stmt.writes}
    return len({r.source.name for r in stmt.reads} - written) >= 2


class SimtContraction(ScheduleRule):
    """One contraction plus inlined prologue / epilogue, one thread per ``vec`` outputs."""

    name = "contraction"

    def __init__(self, threads: int = 128, vec: int = 4):
        self.threads = threads
        self.vec = vec

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reds = [i for i in infos if i.is_reduction()]
        if len(reds) != 1 or not _is_contraction(sch, reds[0].block_rv):
            return None
        infos = try_inline(sch, infos)
        for info in infos:
            block = info.block_rv
            kinds = info.dom_kind()
            loops = sch.get_loops(block)
            if len(loops) != len(kinds) or set(kinds) - {"S", "R"}:
                return None
            s_loops = [lp for lp, k in zip(loops, kinds, strict=True) if k == "S"]
            r_loops = [lp for lp, k in zip(loops, kinds, strict=True) if k == "R"]
            if not r_loops:
                fused = sch.fuse(*loops) if len(loops) > 1 else (
                    loops[0] if loops else sch.add_unit_loop(block))
                bx, tx = sch.split(fused, factors=[None, self.threads])
                sch.bind(bx, "blockIdx.x")
                sch.bind(tx, "threadIdx.x")
                continue
            local = sch.cache_write(block, 0, "local")
            sch.reorder(*s_loops, *r_loops)
            vec = 1
            if s_loops:
                ext = sch.get(s_loops[-1]).extent
                if isinstance(ext, tirx.IntImm) and int(ext.value) % self.vec == 0 \
                        and int(ext.value) > self.vec:
                    vec = self.vec
            if vec > 1:
                outer, inner = sch.split(s_loops[-1], factors=[None, vec])
                s_loops = [*s_loops[:-1], outer]
                sch.reorder(*s_loops, *r_loops, inner)
            fused = sch.fuse(*s_loops) if len(s_loops) > 1 else (
                s_loops[0] if s_loops else sch.add_unit_loop(block))
            bx, tx = sch.split(fused, factors=[None, self.threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.reverse_compute_at(local, tx)
            sch.decompose_reduction(block, r_loops[0])
            if vec > 1:
                sch.unroll(sch.get_loops(block)[-1])
        # Decline rather than hand the build a kernel TVM cannot lower.
        return sch if lowers(sch, target) is None else None
