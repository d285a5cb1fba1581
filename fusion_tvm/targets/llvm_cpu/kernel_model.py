"""The LLVM-CPU target's kernel model: what its rules make of a fused group.

The roofline cost model asks the target (``KernelModel``, implemented by
:class:`~.backend.LLVMCPUBackend`) how many parallel loops a group's kernel forks and
joins, whether its main loop runs serial, what it stages and recomputes. This module
answers from the fusion graph with the same decisions the rules take on the PrimFunc
(``parallel.py``, the rules' tile derivations), so the model charges the kernel the rules
emit. It sits above the rules it describes: rules never import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tvm import tirx

from ...cost_models import roofline
from ...cost_models.roofline import conv_kind
from ...hardware import HardwareSpec
from ...legality import attention_chain, reachable, row_stage
from ...ops import OpClass, PatternKind
from ...tir_analysis import evaluate, shape_elems
from ._util import row_vector_width
from .attention import ROW_TILE
from .conv2d import derive_channel_tiles, derive_tiles
from .conv2d_nchwc import (
    MAX_INLINE_PROLOGUE_OPS,
    MAX_INLINE_PROLOGUE_SOURCES,
    derive_blocked_tiles,
)
from .efficiency import NCHW_PENALTY
from .matmul import derive_tiles as derive_matmul_tiles
from .parallel import (
    ROW_PASS_OPS,
    conv_parallel_pays,
    elementwise_seconds,
    gemv_panel,
    gemv_pays,
    matmul_tile_pays,
    pack_pays,
    parallel_pays,
    reduction_pays,
    repack_pays,
    row_kernel_pays,
    serial_seconds,
    spatial_chunks,
)
from .reduction import MAX_WINDOW
from .row_staging import row_staging_pays


def _dims(graph, tid: int) -> list[float]:
    return [float(evaluate(d, graph.dims)) for d in graph.tensors[tid].shape]


def _published(graph, group) -> list[int]:
    out = []
    for n in sorted(group):
        for t in graph.nodes[n].outputs[:1]:
            tensor = graph.tensors[t]
            if tensor.escapes or not tensor.consumers or \
                    any(c not in group for c in tensor.consumers):
                out.append(t)
    return out


def b_transposed(graph, group, node) -> bool:
    """Whether a layout-changing (injective, not broadcast) op of ``group`` produces the
    B operand of the contraction ``node``: the matmul rule then packs B."""
    if len(node.inputs) < 2:
        return False
    pending = [node.inputs[1]]
    while pending:
        producer = graph.tensors[pending.pop()].producer
        if producer is None or producer not in group:
            continue
        p = graph.nodes[producer]
        if p.pattern == PatternKind.INJECTIVE and not p.is_view:
            return True
        pending.extend(p.inputs)
    return False


def _lane_prologue(graph, group, tid: int, published: set[int]) -> dict | None:
    """FLOPs by class of the ops of ``group`` producing ``tid`` when they are elementwise on
    at most ``MAX_INLINE_PROLOGUE_SOURCES`` tensors of ``tid``'s shape (scalar constants
    aside; ops that move lanes without arithmetic, a slice or a concat along the channel
    blocks or rows, may stand between, :func:`_lane_slice`) and cheap (at most
    ``MAX_INLINE_PROLOGUE_OPS`` per element, no transcendental), more than one only through
    ops that move data (a concat's select): the padding block they inline into then reads
    those tensors, lanes innermost, as the depthwise rule requires to inline it. A prologue
    tensor the group publishes (in ``published``) is one of the tensors read (its block
    stays a pass of its own). None otherwise."""
    shape = _dims(graph, tid)
    elems = max(1.0, math.prod(shape))
    work: dict = {}
    external: set[int] = set()
    pending, seen = [tid], set()
    while pending:
        t = pending.pop()
        producer = graph.tensors[t].producer
        if producer is None or producer not in group or t in published:
            if math.prod(_dims(graph, t) or [1.0]) > 1:
                external.add(t)
            continue
        if producer in seen:
            continue
        seen.add(producer)
        node = graph.nodes[producer]
        if node.pattern > PatternKind.BROADCAST or _dims(graph, node.outputs[0]) != shape:
            if not _lane_slice(graph, node, shape):
                return None
        for cls, f in node.flops(graph.dims).items():
            work[cls] = work.get(cls, 0.0) + f
        pending.extend(node.inputs)
    if work.get(OpClass.TRANSCENDENTAL) or \
            work.get(OpClass.ELEMENTWISE, 0.0) / elems > MAX_INLINE_PROLOGUE_OPS + 1e-9:
        return None
    if not 1 <= len(external) <= MAX_INLINE_PROLOGUE_SOURCES or \
            not all(_same_lanes(_dims(graph, t), shape) for t in external):
        return None
    if len(external) > 1 and not all(  # only a select (concat) reads two tensors
            graph.nodes[n].is_view or _lane_slice(graph, graph.nodes[n], shape) for n in seen):
        return None
    return work


def _same_lanes(dims: list[float], shape: list[float]) -> bool:
    return len(dims) == len(shape) and bool(dims) and dims[-1] == shape[-1]


def _lane_slice(graph, node, shape: list[float]) -> bool:
    """Whether ``node`` moves data between tensors of ``shape``'s rank and lane count (a
    slice or a concat along the channel blocks or rows: MixNet's channel groups, GhostNet's
    ghost halves; a concat's select counts as its work), so the padding it inlines into
    still reads lanes innermost."""
    return node.pattern == PatternKind.INJECTIVE and not node.is_view and all(
            _same_lanes(_dims(graph, t), shape) for t in (*node.inputs, *node.outputs[:1])
            if math.prod(_dims(graph, t) or [1.0]) > 1)


def _prologue_tensors(graph, group, tid: int) -> list[int]:
    """``tid`` and the tensors upstream of it that ops of ``group`` produce, each once."""
    found, pending = [], [tid]
    while pending:
        t = pending.pop()
        producer = graph.tensors[t].producer
        if producer is None or producer not in group or t in found:
            continue
        found.append(t)
        pending.extend(graph.nodes[producer].inputs)
    return found


def _prologue_keeps_lanes(graph, tid: int, tensors: list[int]) -> bool:
    """Whether the ops producing ``tensors`` (``tid``'s prologue, :func:`_prologue_tensors`:
    padding, concat, slice, elementwise) read and write only tensors of ``tid``'s rank
    (scalars aside), so the block they become copies whole lane vectors; a layout change or
    reshape among them gathers across lanes."""
    rank = len(graph.tensors[tid].shape)
    for producer in {graph.tensors[t].producer for t in tensors}:
        node = graph.nodes[producer]
        tensors_of = [*node.inputs, *node.outputs]
        if node.is_view or any(len(graph.tensors[t].shape) not in (0, rank) for t in tensors_of):
            return False
    return True


def _pass_pays(hw: HardwareSpec, elems: float, inner: float | None) -> bool:
    """Whether one spatial pass over ``elems`` elements, ``inner`` of them innermost
    (``parallel_vectorize``: the rest one parallel loop; None: a 1-d pass), runs in
    parallel."""
    return parallel_pays(hw, elementwise_seconds(hw, elems, 8.0),
                         int(elems / inner) if inner else None)


@dataclass(frozen=True)
class ConvKernel:
    """What the conv rules make of a group, as the cost model needs it.

    ``regions``: parallel loops (fork/joins); ``rows_parallel``: whether the output rows,
    the kernel's main loop, are one of them; ``staged_bytes``: a zero-padded copy of the
    input (with the prologue applied) written before the convolution and read back by it;
    ``recompute``: FLOPs by class of a prologue inlined into the convolution's loads beyond
    its one evaluation per element (it runs once per tap that reads an element);
    ``compute_scale``: ``NCHW_PENALTY`` for a grouped (depthwise) conv left in NCHW.
    """

    regions: int
    rows_parallel: bool
    staged_bytes: float = 0.0
    recompute: Mapping[OpClass, float] = field(default_factory=dict)
    compute_scale: float = 1.0


def conv_group_regions(graph, group: frozenset[int], conv, hw: HardwareSpec) -> int | None:
    """Parallel loops of the conv rules' kernel for ``group`` (see :func:`conv_kernel`)."""
    kernel = conv_kernel(graph, group, conv, hw)
    return None if kernel is None else kernel.regions


def conv_kernel(graph, group: frozenset[int], conv, hw: HardwareSpec) -> ConvKernel | None:
    """The conv rules' kernel for ``group`` around the convolution node ``conv``. Parallel
    loops: the output rows (:func:`conv_parallel_pays` over the same task count the rule
    fuses), the zero-padded input (not for a blocked depthwise conv: inline)
    and a layout change after the conv (each one spatial pass, ``parallel_vectorize``)
    and, for the NCHW channel-vector kernel, its weight repack. None
    when the shapes are not the rules' (the generic count applies)."""
    out = _dims(graph, conv.outputs[0])
    if len(conv.inputs) < 2:
        return None
    data, weight = _dims(graph, conv.inputs[0]), _dims(graph, conv.inputs[1])
    flops = conv.flops(graph.dims).get(OpClass.CONV, 0.0)
    count, depthwise, scale = 0, False, 1.0
    if len(out) == 5 and len(data) == 5 and len(weight) in (5, 6):  # NCHW[b]c
        n, blocks, rows, width, block = (int(d) for d in out)
        depthwise = len(weight) == 5
        kh, kw = int(weight[2]), int(weight[3])
        reduce = kh * kw * (1 if depthwise else int(weight[1]) * int(weight[4]))
        tiles = derive_blocked_tiles(hw, 32, block, blocks, width, depthwise,
                                     reduce * block * 4)
        rows_parallel = conv_parallel_pays(hw, flops, n * (blocks // tiles.fo) * rows,
                                           graph.nbytes(conv.inputs[1]))
    elif len(out) == 4 and len(data) == 4 and len(weight) == 4:  # NCHW
        n, channels, rows, width = (int(d) for d in out)
        kh, kw = int(weight[2]), int(weight[3])
        kind = conv_kind(graph, frozenset([conv.id]), hw)
        if kind == "window":
            return None
        if int(weight[1]) != int(data[1]):  # grouped / depthwise: off the fast path
            scale = NCHW_PENALTY
        if kind == "row":
            tiles = derive_tiles(hw, 32, channels, width)
            fr = tiles.fr if tiles is not None else 1
        else:
            ctiles = derive_channel_tiles(hw, 32, channels, width)
            fr = ctiles.fr if ctiles is not None else 1
            if not graph.tensors[conv.inputs[1]].is_constant:  # else packed at compile time
                count += repack_pays(hw, math.prod(weight), -(-channels // fr))
        rows_parallel = conv_parallel_pays(hw, flops * scale, n * -(-channels // fr) * rows,
                                           graph.nbytes(conv.inputs[1]))
    else:
        return None
    count += rows_parallel
    # The zero-padded input, or a prologue on it (a producer feeding the contraction is not
    # inlined into it): one spatial pass over the (padded) input.
    stride = [max(1, round(data[a] / out[a])) for a in (2, 3)]
    pad = [max(0.0, (out[a] - 1) * st + k - data[a])
           for a, st, k in zip((2, 3), stride, (kh, kw), strict=True)]
    prologue = graph.tensors[conv.inputs[0]].producer in group
    # A blocked depthwise conv reads its padding inline (no pass), and an elementwise
    # prologue of one tensor with it.
    upstream = _prologue_tensors(graph, group, conv.inputs[0])  # [] without a prologue
    published = set(_published(graph, group))
    lane_prologue = _lane_prologue(graph, group, conv.inputs[0], published) if prologue \
        else None
    inline_pad = len(out) == 5 and len(weight) == 5 and (
        not prologue or lane_prologue is not None)
    staged, recompute = 0.0, {}
    if (pad[0] > 0 or pad[1] > 0 or prologue) and not inline_pad:
        padded = math.prod(data) / (data[2] * data[3]) * (data[2] + pad[0]) * (data[3] + pad[1])
        # Blocked dense: computed per task of the row loop when that pays (the rule's trial
        # reads the same factor from the loops): output-channel groups (each reads every
        # input channel) x input rows per task over the rows.
        fo_groups = blocks // tiles.fo if len(out) == 5 and not depthwise else 0
        # A prologue output the group publishes stays an output block (never moved).
        per_row = fo_groups and published.isdisjoint(upstream) \
            and row_staging_pays(fo_groups * out[2] * kh / (data[2] + pad[0]),
                                 _prologue_keeps_lanes(graph, conv.inputs[0], upstream))
        if not per_row:
            count += _pass_pays(hw, padded, data[-1])
            staged = 4.0 * padded
    elif lane_prologue:  # inlined into the depthwise loads: once per tap reading an element
        taps = math.prod(out) * kh * kw / max(1.0, math.prod(data))
        recompute = {cls: f * max(0.0, taps - 1.0) for cls, f in lane_prologue.items()}
    # A prologue output the group publishes: its block cannot be inlined, a pass of its own.
    for t in published.intersection(upstream):
        shape = _dims(graph, t)
        count += _pass_pays(hw, math.prod(shape), shape[-1] if len(shape) > 1 else None)
    # An output of another rank after the conv (to / from NCHW[b]c): not computed per
    # register tile but a pass of its own, the unpublished ops before it inlined into it (a
    # round trip back to the conv's layout is computed per tile).
    before = {graph.tensors[t].producer for t in upstream}
    for n in group:
        node = graph.nodes[n]
        if n == conv.id or n in before or not node.outputs or node.is_contraction \
                or node.outputs[0] not in published:
            continue
        shape = _dims(graph, node.outputs[0])
        if len(shape) != len(out) and len(shape) > 1:
            count += _pass_pays(hw, math.prod(shape), shape[-1])
    return ConvKernel(int(count), bool(rows_parallel), staged, recompute, scale)


def window_regions(graph, group: frozenset[int], hw: HardwareSpec) -> int | None:
    """Parallel loops of the reduction rule's window (pooling) kernel, None for a group it
    schedules as rows: one reduction block over at most ``MAX_WINDOW`` elements per output,
    its rows in parallel (:func:`reduction_pays`); the padding before it (unless the window
    runs over ``NCHW[b]c`` lanes, which read it inline) and the fused epilogue after it
    (inlined into one block) each a spatial pass of their own."""
    owners = [(n, b) for n in sorted(group) if graph.nodes[n].info is not None
              for b in graph.nodes[n].info.blocks]
    at = [k for k, (_, b) in enumerate(owners) if b.num_reduce_axes]
    if len(at) != 1:
        return None
    node_id, red = owners[at[0]]
    n_spatial = len(red.domain) - red.num_reduce_axes
    extents = [float(evaluate(d, graph.dims)) for d in red.domain]
    window = math.prod(extents[n_spatial:])
    width = max(1, hw.simd_width_bits // 32)
    lanes_inner = n_spatial == 5 and 4 <= extents[n_spatial - 1] <= 4 * width  # NCHW[b]c
    if n_spatial < 2 or (window > MAX_WINDOW and not lanes_inner):
        return None  # rows (a global pool over NCHW[b]c lanes stays a window)
    total = math.prod(extents[:n_spatial])
    count = int(reduction_pays(hw, total * window, int(math.prod(extents[:n_spatial - 1]))))
    passes = [] if lanes_inner else [  # the padding: blocks of the pool's op before it
        b.domain for n, b in owners[:at[0]] if n == node_id]
    below = reachable(graph.succs, node_id, group)
    after = [graph.nodes[n].outputs[0] for n in sorted(below) if graph.nodes[n].outputs]
    if after:  # the epilogue chain, inlined into its last block
        passes.append(max((graph.tensors[t].shape for t in after),
                          key=lambda sh: shape_elems(sh, graph.dims)))
    for domain in passes:
        elems = shape_elems(domain, graph.dims)
        last = float(evaluate(domain[-1], graph.dims)) if domain else 1.0
        chunks = int(elems / max(last, 1.0)) if len(domain) > 1 else math.ceil(elems / width)
        count += parallel_pays(hw, elementwise_seconds(hw, elems, 8.0), chunks)
    return count


def group_parallel_regions(graph, group: frozenset[int], rule: str, hw: HardwareSpec) -> int:
    """Parallel loops of the kernel the LLVM-CPU rules make of ``group``.

    Reads the work of each loop off the graph and asks the same questions the rules ask
    (:func:`parallel_pays` and its wrappers). Convolutions keep the generic count (the conv
    rules always parallelise their output rows).
    """
    if hw.num_cores <= 1:
        return 0
    dims = graph.dims
    flops: dict[OpClass, float] = {}
    for n in group:
        for cls, f in graph.nodes[n].flops(dims).items():
            flops[cls] = flops.get(cls, 0.0) + f
    published = _published(graph, group)
    outs = [_dims(graph, t) for t in published]
    elems = [float(math.prod(d)) if d else 1.0 for d in outs]
    contractions = [n for n in sorted(group) if graph.nodes[n].is_contraction]
    if rule == "attention" or (contractions and attention_chain(graph, group)
                               and any(graph.nodes[n].is_reduction for n in group)):
        # Mirrors attention.attention_parallel_pays: one parallel loop over query rows when
        # the kernel's serial matmul-rate time pays for the fork/join.
        if not contractions:
            return 0
        # Symbolic extents are priced at the evaluation point (graph.dims), as the matmul
        # branch below does; the rule itself parallelises a symbolic kernel.
        shape = _dims(graph, graph.nodes[contractions[-1]].outputs[0])
        rows = int(math.prod(shape[:-1])) if len(shape) > 1 else 1
        return int(parallel_pays(hw, serial_seconds(hw, flops, 0.0, "matmul", "small"),
                                 -(-rows // ROW_TILE)))
    if rule == "conv2d" and contractions:
        regions = conv_group_regions(graph, group, graph.nodes[contractions[0]], hw)
        if regions is not None:
            return regions
    if rule not in ("matmul", "reduction", "elementwise", "fallback"):
        return roofline.parallel_regions(graph, group, rule, hw, flops, published)
    if rule == "matmul":
        node = next((graph.nodes[n] for n in sorted(group) if graph.nodes[n].is_contraction),
                    None)
        if node is None:
            return roofline.parallel_regions(graph, group, rule, hw, flops, published)
        c = _dims(graph, node.outputs[0])
        if len(c) < 2:
            return roofline.parallel_regions(graph, group, rule, hw, flops, published)
        m, n_ = int(c[-2]), int(c[-1])
        batch = int(math.prod(c[:-2])) if len(c) > 2 else 1
        transposed = b_transposed(graph, group, node)
        k = int(round(flops.get(OpClass.MATMUL, 0.0) / max(1.0, 2.0 * batch * m * n_)))
        if m * batch == 1 and not transposed:  # the row-GEMV schedule (matmul.py)
            nr = gemv_panel(hw, 32)
            return int(gemv_pays(hw, 2.0 * k * n_, 4.0 * k * n_, math.ceil(n_ / nr)))
        symbolic = [not isinstance(d, (int, tirx.IntImm))
                    for d in graph.tensors[node.outputs[0]].shape[-2:]]
        # A constant B is packed at compile time (PrepackWeights): no pass at run time.
        b_constant = graph.tensors[node.inputs[1]].is_constant
        tiles = derive_matmul_tiles(hw, 32, None if symbolic[0] else m, None if symbolic[1] else n_,
                             not transposed, b_constant)
        mr, nr = tiles.mr, tiles.nr
        count = 0
        side = row_stage(graph, group)[0]
        if side:  # a norm computing A / a softmax of C: the rule's row pass
            a = _dims(graph, node.inputs[0] if side == "prologue" else node.outputs[0])
            elements = float(math.prod(a))
            count += row_kernel_pays(hw, ROW_PASS_OPS * elements, ROW_PASS_OPS * elements,
                                     int(elements / max(a[-1], 1.0)) if a else None)
        if tiles.pack_b and not b_constant:
            panels = batch * math.ceil(n_ / nr)
            count += pack_pays(hw, panels * k * nr, 32, panels)
        if symbolic[0] or m % mr:  # A padded to whole row tiles: one more spatial pass
            rows = batch * math.ceil(m / mr) * mr
            count += parallel_pays(hw, elementwise_seconds(hw, rows * k, 8.0), rows)
        n_tiles = batch * math.ceil(m / mr) * math.ceil(n_ / nr)
        count += matmul_tile_pays(hw, 2.0 * n_tiles * mr * nr * k, n_tiles)  # padded tiles
        return int(count)
    if rule == "fallback" and any(graph.nodes[n].pattern >= PatternKind.COMM_REDUCE
                                  for n in group):
        # Reduction blocks: the leading spatial loops run in parallel (one per block).
        work = sum(flops.values())
        return int(parallel_pays(hw, serial_seconds(hw, {OpClass.REDUCTION: work}, 4 * work,
                                                    "fallback")))
    if rule == "reduction":
        regions = window_regions(graph, group, hw)
        if regions is not None:
            return regions
        # Rows x row length (the reduction's iterations); a window nest (a conv the
        # template declined) counts its whole iteration space.
        work = max(max(elems, default=0.0), flops.get(OpClass.REDUCTION, 0.0),
                   flops.get(OpClass.CONV, 0.0) / 2)
        big = outs[elems.index(max(elems))] if elems else []
        rows = int(math.prod(big[:-1])) if len(big) > 1 else None
        return int(row_kernel_pays(hw, max(1.0, sum(flops.values())), 8.0 * work, rows))
    total = sum(elems) or 1.0
    inputs = {t for n in group for t in graph.nodes[n].inputs
              if graph.tensors[t].producer not in group}
    calls = flops.get(OpClass.TRANSCENDENTAL, 0.0) / total
    count = 0
    for e, t in zip(elems, published, strict=True):
        # As the rule counts: each input read at most once per output element (a gather
        # reads only the rows it takes), the output written once.
        moved = graph.nbytes(t)
        for i in inputs:
            size = math.prod(_dims(graph, i)) if graph.tensors[i].shape else 1.0
            moved += graph.nbytes(i) * min(1.0, e / max(size, 1.0))
        work = elementwise_seconds(hw, e, moved / max(e, 1.0), calls)
        shape = [int(d) for d in _dims(graph, t)] or [1]
        lanes = max(1, hw.simd_width_bits // 32)
        width = row_vector_width(shape[-1], lanes) if shape[-1] > lanes else lanes
        chunks = spatial_chunks(hw, shape, width)  # as parallel_vectorize counts them
        count += parallel_pays(hw, work, chunks)
    return int(count)
