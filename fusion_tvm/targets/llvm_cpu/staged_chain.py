"""StagedChain rule: a chain of weight matmuls (an MLP) as one kernel of stages.

The fused PrimFunc is cut into one stage per matmul block (:func:`~fusion_tvm.
chain_stages.assign_stages` on the blocks: a block belongs to the stage of the latest
matmul it depends on, a prologue block to the first stage reading it). Each stage becomes a
PrimFunc of its own, scheduled by the other rules exactly as if it were its own kernel
(register tiles, packed constant weights, epilogues), and the scheduled stages are stitched
back, in order, into one function: the intermediate between two stages is a buffer of the
kernel, written by one stage and read by the next while it is in cache; the weights
are packed at compile time as for one matmul (``PrepackWeights`` finds the packing loop
nests at the root). One call, one launch, fork/joins back to back.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from ...attrs import CONSTANT_PARAMS_ATTR, RULE_ATTR
from ...chain_stages import assign_stages
from ...hardware import HardwareSpec
from ...tir_analysis import root_statements
from ..base import ScheduleRule, catch_all_names
from ..schedule import schedule_primfunc
from ..tir_writer import block_name, seq
from ._util import constant_param, is_contraction, root_blocks


class StagedChain(ScheduleRule):
    """Chained weight matmuls: each stage scheduled by ``rules``, stitched in order."""

    name = "staged_chain"

    def __init__(self, rules: Sequence[ScheduleRule]):
        self.rules = list(rules)
        self.fallback_names = catch_all_names(self.rules)

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        stages = split_stages(func)
        if stages is None:
            return None
        scheduled = []
        for stage in stages:
            done = schedule_primfunc(stage, self.rules, target, hw)
            # A stage only the fallback takes: decline, so the fallback takes the whole
            # function and the search is told to cut the group (pipeline.run_phases).
            if done is None or str(done.attrs[RULE_ATTR]) in self.fallback_names:
                return None
            scheduled.append(done)
        return s_tir.Schedule(stitch(func, scheduled))


def _plain_load(expr):
    """The buffer ``expr`` loads, through casts (None when it computes anything else)."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr.source if isinstance(expr, TensorLoad) else None


def _weight_matmul(sch: s_tir.Schedule, block, func: tirx.PrimFunc) -> bool:
    """A dense layer's block: ``acc += a[..] * w[..]``, both factors plain loads and one of
    a compile-time constant (a variance's ``(x - m) * (x - m)`` is not one)."""
    if not is_contraction(sch, block):
        return False
    prod = sch.get(block).body.value.b
    sources = [_plain_load(prod.a), _plain_load(prod.b)]
    return None not in sources and any(constant_param(func, b) for b in sources)


def split_stages(func: tirx.PrimFunc) -> list[tirx.PrimFunc] | None:
    """One PrimFunc per stage of ``func`` (None unless it chains two or more matmuls with
    a constant weight, every root statement computing one block)."""
    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if any(sch.get_child_blocks(b) for b in blocks):
        return None
    stmts = [sch.get(b) for b in blocks]
    index = {s.name_hint: k for k, s in enumerate(stmts)}
    if len(index) != len(stmts):
        return None  # block names are how blocks are told apart here
    matmuls = [k for k, b in enumerate(blocks) if _weight_matmul(sch, b, func)]
    if len(matmuls) < 2:
        return None

    def related(fn):
        return {k: [index[sch.get(o).name_hint] for o in fn(b)] for k, b in enumerate(blocks)}
    producers, consumers = related(sch.get_producers), related(sch.get_consumers)
    stage = assign_stages(list(range(len(blocks))), producers.__getitem__,
                          consumers.__getitem__, set(matmuls).__contains__)
    if stage is None:
        return None
    root, nests = root_statements(func)
    if len(nests) != len(blocks) or any(
            block_name(n) != s.name_hint for n, s in zip(nests, stmts, strict=True)):
        return None
    if any(stage[k] < stage[k - 1] for k in range(1, len(blocks))):
        return None  # the stages interleave in the block order: not a chain to cut
    params = list(func.params)
    allocs = list(root.alloc_buffers)
    count = max(stage.values()) + 1
    touched = [set() for _ in range(count)]
    for k, s in enumerate(stmts):
        for region in (*s.reads, *s.writes):
            touched[stage[k]].add(region.source)
    out = []
    for j in range(count):
        # Buffers of other stages this one reads or writes become its parameters.
        crossing = [a for a in allocs if a in touched[j]
                    and any(a in touched[i] for i in range(count) if i != j)]
        own = [a for a in allocs if a in touched[j] and a not in crossing]
        stage_params = [p for p in params if p in touched[j]] + crossing
        body = [n for k, n in enumerate(nests) if stage[k] == j]
        new_root = s_tir.SBlock([], [], [], "root", seq(*body), alloc_buffers=own)
        f = tirx.PrimFunc(stage_params, s_tir.SBlockRealize([], True, new_root))
        f = f.with_attr("tirx.noalias", True).with_attr("global_symbol", f"stage{j}")
        marks = [i for i, p in enumerate(stage_params) if constant_param(func, p)]
        if marks:
            f = f.with_attr(CONSTANT_PARAMS_ATTR, marks)
        out.append(f)
    return out


def stitch(func: tirx.PrimFunc, stages: list[tirx.PrimFunc]) -> tirx.PrimFunc:
    """``func`` with its body replaced by the scheduled ``stages`` one after the other;
    the buffers passed between stages and every stage's own buffers allocated at the root."""
    params = set(func.params)
    allocs, body = [], []
    for stage in stages:
        root, nests = root_statements(stage)
        allocs.extend(root.alloc_buffers)
        allocs.extend(p for p in stage.params if p not in params and p not in allocs)
        body.extend(nests)
    root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt(body), alloc_buffers=allocs)
    return func.with_body(s_tir.SBlockRealize([], True, root))
