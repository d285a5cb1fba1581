"""Legality: may these nodes form one group? Kept apart from profitability.

Every answer is a :class:`FusionDecision` that carries its reason, so the plan report
and ``fusion-tvm explain`` can say why two ops are not fused. Correctness never
depends on the cost model: everything the search proposes passes through here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

import tvm_ffi

from .chain_stages import chain_stages
from .graph import FusionGraph
from .hardware import OpClass
from .ops import PatternKind


class GroupKind(str, enum.Enum):
    """What a group is, as far as schedule templates are concerned."""

    ELEMENTWISE = "elementwise"  # injective chain
    REDUCTION = "reduction"  # one or more reductions (+ injective ops) over rows
    CONTRACTION = "contraction"  # one matmul / conv with prologue / epilogue
    OPAQUE = "opaque"


@dataclass(frozen=True)
class FusionDecision:
    """Whether a fusion is allowed, and why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def allow(cls) -> FusionDecision:
        """A 'yes'."""
        return cls(True)

    @classmethod
    def forbid(cls, reason: str) -> FusionDecision:
        """A 'no' with its reason."""
        return cls(False, reason)


@dataclass(frozen=True)
class TemplateLimits:
    """What a backend's schedule templates can handle in one group.

    Attributes
    ----------
    max_contractions : int
        Matmul / conv ops per group (1: prologue/epilogue fusion only).
    contraction_with_reduction : bool
        Whether a contraction may share a group with another reduction.
    max_nodes : int
        Upper bound on group size (keeps compile time and code size in check).
    row_stage : bool
        A matmul may take a row-wise reduction chain feeding its A operand (a layer norm /
        RMSNorm before a projection) or consuming its output (a softmax of scores, a norm
        after a projection): the chain runs as a staged row pass inside the kernel, before
        or after the GEMM, the rows going through cache. Reductions on both sides or
        feeding its B operand still need ``contraction_with_reduction``.
    attention : bool
        The backend has a template for a row-local compute chain: a matmul of two run-time
        tensors, row reductions of its result (softmax), and a second such matmul reading
        the reduced rows (``softmax(Q K^T) V``), or a contiguous part of that chain. Such
        groups pass whatever ``max_contractions`` / ``contraction_with_reduction`` say.
    online_softmax : bool
        The backend's attention template for the whole float32 chain computes the softmax
        online over blocks of keys and takes any number of query rows (a partial last
        tile of rows is recomputed, not guarded), so ragged row counts need not be cut.
    staged_chains : bool
        A chain of weight matmuls (an MLP) may be one kernel of stages, one per matmul
        (:mod:`~fusion_tvm.chain_stages`), each stage a group these limits allow on its own.
    attention_parts : bool
        With ``attention``: the templates also take a contiguous part of the chain (``Q K^T``
        with its softmax, the softmax with ``P V``), not only the whole of it.
    attention_row_block : int, optional
        Query rows per block of the target's row-wise attention template; a chain whose
        static row count is not a multiple of it is refused (the template would run one row
        at a time). None: the templates take any row count.
    """

    max_contractions: int = 1
    contraction_with_reduction: bool = False
    max_nodes: int = 64
    row_stage: bool = False
    attention: bool = False
    online_softmax: bool = False
    staged_chains: bool = False
    attention_parts: bool = True
    attention_row_block: int | None = None


@dataclass(frozen=True)
class FusionKinds:
    """Kinds of fusion the search may use; all on by default, switched off for ablations.

    Attributes
    ----------
    reduction_chains : bool
        A reduction together with what consumes it (softmax, layernorm as one kernel).
    multi_output : bool
        A group may publish several outputs instead of being cut.
    prologue : bool
        Producers folded into a matmul / conv's loads (transposes, casts, elementwise).
    weight_folding : bool
        BatchNorm folded into conv weights, and per-channel scale / shift chains after a
        constant-weight matmul or conv into its weights and one bias, at compile time
        (prepare phase).
    siblings : bool
        Matmuls sharing their input combined into one, and conv2ds of one input with the same
        attributes and kernel size (prepare phase, when predicted faster).
    attention : bool
        Compute chains: ``matmul -> row reductions -> matmul`` (attention) as one kernel,
        where the backend has a template for it (``TemplateLimits.attention``).
    row_stages : bool
        A norm / softmax before or after a matmul run as a staged row pass in the matmul's
        kernel (``TemplateLimits.row_stage``; needs ``reduction_chains`` too).
    mlp_chains : bool
        Chained weight matmuls (``x W1 -> act -> W2``) as one kernel of stages
        (``TemplateLimits.staged_chains``).
    """

    reduction_chains: bool = True
    multi_output: bool = True
    prologue: bool = True
    weight_folding: bool = True
    siblings: bool = True
    attention: bool = True
    row_stages: bool = True
    mlp_chains: bool = True


