"""An analytical FPGA (HLS) cost model: cycles, DSP and BRAM of one dataflow process.

On an FPGA every group becomes one process of a ``DATAFLOW`` region; groups hand
tensors to each other through on-chip FIFOs, so fusion does not save DRAM traffic as on
a CPU. What it saves is the hand-off itself (a process reading a whole tensor into a
local buffer, or writing one out, costs one cycle per element) and the FIFO between the
processes; what it costs is on-chip memory for the intermediates kept inside the group.

For one group the model prices each loop nest (a TIR block and its loops) as a
pipelined loop::

    cycles = ceil(trips / unroll) * II + depth

with ``II`` 1, or the adder latency when the innermost loop carries a floating-point
accumulation (the schedule moves a wide enough spatial loop innermost to avoid it), and
``depth`` the pipeline latency of the operations in the body. DSP use
is the multiplies and adds of the body times the unroll factor (fp32 mul ~3 DSP, add ~2;
fixed-point mul 1, adds in LUTs). BRAM counts 18 Kb blocks of the on-chip buffers and
of the weights kept as ROM; weights that do not fit go off chip and are read at the
board's DDR bandwidth. A group whose DSP or BRAM exceeds the board (at unroll 1, with
its weights off chip) is infeasible, so the search never proposes it. Unroll factors are
then raised, largest nest first, while the group stays within its share of the DSPs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ...cost_models.base import Cost, CostModel, register_cost_model
from ...graph import FusionGraph, PatternKind
from ...hardware import HardwareSpec
from ...legality import classify
from ...ops import OpClass

#: DSP slices per operator instance: (fp32, fixed point).
DSP_PER_OP = {
    "mul": (3, 1),
    "add": (2, 0),
    "div": (0, 0),  # LUT-based dividers
    "cmp": (0, 0),
    "transcendental": (7, 2),
}
#: Pipeline latency (cycles) of one operator: (fp32, fixed point).
LATENCY = {"mul": (4, 1), "add": (5, 1), "div": (12, 8), "cmp": (1, 1),
           "transcendental": (20, 6)}
#: Bits of one BRAM18K block and the widths it can be configured at (depth x width).
BRAM_BITS = 18 * 1024
#: Arrays with at most this many bits live in LUTRAM / registers, not BRAM.
LUTRAM_MAX_BITS = 1024
#: Cycles of fixed overhead per process (start / done handshake, loop entry).
PROCESS_OVERHEAD = 8
MAX_UNROLL = 64


@dataclass(frozen=True)
class FpgaConfig:
    """Options of the FPGA model.

    Attributes
    ----------
    fixed_bits : int or None
        Width of the fixed-point data type (None: fp32).
    dsp_share : float
        Fraction of the board's DSPs one group may use when its unroll is chosen (the
        whole design must fit, so a group may not take the board for itself).
    bram_share : float
        Fraction of the board's BRAM one group may use for buffers and ROM weights.
    max_unroll : int
        Largest unroll factor considered.
    """

    fixed_bits: int | None = None
    dsp_share: float = 0.25
    bram_share: float = 0.9
    max_unroll: int = MAX_UNROLL

    @property
    def bits(self) -> int:
        """Bits of one data element."""
        return self.fixed_bits or 32


@dataclass
class NestCost:
    """One pipelined loop nest of a group."""

    name: str
    trips: float
    inner_extent: int
    ops: dict[str, float]  # operator instances per iteration, by DSP_PER_OP key
    accumulates: bool  # innermost loop carries a reduction
    stream_bound: bool = False  # reads / writes a stream each iteration: no unroll
    # an accumulation carried by an outer loop: the same element comes back every
    # inner_extent / unroll iterations, which must cover the adder latency for II = 1
    recurrence: bool = False
    unroll: int = 1
    ii: int = 1
    depth: int = 1
    cycles: float = 0.0
    dsp: float = 0.0


@dataclass
class GroupResources:
    """Estimate of one group as a dataflow process."""

    name: str
    nests: list[NestCost]
    io_cycles: float  # stream read-in / write-out loops
    bram_buffers: int  # 18K blocks of intermediates and stream buffers
    bram_rom: int  # 18K blocks of on-chip weights
    offchip_bytes: float  # weights read from DDR
    offchip_s: float
    clock_hz: float
    notes: list[str] = field(default_factory=list)

    @property
    def compute_cycles(self) -> float:
        """Cycles of the loop nests."""
        return sum(n.cycles for n in self.nests)

    @property
    def cycles(self) -> float:
        """Cycles of one run of the process, off-chip reads included."""
        return (PROCESS_OVERHEAD + self.io_cycles + self.compute_cycles
                + self.offchip_s * self.clock_hz)

    @property
    def dsp(self) -> float:
        """DSP slices."""
        return sum(n.dsp for n in self.nests)

    @property
    def bram(self) -> int:
        """BRAM18K blocks."""
        return self.bram_buffers + self.bram_rom

    @property
    def ii(self) -> int:
        """Worst initiation interval of its nests."""
        return max((n.ii for n in self.nests), default=1)


# --------------------------------------------------------------------------- pricing
def bram_blocks(elems: float, bits: int, partition: int = 1) -> int:
    """BRAM18K blocks for an array of ``elems`` elements of ``bits`` bits in ``partition`` banks.

    A block is 1024 x 18 or 512 x 36 (wider words take several blocks side by side);
    small arrays go to LUTRAM.
    """
    if elems <= 0 or elems * bits <= LUTRAM_MAX_BITS:
        return 0
    partition = max(1, int(partition))
    depth = math.ceil(elems / partition)
    if depth * bits <= LUTRAM_MAX_BITS:
        return 0
    if bits <= 18:
        per_bank = math.ceil(depth / 1024) * math.ceil(bits / 18)
    else:
        per_bank = math.ceil(depth / 512) * math.ceil(bits / 36)
    return per_bank * partition


def price_nest(nest: NestCost, fixed: bool, unroll: int | None = None) -> NestCost:
    """Cycles, II, depth and DSP of ``nest`` at ``unroll`` (its own when None)."""
    u = max(1, int(unroll or nest.unroll))
    col = 1 if fixed else 0
    dsp = sum(DSP_PER_OP[k][col] * v for k, v in nest.ops.items()) * u
    depth = 2 + sum(LATENCY[k][col] for k, v in nest.ops.items() if v)
    # An unrolled reduction adds through a tree of log2(u) adders.
    if nest.accumulates and u > 1:
        depth += int(math.log2(u)) * LATENCY["add"][col]
    ii = 1
    if nest.accumulates and not fixed:
        ii = LATENCY["add"][col]
    elif nest.recurrence and not fixed:
        ii = max(1, math.ceil(LATENCY["add"][col] * u / max(1, nest.inner_extent)))
    cycles = math.ceil(nest.trips / u) * ii + depth
    return replace(nest, unroll=u, ii=ii, depth=depth, cycles=float(cycles), dsp=float(dsp))


def _valid_unrolls(extent: int, max_unroll: int) -> list[int]:
    """Powers of two dividing ``extent``, and ``extent`` itself (complete unroll)."""
    cands = {u for u in (2 ** k for k in range(1, 12)) if u <= max_unroll and extent % u == 0}
    if 1 < extent <= max_unroll:
        cands.add(extent)
    return sorted(cands)


def choose_unroll(nests: list[NestCost], fixed: bool, dsp_budget: float,
                  max_unroll: int = MAX_UNROLL) -> list[NestCost]:
    """Raise unroll factors (powers of two dividing the innermost extent), slowest nest
    first, while the total DSP stays within ``dsp_budget``."""
    nests = [price_nest(n, fixed, 1) for n in nests]
    while True:
        total = sum(n.dsp for n in nests)
        best = None
        for i in sorted(range(len(nests)), key=lambda k: -nests[k].cycles):
            n = nests[i]
            if n.stream_bound:
                continue
            # the next factor that helps (II may grow with the unroll, so not always the next)
            for u in (u for u in _valid_unrolls(n.inner_extent, max_unroll) if u > n.unroll):
                cand = price_nest(n, fixed, u)
                if total - n.dsp + cand.dsp > dsp_budget:
                    break
                if cand.cycles < n.cycles:
                    best = (i, cand)
                    break
            if best is not None:
                break
        if best is None:
            return nests
        nests[best[0]] = best[1]


def interchange_pays(nest: NestCost, spatial_extent: int, fixed: bool,
                     dsp_budget: float, max_unroll: int = MAX_UNROLL) -> bool:
    """Whether moving a spatial loop of ``spatial_extent`` inside the reduction beats
    keeping the reduction innermost (each at its best unroll under ``dsp_budget``)."""
    if fixed or not nest.accumulates or spatial_extent < 2:
        return False
    moved = replace(nest, inner_extent=spatial_extent, accumulates=False, recurrence=True)
    (a,) = choose_unroll([nest], fixed, dsp_budget, max_unroll)
    (b,) = choose_unroll([moved], fixed, dsp_budget, max_unroll)
    return b.cycles < a.cycles


# ------------------------------------------------------------------ graph-level model
def _ops_of_block(block, contraction: bool) -> dict[str, float]:
    ops: dict[str, float] = {}
    ew = float(block.ops.get(OpClass.ELEMENTWISE, 0))
    tr = float(block.ops.get(OpClass.TRANSCENDENTAL, 0))
    if contraction:
        ops["mul"], ops["add"] = 1.0, 1.0
        ew = max(0.0, ew - 2)
    # Without the operator mix, count half of the other operators as adds, the rest as
    # comparisons (max / select / compare dominate non-contraction blocks).
    if ew:
        ops["add"] = ops.get("add", 0.0) + ew / 2
        ops["cmp"] = ops.get("cmp", 0.0) + ew / 2
    if tr:
        ops["transcendental"] = tr
    return ops


def _elems(shape, dims) -> float:
    from ...tir_analysis import shape_elems

    return shape_elems(shape, dims)


def estimate_group(graph: FusionGraph, group: Iterable[int], hw: HardwareSpec,
                   config: FpgaConfig) -> GroupResources:
    """Resources and cycles of ``group`` as one dataflow process (from the graph)."""
    dims = graph.dims
    members = sorted(group)
    fixed = config.fixed_bits is not None
    bits = config.bits
    fpga = hw.fpga
    nests: list[NestCost] = []
    inlined_ops: dict[int, dict[str, float]] = {}
    buffers = 0
    io_cycles = 0.0
    # Elementwise members read only inside the group are inlined into their consumers:
    # their operators join the consumer's pipeline, they need no buffer and no cycles.
    for n in reversed(members):
        node = graph.nodes[n]
        t = graph.tensors[node.outputs[0]]
        inside = [c for c in t.consumers if c in group]
        external = t.escapes or not t.consumers or any(c not in group for c in t.consumers)
        ew = node.pattern <= PatternKind.INJECTIVE and not node.is_reduction \
            and not node.is_contraction
        ops: dict[str, float] = {}
        for b in node.info.blocks if node.info is not None else []:
            for k, v in _ops_of_block(b, b.is_contraction).items():
                ops[k] = ops.get(k, 0.0) + v
        if inside and ew and not external:
            inlined_ops[n] = ops
            continue
        for b in node.info.blocks if node.info is not None else []:
            nest_ops = _ops_of_block(b, b.is_contraction)
            for p in graph.preds[n]:
                if p in inlined_ops:
                    for k, v in inlined_ops[p].items():
                        nest_ops[k] = nest_ops.get(k, 0.0) + v
            from ...tir_analysis import evaluate

            trips = _elems(b.domain, dims)
            inner = int(evaluate(b.domain[-1], dims)) if b.domain else 1
            streamed = external and not (node.is_reduction or node.is_contraction)
            nest = NestCost(f"{node.name}.{b.name}", trips, inner, nest_ops,
                            accumulates=b.num_reduce_axes > 0, stream_bound=streamed)
            spatial = [int(evaluate(d, dims))
                       for d in b.domain[:len(b.domain) - b.num_reduce_axes]]
            # the schedule moves the last spatial loop innermost when that is faster
            if spatial and interchange_pays(nest, spatial[-1], fixed,
                                            fpga.dsp * config.dsp_share, config.max_unroll):
                nest = replace(nest, inner_extent=spatial[-1], accumulates=False,
                               recurrence=True)
            nests.append(nest)
        if inside and not external:
            buffers += bram_blocks(graph.tensors[node.outputs[0]].nbytes(dims) * 8 / 32, bits)
    # Stream hand-off: inputs read by a contraction / reduction are buffered first
    # (random access), outputs of a reduction are buffered before being written out.
    weights: list[float] = []
    seen: set[int] = set()
    for n in members:
        node = graph.nodes[n]
        for tid in node.inputs:
            t = graph.tensors[tid]
            if tid in seen or t.producer in group:
                continue
            seen.add(tid)
            elems = _elems(t.shape, dims)
            if t.is_constant:
                weights.append(elems)
            elif node.is_contraction or node.is_reduction or len(t.consumers) > 1:
                io_cycles += elems
                buffers += bram_blocks(elems, bits)
        t = graph.tensors[node.outputs[0]]
        external = t.escapes or not t.consumers or any(c not in group for c in t.consumers)
        if external and (node.is_contraction or node.is_reduction):
            io_cycles += _elems(t.shape, dims)
            buffers += bram_blocks(_elems(t.shape, dims), bits)
    budget_bram = fpga.bram_18k * config.bram_share
    rom = 0
    offchip = 0.0
    notes = []
    for elems in sorted(weights):
        blocks = bram_blocks(elems, bits)
        if buffers + rom + blocks <= budget_bram:
            rom += blocks
        else:
            offchip += elems * bits / 8
            notes.append(f"{int(elems)}-element weight off chip")
    nests = choose_unroll(nests, fixed, fpga.dsp * config.dsp_share, config.max_unroll)
    name = "+".join(graph.nodes[i].func_name or graph.nodes[i].name for i in members)
    return GroupResources(
        name=name, nests=nests, io_cycles=io_cycles, bram_buffers=buffers, bram_rom=rom,
        offchip_bytes=offchip, offchip_s=offchip / hw.dram.bandwidth_bytes_per_s,
        clock_hz=fpga.clock_hz, notes=notes,
    )


def check_fits(res: GroupResources, hw: HardwareSpec, config: FpgaConfig) -> str:
    """Why ``res`` cannot be built on ``hw`` ('' when it fits)."""
    fpga = hw.fpga
    dsp_min = sum(price_nest(n, config.fixed_bits is not None, 1).dsp for n in res.nests)
    if dsp_min > fpga.dsp:
        return f"needs {dsp_min:.0f} DSP at unroll 1, the board has {fpga.dsp}"
    if res.bram_buffers > fpga.bram_18k * config.bram_share:
        return (f"needs {res.bram_buffers} BRAM18K for on-chip buffers, the board has "
                f"{fpga.bram_18k} ({config.bram_share:.0%} usable by one group)")
    return ""


@register_cost_model("fpga")
class FpgaCostModel(CostModel):
    """Analytical HLS model over the :class:`FpgaResources` of a :class:`HardwareSpec`.

    Parameters
    ----------
    hw : HardwareSpec
        An FPGA spec (``"zcu104"``, ``"u250"``).
    backend : Backend, optional
        The target backend; its ``model_options('fpga')`` (fixed point, budgets) is used
        when it gives an :class:`FpgaConfig`.
    config : FpgaConfig, optional
        Overrides the backend's configuration.
    """

    def __init__(self, hw: HardwareSpec, backend=None, config: FpgaConfig | None = None):
        super().__init__(hw, backend)
        if hw.fpga is None:
            from ...errors import InvalidHardwareSpecError

            raise InvalidHardwareSpecError(
                f"the fpga cost model needs an FPGA hardware spec; '{hw.name}' has no "
                "FpgaResources (use e.g. hw='zcu104')"
            )
        given = self.kernels.model_options(self.name)
        self.config = config or (given if isinstance(given, FpgaConfig) else None) \
            or FpgaConfig()
        self._cache: dict[tuple, Cost] = {}

    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        key = (id(graph), tuple(sorted(graph.dims.items())), group)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._estimate(graph, group)
        return hit

    def _estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        members = sorted(group)
        if len(members) == 1 and graph.nodes[members[0]].info is None:
            return Cost(0.0, reason="barrier (not a kernel)")
        if len(members) == 1 and graph.nodes[members[0]].is_view:
            return Cost(0.0, reason="view (reshape, no kernel)")
        res = estimate_group(graph, group, self.hw, self.config)
        why = check_fits(res, self.hw, self.config)
        time_s = res.cycles / res.clock_hz
        flops = sum(sum(graph.nodes[i].flops(graph.dims).values()) for i in members)
        bram_bytes = res.bram_buffers * BRAM_BITS / 8
        detail = {
            "rule": f"hls.{classify(graph, group).value}",
            "cycles": res.cycles,
            "ii": res.ii,
            "dsp": res.dsp,
            "bram_18k": res.bram,
            "unroll": {n.name: n.unroll for n in res.nests},
            "offchip_bytes": res.offchip_bytes,
        }
        if why:
            return Cost(time_s, dram_bytes=res.offchip_bytes, onchip_bytes=bram_bytes,
                        flops=flops, feasible=False, reason=f"{res.name}: {why}", detail=detail)
        return Cost(
            time_s, dram_bytes=res.offchip_bytes, onchip_bytes=bram_bytes, flops=flops,
            reason=f"{res.cycles:.0f} cycles, {res.dsp:.0f} DSP, {res.bram} BRAM18K",
            detail=detail,
        )
