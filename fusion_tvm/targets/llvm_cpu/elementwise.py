"""Elementwise / injective rule: every block is spatial (broadcast, transpose, concat...)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...hardware import HardwareSpec
from ..base import ScheduleRule
from ._util import (
    inline_spatial,
    is_spatial,
    parallel_vectorize,
    root_blocks,
    tile_transpose,
)


class Elementwise(ScheduleRule):
    """Inline the whole injective chain, then one parallel + vectorized loop nest per output.

    Inlining keeps every intermediate in registers: a fused chain of N elementwise ops
    reads its inputs and writes its outputs once.
    """

    name = "elementwise"

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not blocks or not all(is_spatial(sch, b) for b in blocks):
            return None
        if any(sch.get_child_blocks(b) for b in blocks):  # nested blocks: not a plain nest
            return None
        for block in inline_spatial(sch):
            if not tile_transpose(sch, block, hw):
                parallel_vectorize(sch, block, hw)
        return sch