def check_kinds(graph: FusionGraph, group: frozenset[int], kinds: FusionKinds) -> FusionDecision:
    """Refuse groups that need a kind of fusion that is switched off."""
    if len(group) == 1:
        return FusionDecision.allow()
    nodes = [graph.nodes[i] for i in sorted(group)]
    if not kinds.reduction_chains:
        for n in nodes:
            if n.is_reduction and any(c in group for c in graph.succs[n.id]):
                return FusionDecision.forbid(
                    f"reduction chains are switched off and {n.name} feeds the group"
                )
    if not (kinds.reduction_chains and kinds.row_stages) and row_stage(graph, group)[0]:
        what = "row stages in a matmul's kernel" if kinds.reduction_chains else \
            "reduction chains (a row pass staged with a matmul)"
        return FusionDecision.forbid(f"{what} are switched off")
    if not kinds.attention and attention_chain(graph, group):
        return FusionDecision.forbid("compute chains (attention) are switched off")
    # The stages matter only to the switched-off kinds below (this runs for every
    # candidate the search proposes).
    stages = chain_stages(graph, group) if not (kinds.mlp_chains and kinds.prologue) \
        else None
    if stages is not None and not kinds.mlp_chains:
        return FusionDecision.forbid("MLP chains (staged matmuls) are switched off")
    if not kinds.multi_output:
        published = sum(
            1 for n in nodes
            if graph.tensors[n.outputs[0]].escapes
            or any(c not in group for c in graph.tensors[n.outputs[0]].consumers)
        )
        if published > 1:
            return FusionDecision.forbid("multi-output groups are switched off")
    if not kinds.prologue:
        for n in (n for n in nodes if n.is_contraction):
            own = next((st for st in stages if n.id in st), group) if stages else group
            if _ancestors(graph, n.id, frozenset(own)):
                return FusionDecision.forbid(
                    f"prologue fusion is switched off and {n.name} has producers in the group"
                )
    return FusionDecision.allow()


def reachable(edges, node: int, within: frozenset[int]) -> set[int]:
    """Nodes of ``within`` reachable from ``node`` along ``edges`` (preds or succs)."""
    seen: set[int] = set()
    stack = [p for p in edges[node] if p in within]
    while stack:
        u = stack.pop()
        if u not in seen:
            seen.add(u)
            stack.extend(p for p in edges[u] if p in within)
    return seen


def _ancestors(graph: FusionGraph, node: int, within: frozenset[int]) -> set[int]:
    return reachable(graph.preds, node, within)


def classify(graph: FusionGraph, group: Iterable[int]) -> GroupKind:
    """The template family of a group."""
    nodes = [graph.nodes[i] for i in group]
    if any(not n.fusible for n in nodes) and len(nodes) > 1:
        return GroupKind.OPAQUE
    if any(n.is_contraction for n in nodes):
        return GroupKind.CONTRACTION
    if any(n.is_reduction for n in nodes):
        return GroupKind.REDUCTION
    return GroupKind.ELEMENTWISE


def check_members(graph: FusionGraph, group: frozenset[int]) -> FusionDecision:
    """Only fusible call_tir nodes may share a group."""
    if len(group) == 1:
        return FusionDecision.allow()
    for i in sorted(group):
        n = graph.nodes[i]
        if not n.fusible:
            what = "an opaque or non-call_tir binding" if n.info is None else "an opaque PrimFunc"
            return FusionDecision.forbid(f"{graph.describe(i)} is {what}")
    return FusionDecision.allow()


