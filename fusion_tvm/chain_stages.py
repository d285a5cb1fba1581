"""Stages of a chained-contraction group: several weight matmuls as one kernel.

A group holding a chain of matmuls with constant weights (an MLP: ``x W1 + b -> GELU ->
W2 + b``) runs as one kernel of *stages*, one per matmul: each stage is the matmul with
its prologue and epilogue as the single-contraction templates schedule it, and the stages
run one after the other in the same kernel, the intermediate between them written while it
is hot in cache and read straight back. Every member belongs to the stage of the latest
matmul it depends on (its epilogue); members depending on none belong to the first stage
that reads them (its prologue). Each stage holds exactly one matmul, and data only flows
from a stage to later ones.

The same assignment is made on the fusion graph (legality, cost model) and on the fused
PrimFunc's blocks (the LLVM-CPU ``staged_chain`` rule), so what the model prices is what
the rule builds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from .graph import FusionGraph
from .hardware import OpClass


def assign_stages(order: Sequence[Hashable], preds: Callable, succs: Callable,
                  is_contraction: Callable) -> dict | None:
    """Stage index of every item of ``order`` (a topological order), or None when fewer
    than two items are contractions.

    ``preds(x)`` / ``succs(x)`` give the items of ``order`` that ``x`` reads / that read
    ``x``; ``is_contraction(x)`` marks the matmuls.
    """
    contractions = [x for x in order if is_contraction(x)]
    if len(contractions) < 2:
        return None
    index = {x: k for k, x in enumerate(contractions)}
    after: dict = {}
    for x in order:  # the latest contraction each item depends on (-1: none)
        after[x] = max([index.get(x, -1), *(after[p] for p in preds(x))])
    stage: dict = {}
    for x in reversed(order):  # prologue items: the first stage reading them
        if after[x] >= 0:
            stage[x] = after[x]
        else:
            readers = [stage[s] for s in succs(x)]
            stage[x] = min(readers) if readers else 0
    return stage


def _weight_matmul(graph: FusionGraph, node) -> bool:
    """A matmul whose second operand is a compile-time constant (a dense layer)."""
    return node.op_class is OpClass.MATMUL and len(node.inputs) >= 2 and \
        graph.tensors[node.inputs[1]].is_constant


def chain_stages(graph: FusionGraph, group: frozenset[int]) -> list[frozenset[int]] | None:
    """The stages of ``group`` when it chains two or more weight matmuls (and no other
    contraction), in order; None otherwise."""
    members = sorted(group)
    contractions = [n for n in members if graph.nodes[n].is_contraction]
    if len(contractions) < 2 or not all(_weight_matmul(graph, graph.nodes[c])
                                        for c in contractions):
        return None
    stage = assign_stages(
        members,
        lambda n: [p for p in graph.preds[n] if p in group],
        lambda n: [s for s in graph.succs[n] if s in group],
        lambda n: graph.nodes[n].is_contraction,
    )
    out: list[set[int]] = [set() for _ in contractions]
    for n, k in stage.items():
        out[k].add(n)
    return [frozenset(s) for s in out]
