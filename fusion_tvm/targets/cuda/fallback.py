"""BindThreads: the last CUDA rule; every block's spatial loops bound to blocks/threads."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...hardware import HardwareSpec
from ..base import ScheduleRule


class BindThreads(ScheduleRule):
    """Matches any PrimFunc: no inlining, each root block its own launch.

    A kernel without thread bindings fails ``VerifyMemory`` on CUDA, so the last rule
    must bind every block, however plain: fuse the block's loops that only feed spatial
    iters, split by the thread limit, bind ``blockIdx.x`` / ``threadIdx.x``; a block with
    no spatial loop gets a unit loop bound to one thread.
    """

    name = "bind_threads"
    catch_all = True

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        threads = min(256, hw.gpu.max_threads_per_block if hw.gpu else 256)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
            n_spatial = 0
            for kind in kinds:
                if kind != tirx.IterVar.DataPar:
                    break
                n_spatial += 1
            lead = list(loops[:n_spatial]) if len(loops) == len(kinds) else []
            if not lead:
                lead = [sch.add_unit_loop(block)]
            fused = sch.fuse(*lead) if len(lead) > 1 else lead[0]
            bx, tx = sch.split(fused, factors=[None, threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
        return sch