def check_index_dtypes(graph: FusionGraph, group: frozenset[int]) -> FusionDecision:
    """Members must agree on the dtype of their buffer shapes: FuseTIR maps a value's
    producer and consumer buffers onto one buffer and refuses ``(1, 4)`` in int32 against
    ``(1, 4)`` in int64 (a hand-written int32 PrimFunc next to a legalized op)."""
    if len(group) == 1:
        return FusionDecision.allow()
    dtypes = set().union(*(graph.nodes[i].index_dtypes for i in group))
    if len(dtypes) > 1:
        return FusionDecision.forbid(
            f"buffer shapes in different index dtypes {sorted(dtypes)}: FuseTIR cannot join them"
        )
    return FusionDecision.allow()


def check_convex(graph: FusionGraph, group: frozenset[int]) -> FusionDecision:
    """No path may leave the group and come back into it."""
    if len(group) == 1:
        return FusionDecision.allow()
    hi = max(group)
    # nodes reachable from the group through a node outside it
    frontier = [s for g in group for s in graph.succs[g] if s not in group and s < hi]
    seen = set(frontier)
    while frontier:
        u = frontier.pop()
        for v in graph.succs[u]:
            if v in group:
                return FusionDecision.forbid(
                    f"not convex: the path through {graph.describe(u)} leaves and re-enters"
                )
            if v not in seen and v < hi:
                seen.add(v)
                frontier.append(v)
    return FusionDecision.allow()


def check_connected(graph: FusionGraph, group: frozenset[int]) -> FusionDecision:
    """Members must be linked by producer-consumer edges (sibling fusion is separate)."""
    if len(group) == 1:
        return FusionDecision.allow()
    start = min(group)
    seen = {start}
    stack = [start]
    while stack:
        u = stack.pop()
        for v in graph.succs[u] | graph.preds[u]:
            if v in group and v not in seen:
                seen.add(v)
                stack.append(v)
    if len(seen) != len(group):
        return FusionDecision.forbid("members are not connected by dataflow edges")
    return FusionDecision.allow()


def check_feedback(graph: FusionGraph, group: frozenset[int]) -> FusionDecision:
    """Refuse groups containing one the target's schedule rules could not handle."""
    for bad in graph.forbidden:
        if len(group) > 1 and bad <= group:
            names = ", ".join(graph.nodes[i].name for i in sorted(bad))
            return FusionDecision.forbid(
                f"the target's schedule templates could not handle {{{names}}} as one kernel "
                "(only the unoptimised fallback matched)"
            )
    return FusionDecision.allow()


def check_templates(
    graph: FusionGraph, group: frozenset[int], limits: TemplateLimits
) -> FusionDecision:
    """Whether the backend's templates can schedule the group well."""
    if len(group) > limits.max_nodes:
        return FusionDecision.forbid(f"group of {len(group)} ops exceeds {limits.max_nodes}")
    nodes = [graph.nodes[i] for i in group]
    contractions = [n for n in nodes if n.is_contraction]
    side, staged = row_stage(graph, group) if limits.row_stage else ("", set())
    if limits.attention and len(contractions) <= 2 and any(n.is_reduction for n in nodes) \
            and attention_chain(graph, group):
        if not limits.attention_parts and len(contractions) != 2:
            return FusionDecision.forbid(
                "the target's attention template takes the whole softmax(Q K^T) V chain only")
        first = min(contractions, key=lambda n: n.id)  # ids follow the bindings' order
        scores = graph.tensors[first.outputs[0]].shape
        d = _rows_kept(graph, group, first, len(scores) - 1)
        if not d:
            return d
        rows = scores[-2:-1]
        static = [int(r) for r in rows if isinstance(r, int) or hasattr(r, "value")]
        block = limits.attention_row_block
        if block is None or not static or static[0] % block == 0:
            return FusionDecision.allow()
        if limits.online_softmax and _whole_float_chain(graph, group, contractions):
            return FusionDecision.allow()  # the online template clamps its last row tile
        if not side:
            return FusionDecision.forbid(
                f"attention with {static[0]} query rows (not a multiple of {block}): the "
                "target's row-wise attention template's row blocks do not fit"
            )
        # Q K^T then the softmax: the matmul rule's GEMM and a staged row pass after it.
    stages = chain_stages(graph, group) if limits.staged_chains else None
    if stages is not None:
        single = dataclasses.replace(limits, staged_chains=False)
        for k, stage in enumerate(stages):
            d = check_templates(graph, stage, single)
            if not d:
                return FusionDecision.forbid(f"stage {k + 1} of the matmul chain: {d.reason}")
        return FusionDecision.allow()
    if len(contractions) > limits.max_contractions:
        names = ", ".join(n.name for n in contractions)
        return FusionDecision.forbid(
            f"{len(contractions)} matmul/conv ops ({names}) in one group; the target's "
            f"templates fuse at most {limits.max_contractions}"
        )
    # A staged row pass after the GEMM runs the reductions and what follows them on whole
    # rows; only the ops before them run on the output tiles.
    for c in contractions:
        d = _epilogue_maps_onto(graph, group, c, staged if side == "epilogue" else set())
        if d and side == "epilogue":  # every reduction lies below the one GEMM
            d = _reduces_along_rows(graph, c, [n for n in nodes if n.is_reduction])
        if not d:
            return d
    for r in (n for n in nodes if n.is_reduction):
        d = _rows_map_once(graph, group, r)
        if d:
            d = _rows_kept(graph, group, r, _row_rank(graph, r))
        if not d:
            return d
    if contractions and not limits.contraction_with_reduction:
        reds = [n for n in nodes if n.is_reduction]
        if reds and side:
            return FusionDecision.allow()
        if reds:
            return FusionDecision.forbid(
                f"matmul/conv {contractions[0].name} with reduction {reds[0].name}: no template "
                "schedules a contraction together with a separate reduction"
            )
    return FusionDecision.allow()


