"""Schedule helpers shared by the LLVM-CPU rules (block analysis, inlining, loop shaping)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.schedule import LoopRV, SBlockRV, ScheduleError

from ...attrs import CONSTANT_PARAMS_ATTR
from ...hardware import HardwareSpec
from ...tir_analysis import analyze_primfunc
from ..tir_writer import static_int
from .parallel import elementwise_seconds, parallel_pays, spatial_chunks


def lanes(hw: HardwareSpec, dtype_bits: int) -> int:
    """SIMD lanes of one vector register for elements of ``dtype_bits``."""
    return max(1, hw.simd_width_bits // max(8, dtype_bits))


def root_blocks(sch: s_tir.Schedule) -> list[SBlockRV]:
    """The blocks directly under the root block of ``sch``'s function."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def iter_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """``"S"``/``"R"``/``"O"`` per block iter var, e.g. ``"SSR"``."""
    kinds = {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}
    return "".join(kinds.get(iv.iter_type, "O") for iv in sch.get(block).iter_vars)


def is_spatial(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether every iter of ``block`` is data-parallel."""
    return set(iter_kinds(sch, block)) <= {"S"}


def is_reduction(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` has both spatial and reduction iters and no other kind."""
    return set(iter_kinds(sch, block)) == {"S", "R"} or iter_kinds(sch, block) == "R"


def is_contraction(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """A reduction block of the form ``acc += a * b`` over two distinct buffers."""
    stmt = sch.get(block)
    if not is_reduction(sch, block) or not isinstance(stmt.body, tirx.BufferStore):
        return False
    value = stmt.body.value
    if not isinstance(value, tirx.Add) or not isinstance(value.b, tirx.Mul):
        return False
    sources = {r.source for r in stmt.reads}
    return len(sources) == 2


def sole_contraction(sch: s_tir.Schedule, out_rank: int):
    """The function's only reduction block when it reads two buffers and writes one of rank
    ``out_rank``: ``(block, statement, output index vars)``, an index var None where the
    output is not indexed by a plain var; None when the function has another shape."""
    reductions = [b for b in root_blocks(sch) if not is_spatial(sch, b)]
    if len(reductions) != 1 or not is_reduction(sch, reductions[0]):
        return None
    main = reductions[0]
    stmt = sch.get(main)
    if len(stmt.reads) != 2 or len(stmt.writes) != 1 or \
            len(stmt.writes[0].region) != out_rank:
        return None
    out_vars = [r.min if isinstance(r.min, tirx.Var) else None for r in stmt.writes[0].region]
    return main, stmt, out_vars


def constant_param(func: tirx.PrimFunc, buf) -> bool:
    """Whether ``buf`` is a parameter every caller passes as a constant."""
    constant = (func.attrs or {}).get(CONSTANT_PARAMS_ATTR, [])
    return any(func.params[int(i)].same_as(buf) for i in constant)


def reads_along_reduction(stmt: tirx.stmt.SBlock) -> bool:
    """Whether every buffer the block reads is indexed by its reduction axes (a GEMM's
    operands, not a variance reading the rows and their mean)."""
    reduce_vars = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    return all(
        any(v in reduce_vars for rng in r.region for v in tirx.analysis.undefined_vars(rng.min))
        for r in stmt.reads
    )


def dtype_bits(sch: s_tir.Schedule, block: SBlockRV) -> int:
    """Bit width of what ``block`` writes (32 if it writes nothing)."""
    writes = sch.get(block).writes
    return int(writes[0].source.dtype.bits) if writes else 32


def loop_map(sch: s_tir.Schedule, block: SBlockRV) -> dict | None:
    """Iter var -> loop of ``block`` while its loops are still the plain nest (one per block
    iter, in iter order); None once they are not."""
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    if len(loops) != len(iters):
        return None
    return dict(zip((iv.var for iv in iters), loops, strict=True))


def knob_choices(values, derived) -> tuple:
    """A knob's candidates: the value the rule derives first, then ``values``, no repeats."""
    return tuple(dict.fromkeys([derived, *values]))


def static_extent(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """The loop's extent when it is a constant, else None."""
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def nest_flops(sch: s_tir.Schedule, loops) -> float | None:
    """``2 x`` the iterations of a multiply-accumulate loop nest (None if any is symbolic)."""
    extents = [static_extent(sch, lp) for lp in loops]
    return None if None in extents else 2.0 * math.prod(extents)


def buffer_nbytes(buf: tirx.Buffer) -> int | None:
    """Bytes of a buffer of static shape, None when symbolic."""
    dims = [static_int(d) for d in buf.shape]
    return None if None in dims else math.prod(dims) * max(8, int(buf.dtype.bits)) // 8


def static_flops(func: tirx.PrimFunc) -> dict | None:
    """FLOPs by op class of all of ``func``'s blocks (a softmax's polynomial exp included),
    or None when an extent is symbolic."""
    info = analyze_primfunc(func)
    if any(not isinstance(e, (int, tirx.IntImm)) for b in info.blocks for e in b.domain):
        return None
    return info.flops({})


def identity_copy(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` only copies another buffer element for element (same indices)."""
    body = sch.get(block).body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, TensorLoad):
        return False
    src, dst = body.value.indices, body.indices
    return len(src) == len(dst) and all(a.same_as(b) for a, b in zip(src, dst, strict=True))


def inline_spatial(
    sch: s_tir.Schedule,
    keep: tuple[SBlockRV, ...] = (),
    into_reductions: bool = False,
) -> list[SBlockRV]:
    """Inline every spatial root block that can be inlined; return the blocks left.

    Producers are inlined into their consumers first (prologues, epilogue chains), then
    what remains is tried as a reverse inline into its producer. ``keep`` is never inlined.
    A producer feeding a reduction is inlined only with ``into_reductions``, or when it is
    an identity copy (TOPI's zero-width "padding" of a 1 x 1 conv: a whole extra pass over
    the input otherwise): a reduction reads each input element many times, so inlining
    there recomputes the producer.
    """
    keep_stmts = [sch.get(b) for b in keep]

    def kept(b: SBlockRV) -> bool:
        if any(sch.get(b).same_as(k) for k in keep_stmts):
            return True
        if into_reductions or identity_copy(sch, b):
            return False
        return any(not is_spatial(sch, c) for c in sch.get_consumers(b))

    def shares_producer(b: SBlockRV) -> bool:
        # TVM's reverse_compute_inline rewrites a producer that has other consumers into
        # broken IR (the other consumers keep reading the vanished buffer): never ask it to.
        return any(len(sch.get_consumers(p)) > 1 for p in sch.get_producers(b))

    for primitive in (sch.compute_inline, sch.reverse_compute_inline):
        changed = True
        while changed:
            changed = False
            for block in root_blocks(sch):
                if kept(block) or not is_spatial(sch, block):
                    continue
                if primitive == sch.reverse_compute_inline and shares_producer(block):
                    continue
                if not inline_stays_small(sch, block, primitive == sch.compute_inline):
                    continue
                try:
                    primitive(block)
                except ScheduleError:
                    continue
                changed = True
                break
    return root_blocks(sch)


#: Expression nodes an inline may produce. An inline substitutes the producer's value at
#: every load of its buffer and TIR has no shared subexpressions: fast-math polynomials read
#: their argument 10-20 times, so a tanh -> exp -> erf chain inlined into one expression
#: grew to millions of nodes (a random graph compiled for 3 minutes, mostly in LLVM). Above
#: this the producer stays a buffer of its own (in the same kernel).
MAX_INLINED_NODES = 8000
#: Producer nodes an inline may copy beyond the first: a value read k times is written out
#: k times, and LLVM does not win all the copies back. TVM's fast_exp (202 nodes) reads its
#: argument 18 times; a chain of eight fp16 exps (TVM #20342) ran 14.1 us with each exp
#: inlined into the next, 9.0 us with each a pass of its own in the same kernel (znver4).
MAX_DUPLICATED_NODES = 1000


_EXPR_FIELDS = ("value", "a", "b", "args", "condition", "true_value", "false_value", "body",
                "seq", "then_case", "else_case", "block")
_CHILD_FIELDS = (*_EXPR_FIELDS, "indices")


def _walk(node, fields: tuple = _CHILD_FIELDS, prune=None):
    """Every expression / statement node of the tree under ``node`` (depth first), through
    ``fields``; a node for which ``prune`` is true is yielded but not entered."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if not isinstance(cur, (tirx.Stmt, tvm.ir.expr.Expr)):
            continue
        yield cur
        if prune is not None and prune(cur):
            continue
        for field in fields:
            child = getattr(cur, field, None)
            if isinstance(child, Sequence):
                stack.extend(child)
            elif child is not None:
                stack.append(child)


def expr_nodes(node, limit: int = MAX_INLINED_NODES + 1) -> int:
    """Nodes of the expression/statement tree under ``node``, counted up to ``limit``."""
    count = 0
    for _ in _walk(node):
        count += 1
        if count >= limit:
            break
    return count


def _loads_of(node, buffer) -> int:
    """Loads of ``buffer`` in the tree under ``node``."""
    return sum(1 for cur in _walk(node)
               if isinstance(cur, TensorLoad) and cur.source.same_as(buffer))


def inline_stays_small(sch: s_tir.Schedule, block: SBlockRV, forward: bool) -> bool:
    """Whether inlining ``block`` (into its consumers when ``forward``, else its consumer
    body into its producer) keeps every resulting expression within MAX_INLINED_NODES and
    copies the producer's value at most MAX_DUPLICATED_NODES nodes beyond its first use."""
    producers, consumers = ([block], sch.get_consumers(block)) if forward else (
        sch.get_producers(block), [block])
    bodies = [sch.get(c).body for c in consumers]
    sizes = [expr_nodes(body) for body in bodies]
    for producer in producers:
        pstmt = sch.get(producer)
        if not isinstance(pstmt.body, tirx.BufferStore) or not pstmt.writes:
            continue
        value_size = expr_nodes(pstmt.body.value)
        for body, size in zip(bodies, sizes, strict=True):
            loads = _loads_of(body, pstmt.writes[0].source)
            if size + loads * value_size > MAX_INLINED_NODES or \
                    (loads - 1) * value_size > MAX_DUPLICATED_NODES:
                return False
    return True


#: Intrinsics LLVM expands lane by lane with extra shuffles: a whole-tensor vectorised loop
#: calling them measured 1.85x slower than the scalar loop (erf, 128x768 fp32, znver4). In
#: a register-tiled epilogue (matmul, conv) the vector form measured slightly faster.
SCALAR_BETTER_INTRINSICS = frozenset({"tirx.erf"})
#: Intrinsics TVM's LLVM codegen cannot lower in vector form ("unknown intrinsic").
NO_VECTOR_LOWERING = frozenset({"tirx.cosh", "tirx.sinh"})


def _calls(node, names: frozenset) -> bool:
    """Whether the expression/statement tree under ``node`` calls an op in ``names``."""
    return count_calls(node, names, first=True) > 0


def count_calls(node, names: frozenset, first: bool = False) -> int:
    """Calls of ops in ``names`` in the tree under ``node``, a call inside another counted
    once (stops at the first with ``first``); buffer indices are not searched."""

    def named(expr) -> bool:
        return isinstance(expr, tvm.ir.expr.Call) and getattr(expr.op, "name", "") in names

    total = 0
    for cur in _walk(node, _EXPR_FIELDS, prune=named):
        if named(cur):
            total += 1
            if first:
                break
    return total


#: Intrinsics too costly to recompute: a producer calling them is not inlined into an
#: operand that is read many times (A of a matmul is read N / nr times per element).
EXPENSIVE_INTRINSICS = frozenset(
    {"tirx.exp", "tirx.erf", "tirx.tanh", "tirx.sigmoid", "tirx.log", "tirx.pow", "tirx.sqrt",
     "tirx.rsqrt", "tirx.exp2", "tirx.log2", "tirx.cosh", "tirx.sinh"}
)


#: Expression nodes of a block still cheap to recompute: casts, bias, BN scale, clips are
#: under 30; a fast-math polynomial (exp, erf, tanh without libm calls) is over 100.
CHEAP_MAX_NODES = 64


def is_cheap(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` is cheap to recompute (copies, casts, arithmetic)."""
    body = sch.get(block).body
    return expr_nodes(body, CHEAP_MAX_NODES + 1) <= CHEAP_MAX_NODES and not _calls(
        body, EXPENSIVE_INTRINSICS)


def vector_friendly(sch: s_tir.Schedule, block: SBlockRV, tiled: bool = False) -> bool:
    """Whether ``block``'s innermost loop may be vectorised, and pays off.

    Never for intrinsics without a vector lowering; for a whole-tensor loop (not ``tiled``)
    also not for intrinsics LLVM expands lane by lane.
    """
    avoid = NO_VECTOR_LOWERING if tiled else NO_VECTOR_LOWERING | SCALAR_BETTER_INTRINSICS
    return not _calls(sch.get(block).body, avoid)


def row_vector_width(extent: int | None, max_lanes: int) -> int:
    """Lanes of the vector a spatial row longer than one register is split into: the widest
    dividing it (no tail) while that is at least 4, else a full register and a tail."""
    width = pick_vector_width(extent, max_lanes)
    return width if width >= 4 else max_lanes


def pick_vector_width(extent: int | None, max_lanes: int) -> int:
    """Widest power-of-two vector (<= ``max_lanes``) that divides ``extent``; 1 if none."""
    if extent is None:
        return max_lanes
    width = max_lanes
    while width > 1 and extent % width:
        width //= 2
    return width


def parallel_vectorize(
    sch: s_tir.Schedule,
    block: SBlockRV,
    hw: HardwareSpec,
    *,
    parallel: bool = True,
    loops: list[LoopRV] | None = None,
) -> None:
    """Shape the (spatial) loops of ``block``: parallel outer, vectorized innermost.

    Only the innermost loop is vectorised, at the widest SIMD width dividing it (no scalar
    tail), else at full width with a predicated tail. Loops are never fused *into* the
    vector: a vector lane crossing a row boundary turns every index into a vector div/mod
    (measured 100x slower on a padded 58-wide row). Everything outside the vector loop
    becomes one parallel loop when the block is big enough to pay for the thread pool.
    """
    loops = list(sch.get_loops(block)) if loops is None else list(loops)
    if not loops:
        return
    max_lanes = lanes(hw, dtype_bits(sch, block))
    extents = [static_extent(sch, lp) for lp in loops]
    inner, extent = loops[-1], extents[-1]
    outer_loops = loops[:-1]
    vec, width = None, max_lanes
    if extent is None or extent > max_lanes:
        width = row_vector_width(extent, max_lanes)
        outer, vec = sch.split(inner, [None, width])
        if not outer_loops or (None not in extents and spatial_chunks(hw, extents, width)
                               > math.prod(extents[:-1])):
            outer_loops = [*outer_loops, outer]  # the row's vectors join the parallel loop
    elif extent >= 4:
        vec = inner
    if parallel and outer_loops and _spatial_pays(sch, block, hw, extents, width):
        outer_loops = outer_loops[:_parallel_prefix(sch, outer_loops, hw)]
        par = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
        with contextlib.suppress(ScheduleError):
            sch.parallel(par)
    if vec is not None and vector_friendly(sch, block):
        with contextlib.suppress(ScheduleError):
            sch.vectorize(vec)


#: Iterations per thread the parallel loop of a spatial nest needs for balance; the loops
#: inside it stay serial.
SPATIAL_TASKS_PER_THREAD = 16


def _parallel_prefix(sch: s_tir.Schedule, outer: list[LoopRV], hw: HardwareSpec) -> int:
    """How many of the ``outer`` loops (outermost first) the parallel loop fuses: the
    fewest giving every thread :data:`SPATIAL_TASKS_PER_THREAD` iterations. The loops
    inside stay serial and step their indices by increments: fused into the parallel
    loop, every vector recomputed its indices by division (MixNet's padded 12 x 114 x 114
    x 8c prologue: some 40 integer ops per 8-lane vector, 156K iterations)."""
    target = SPATIAL_TASKS_PER_THREAD * max(1, hw.num_cores)
    total = 1
    for k, loop in enumerate(outer):
        extent = static_extent(sch, loop)
        if extent is None:
            return len(outer)
        total *= extent
        if total >= target:
            return k + 1
    return len(outer)


def _transposed_axis(read, inner, extents: dict) -> tuple | None:
    """``(v, tile)`` when ``read`` is a transposed read of a spatial block whose innermost
    iterator is ``inner``: ``inner`` indexes one of its outer axes (the vector strides
    through it) while its innermost, contiguous axis is indexed by another iterator ``v``
    alone (a transpose: tiles of ``lanes`` x ``lanes``) or by ``v % b`` (a channel block
    of ``NCHW[b]c`` read back to ``NCHW``: tiles of ``b``)."""
    if len(read.region) < 2:
        return None
    last = read.region[-1].min
    if any(x.same_as(inner) for x in tirx.analysis.undefined_vars(last)):
        return None
    if not any(any(x.same_as(inner) for x in tirx.analysis.undefined_vars(r.min))
               for r in read.region[:-1]):
        return None
    if isinstance(last, tirx.FloorMod) and isinstance(last.b, tirx.IntImm):
        var, tile = last.a, int(last.b.value)
    else:
        var, tile = last, None
    if not isinstance(var, tirx.Var) or var not in extents:
        return None
    return var, tile


def tile_transpose(sch: s_tir.Schedule, block: SBlockRV, hw: HardwareSpec) -> bool:
    """Schedule a spatial block that reads an input transposed as tiles; False (nothing
    changed) when it does not.

    The vector runs along the output's innermost axis, a stride through the transposed
    input: row after row the same input lines are re-read from L2 (an ``NCHW16c -> NCHW``
    conversion of 64 x 56 x 56 touched every 64-byte line 16 times, 144 us). The axis that
    indexes the input's contiguous run is split into tiles and moved inside the output's
    vectors, so a tile of input lines is used whole while it sits in L1.
    """
    loop_of = loop_map(sch, block)
    if loop_of is None:
        return False
    stmt = sch.get(block)
    iters = [iv.var for iv in stmt.iter_vars]
    ext = {v: static_extent(sch, loop_of[v]) for v in iters}
    if len(iters) < 2 or None in ext.values():
        return False
    inner = iters[-1]
    width = pick_vector_width(ext[inner], lanes(hw, dtype_bits(sch, block)))
    found = [t for t in (_transposed_axis(r, inner, ext) for r in stmt.reads) if t is not None]
    if width < 4 or len(found) != 1 or not vector_friendly(sch, block):
        return False
    var, tile = found[0]
    tile = tile or width
    if var.same_as(inner) or ext[var] % tile or ext[var] <= tile:
        return False
    extents = [ext[v] for v in iters]
    v_out, v_in = sch.split(loop_of[var], [None, tile])
    w_out, w_vec = sch.split(loop_of[inner], [None, width])
    outer = [v_out if v.same_as(var) else loop_of[v] for v in iters[:-1]] + [w_out]
    sch.reorder(*outer, v_in, w_vec)
    if _spatial_pays(sch, block, hw, extents, width):
        sch.parallel(sch.fuse(*outer))
    sch.vectorize(w_vec)
    return True


def _spatial_pays(
    sch: s_tir.Schedule, block: SBlockRV, hw: HardwareSpec, extents: list[int | None],
    width: int,
) -> bool:
    """Whether the outer loops of the spatial nest ``block`` (loop ``extents``) run in
    parallel: its serial time (elements, bytes moved, transcendental calls) against the
    thread pool's fork/join (:func:`parallel.parallel_pays`)."""
    if None in extents:
        return parallel_pays(hw, None)
    elements = math.prod(extents)
    stmt = sch.get(block)
    moved = 0.0
    for region in (*stmt.reads, *stmt.writes):
        buf = region.source
        shape = [int(d.value) if isinstance(d, tirx.IntImm) else None for d in buf.shape]
        size = elements if None in shape else min(math.prod(shape), elements)
        moved += size * buf.dtype.bits / 8
    calls = count_calls(stmt.body, EXPENSIVE_INTRINSICS)
    chunks = spatial_chunks(hw, extents, width)
    work = elementwise_seconds(hw, elements, moved / max(1, elements), calls)
    return parallel_pays(hw, work, chunks)


def epilogue_at(sch: s_tir.Schedule, acc, loop, vec: int, hw: HardwareSpec) -> None:
    """Compute the consumers of the accumulator tile under ``loop``, in dataflow order."""
    frontier = list(sch.get_consumers(acc))
    rank = len(sch.get(acc).writes[0].region)
    while frontier:
        block = frontier.pop(0)
        writes = sch.get(block).writes
        if len(writes) != 1 or len(writes[0].region) != rank:
            # A layout change (to/from NCHW[b]c) reads the tile permuted: computed per tile
            # it read channels the tile had not finished (MobileNetV2, wrong results).
            parallel_vectorize(sch, block, hw)
            frontier.extend(sch.get_consumers(block))
            continue
        try:
            sch.reverse_compute_at(block, loop, preserve_unit_loops=True)
        except ScheduleError:
            parallel_vectorize(sch, block, hw)
            continue
        if not vector_friendly(sch, block, tiled=True):
            frontier.extend(sch.get_consumers(block))
            continue
        with contextlib.suppress(ScheduleError):
            inner = sch.get_loops(block)[-1]
            extent = static_extent(sch, inner)
            if extent is not None and extent <= vec:
                sch.vectorize(inner)
            else:
                sch.vectorize(sch.split(inner, [None, vec])[1])
        frontier.extend(sch.get_consumers(block))