def row_stage(graph: FusionGraph, group: frozenset[int]) -> tuple[str, set[int]]:
    """Whether the reductions of ``group`` form a row stage of its one matmul: where, and the
    members the staged row pass computes.

    ``("prologue", ancestors of the matmul)`` when every reduction lies on the A side
    (upstream of its first input, none upstream of another: a norm feeding a projection);
    ``("epilogue", the reductions below it and what follows them)`` when every reduction is
    downstream of it (a softmax of scores, a norm after a projection; the ops before them
    stay its tile epilogue); else ``("", set())``.
    """
    contractions = [graph.nodes[i] for i in group if graph.nodes[i].is_contraction]
    reds = [i for i in group if graph.nodes[i].is_reduction]
    if len(contractions) != 1 or contractions[0].op_class is not OpClass.MATMUL or not reds:
        return "", set()
    c = contractions[0]

    def side(tids) -> set[int]:
        out: set[int] = set()
        for tid in tids:
            p = graph.tensors[tid].producer
            if p in group:
                out |= {p} | _ancestors(graph, p, group)
        return out

    a_side, b_side = side(c.inputs[:1]), side(c.inputs[1:])
    if all(r in a_side and r not in b_side for r in reds):
        return "prologue", _ancestors(graph, c.id, group)
    below = _descendants(graph, c.id, group)
    if all(r in below for r in reds):
        return "epilogue", set(reds).union(*(_descendants(graph, r, group) for r in reds))
    return "", set()


def _whole_float_chain(graph: FusionGraph, group: frozenset[int], contractions) -> bool:
    """Whether ``group`` is the whole float32 ``softmax(Q K^T) V`` chain publishing nothing
    before its second matmul (what the online-softmax template takes)."""
    if len(contractions) != 2:
        return False
    second = max(c.id for c in contractions)  # ids follow the bindings' (topological) order
    tail = {second} | _descendants(graph, second, group)
    for n in group:
        t = graph.tensors[graph.nodes[n].outputs[0]]
        if t.dtype != "float32":
            return False
        if n not in tail and (t.escapes or any(c not in group for c in t.consumers)):
            return False
    return True


def _activation_matmul(graph: FusionGraph, node) -> bool:
    """A matmul of two run-time tensors (no constant weight): Q K^T or P V."""
    return node.op_class is OpClass.MATMUL and len(node.inputs) >= 2 and not any(
        graph.tensors[t].is_constant for t in node.inputs[:2]
    )


def attention_chain(graph: FusionGraph, group: frozenset[int]) -> bool:
    """Whether ``group`` is (a contiguous part of) ``matmul -> row reductions -> matmul``.

    Every contraction multiplies two run-time tensors; with two of them the second is fed
    by the first through the group. Every reduction lies after the first contraction or
    before the second one, so each query row's chain (scores, softmax, P V) is computed
    from that row alone. Weight matmuls (a layer norm before a projection) never qualify:
    computing a dense layer row by row would re-read its weights once per row.
    """
    nodes = [graph.nodes[i] for i in sorted(group)]
    contractions = [n for n in nodes if n.is_contraction]
    reductions = [n for n in nodes if n.is_reduction]
    if not contractions or not reductions or len(contractions) > 2:
        return False
    if not all(_activation_matmul(graph, c) for c in contractions):
        return False
    below = {c.id: _descendants(graph, c.id, group) for c in contractions}
    above = {c.id: _ancestors(graph, c.id, group) for c in contractions}
    if len(contractions) == 2:
        first, second = contractions
        if second.id not in below[first.id]:
            return False
        return all(r.id in below[first.id] and r.id in above[second.id] for r in reductions)
    c = contractions[0]
    return all(r.id in below[c.id] for r in reductions) or all(
        r.id in above[c.id] for r in reductions
    )


def _descendants(graph: FusionGraph, node: int, within: frozenset[int]) -> set[int]:
    return reachable(graph.succs, node, within)


def _stage_after(graph: FusionGraph, group: frozenset[int], node, stop=frozenset()):
    """The ops of ``group`` downstream of ``node`` that run in its stage, depth first: the
    walk does not pass a contraction (a chained matmul/conv has its own epilogue, where
    templates allow one) nor an op in ``stop``."""
    stack = [v for v in graph.succs[node.id] if v in group]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        op = graph.nodes[v]
        if op.is_contraction or v in stop:
            continue
        yield op
        stack.extend(s for s in graph.succs[v] if s in group)


def _epilogue_maps_onto(graph: FusionGraph, group: frozenset[int], c,
                        staged: set[int] = frozenset()) -> FusionDecision:
    """Ops after a matmul/conv run on its output tiles: each may read an in-group value at
    most once per element (a Concat(t, t) or a broadcast of the result would need tiles the
    kernel never computes; fuzz seeds 154 and 5096). ``staged``: the row pass after the
    GEMM, which reads whole rows."""
    out = c.outputs[0]
    for node in _stage_after(graph, group, c, staged):
        for k, tid in enumerate(node.inputs):
            if graph.tensors[tid].producer in group and node.reuse(k, graph.dims) > 1.0 + 1e-9:
                return FusionDecision.forbid(
                    f"{node.name} reads {graph.tensors[tid].name} more than once per element, "
                    f"so it cannot run on the output tiles of {c.name} "
                    f"({graph.tensors[out].name})"
                )
    return FusionDecision.allow()


def _static_size(shape) -> int | None:
    size = 1
    for d in shape:
        v = d if isinstance(d, int) else getattr(d, "value", None)
        if not isinstance(v, int):
            return None
        size *= v
    return size


def _reduces_along_rows(graph: FusionGraph, c, reductions) -> FusionDecision:
    """The staged row pass after a GEMM reduces along its output rows (a norm over the
    features of each token, or of each head after a split): every reduction's reduced
    extent must divide the GEMM's row length (its last output axis). One that reduces
    across the rows (EdgeNeXt's cross-covariance attention: a projection transposed to
    ``[heads, dims, tokens]``, then a sum of squares over the tokens) has no row pass to
    run in: the group fell to the fallback, 2.3 ms against 0.08 predicted. Extents only
    (symbolic ones pass): a reshape that swaps two equal extents is not seen.
    ``reductions``: the group's, all below ``c`` (:func:`row_stage`'s epilogue side)."""
    row = _static_size(graph.tensors[c.outputs[0]].shape[-1:])
    if row is None:
        return FusionDecision.allow()
    for r in reductions:
        if not r.inputs:
            continue
        data = _static_size(graph.tensors[r.inputs[0]].shape)
        out = _static_size(graph.tensors[r.outputs[0]].shape)
        if data is None or not out or data % out:
            continue
        if row % (data // out):
            return FusionDecision.forbid(
                f"{r.name} reduces {data // out} elements, not along the rows of {c.name} "
                f"({row} long): no row pass after the GEMM computes it")
    return FusionDecision.allow()


def _rows_map_once(graph: FusionGraph, group: frozenset[int], r) -> FusionDecision:
    """A reduction's consumers run on each finished row: a layout op after it that takes
    one in-group tensor as several of its inputs (``Concat(t, t)``) writes rows the kernel
    never visits twice (fuzz seed 30135: half the concat's output stayed zero)."""
    for v in _descendants(graph, r.id, group):
        node = graph.nodes[v]
        if node.pattern <= PatternKind.BROADCAST:
            continue
        inner = [t for t in node.inputs if graph.tensors[t].producer in group]
        if len(inner) != len(set(inner)):
            return FusionDecision.forbid(
                f"{node.name} takes one value of the group as several inputs, so it cannot "
                f"run on the rows of reduction {r.name}"
            )
    return FusionDecision.allow()


def _same_dim(x, y) -> bool:
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    return tvm_ffi.structural_equal(x, y)


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b, strict=True))


def _row_rank(graph: FusionGraph, r) -> int:
    """Leading axes of reduction ``r``'s output that are rows (kept whole, before the first
    reduced axis): the spatial iterators of its reduction block, cut where its data input's
    shape stops matching its output's (a mean over H, W kept as unit dims has rows N, C)."""
    block = next((b for b in r.info.blocks if b.num_reduce_axes), None) if r.info else None
    if block is None:
        return 0
    rank = len(block.domain) - block.num_reduce_axes
    out = graph.tensors[r.outputs[0]].shape
    data = graph.tensors[r.inputs[0]].shape if r.inputs else ()
    prefix = 0
    while prefix < min(len(out), len(data)) and _same_dim(out[prefix], data[prefix]):
        prefix += 1
    return min(rank, prefix, len(out))


def _rows_kept(graph: FusionGraph, group: frozenset[int], r, rank: int) -> FusionDecision:
    """The ops after a reduction (or an attention chain's scores) run on its finished rows,
    in the same row loop: a layout op there must keep the ``rank`` leading row axes. A pad,
    a slice, or a reshape / transpose that moves them (Swin's shifted-window partition
    after its layer norm, its attention mask added to scores reshaped by window) writes
    rows the loop never visits, and no template schedules the group (measured: the
    fallback, 50-100x slower). Contractions after it start a stage of their own."""
    if rank == 0:
        return FusionDecision.allow()
    rows = graph.tensors[r.outputs[0]].shape[:rank]
    for node in _stage_after(graph, group, r):
        if node.pattern is PatternKind.INJECTIVE:
            out = graph.tensors[node.outputs[0]].shape
            if not _same_dims(out[:rank], rows):
                return FusionDecision.forbid(
                    f"{node.name} moves the rows of {r.name} (leading axes "
                    f"{list(rows)} become {list(out[:rank])}), so it cannot run in its row "
                    "loop")
    return FusionDecision.allow()


def is_legal(
    graph: FusionGraph,
    group: frozenset[int],
    limits: TemplateLimits | None = None,
    kinds: FusionKinds | None = None,
) -> FusionDecision:
    """All legality checks in order; the first failure is returned."""
    for check in (check_members, check_index_dtypes, check_connected, check_convex,
                  check_feedback):
        d = check(graph, group)
        if not d:
            return d
    d = check_templates(graph, group, limits or TemplateLimits())
    if not d or kinds is None:
        return d
    return check_kinds(graph, group, kinds)


def quotient_is_acyclic(graph: FusionGraph, groups: Iterable[frozenset[int]]) -> bool:
    """Whether contracting every group to one vertex leaves the graph acyclic."""
    gid = {}
    groups = list(groups)
    for k, g in enumerate(groups):
        for n in g:
            gid[n] = k
    for n in range(len(graph.nodes)):
        gid.setdefault(n, len(groups) + n)
    succ: dict[int, set[int]] = {}
    indeg: dict[int, int] = {v: 0 for v in set(gid.values())}
    for u in range(len(graph.nodes)):
        for v in graph.succs[u]:
            a, b = gid[u], gid[v]
            if a != b and b not in succ.setdefault(a, set()):
                succ[a].add(b)
                indeg[b] += 1
    ready = [v for v, d in indeg.items() if d == 0]
    count = 0
    while ready:
        a = ready.pop()
        count += 1
        for b in succ.get(a, ()):
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return count == len(indeg)
