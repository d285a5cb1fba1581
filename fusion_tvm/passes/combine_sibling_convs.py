"""Sibling (horizontal) fusion of convolutions: convs that read the same tensor become one.

Inception-style branches open with several convolutions of one activation (GoogLeNet's
1x1 reductions, the towers of Inception-v3, a detector's lateral and head 1x1s). When they
agree on everything but their output channels, they are one convolution over the weights
concatenated along the output-channel axis (concatenated once, at compile time), followed
by a channel slice per branch: the activation is read once and one kernel runs instead of
several. Per-channel constant biases added to every branch are concatenated too and added
once, before slicing. Weights may be constant expressions (``FoldBatchnormToConv2D`` leaves
``multiply(W, reshape(gamma / sqrt(var + eps)))``): they are evaluated here, at compile time.

The rule: combine iff the branches' predicted kernel times add up to more than the combined
conv's plus the copies its slices cost (:func:`price_siblings` states every term: launches
and fork/joins, the input read once instead of per branch, each conv's compute at the conv
peak over the channels it really vectorises in the backend's channel layout, and the copies
of slices that are not whole channel blocks or that lead a batch-1 output). It says no
whenever those copies outweigh the launches saved. Runs in the prepare phase, before the
backend's layout passes, so the combined conv is laid out like any other conv.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx

from ..cost_models.roofline import RooflineCostModel, shape_class
from ..hardware import DeviceKind, HardwareSpec, OpClass
from ..legality import FusionDecision
from ..relax_rewrite import static_shape
from ..targets.llvm_cpu.layout import ConvertToNCHWc, channel_block, choose_block
from ..targets.llvm_cpu.parallel import conv_parallel_pays, parallel_pays

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_ADD = tvm.ir.Op.get("relax.add")
#: Ops a constant weight expression may use, evaluated in the weight's own dtype (each one
#: IEEE-rounded like the kernel FoldConstant would build for it).
_FOLDABLE = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.divide": np.divide, "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
}
_RESHAPES = frozenset({"relax.reshape", "relax.expand_dims"})
#: Branch orders tried for the combined conv up to this many branches (binding order above).
MAX_ORDERED_BRANCHES = 5


# ------------------------------------------------------------------------- cost model
@dataclass(frozen=True)
class ConvWork:
    """The sizes a sibling group shares (symbolic sizes priced at 1).

    Attributes
    ----------
    batch, in_channels : int
        Of the shared input.
    in_pixels, out_pixels : int
        Spatial positions of one input / output channel (``H * W``).
    window : int
        Kernel taps per input channel (``kh * kw``; groups are 1).
    itemsize : int
        Bytes per element.
    """

    batch: int
    in_channels: int
    in_pixels: int
    out_pixels: int
    window: int
    itemsize: int = 4

    def flops(self, outs: int) -> float:
        """FLOPs of a conv with ``outs`` output channels."""
        return 2.0 * self.batch * self.out_pixels * outs * self.in_channels * self.window

    def planes(self, channels: int) -> float:
        """Bytes of ``channels`` output channels."""
        return float(self.itemsize * self.batch * channels * self.out_pixels)


@dataclass(frozen=True)
class ChannelLayout:
    """How the backend vectorises conv output channels.

    Attributes
    ----------
    block : int or None
        The network's channel block (``NCHW[block]c``, ``ConvertToNCHWc``); None when convs
        stay NCHW and vectorise along the row (channel counts then cost no padding).
    lanes : int
        SIMD lanes of the conv's element type; a vector of ``v < lanes`` channels (a
        narrower block) costs a full one.
    """

    block: int | None = None
    lanes: int = 1

    def vector_channels(self, channels: int) -> int:
        """Output channels as the blocked conv computes them: ``channels / v`` vectors of
        ``lanes`` lanes, ``v`` the block its output gets (``layout.channel_block``)."""
        if self.block is None:
            return channels
        v = channel_block(channels, self.block)
        return channels if v is None else channels // v * max(v, self.lanes)

    def slices_in_place(self, begin: int, channels: int, total: int) -> bool:
        """Whether the slice ``[begin, begin + channels)`` of the combined conv's
        ``total`` channels is whole blocks of its output (``ConvertToNCHWc`` slices the
        blocked tensor; otherwise it unblocks the whole output first)."""
        b = self.block
        return b is None or (total % b == 0 and begin % b == 0 and channels % b == 0)


@dataclass(frozen=True)
class SiblingCost:
    """Predicted seconds of a sibling group's convs apart and combined.

    Attributes
    ----------
    apart_s, combined_s : float
    order : tuple of int
        Branch indices in the order of the combined conv's channels.
    copies : tuple of str
        What the combined form copies, for the reason (empty when nothing).
    """

    apart_s: float
    combined_s: float
    order: tuple[int, ...]
    copies: tuple[str, ...] = ()

    @property
    def gain_s(self) -> float:
        """Seconds saved by combining (negative: combining is predicted slower)."""
        return self.apart_s - self.combined_s

    def decision(self) -> FusionDecision:
        """Combine iff predicted faster, with the figures as the reason."""
        copies = f"; copies {', '.join(self.copies)}" if self.copies else ""
        why = (f"{self.apart_s * 1e6:.1f} us apart vs {self.combined_s * 1e6:.1f} us "
               f"combined{copies}")
        return FusionDecision(True, why) if self.gain_s > 0 else FusionDecision.forbid(why)


def _kernel_s(hw: HardwareSpec, body_s: float, parallel: bool, launch: bool = True) -> float:
    """A loop nest of ``body_s`` seconds at the whole device's rate: on all cores with a
    fork/join, or on one (a CPU rule leaves it serial), plus a launch if its own kernel."""
    fixed = hw.launch_overhead_s if launch else 0.0
    if hw.kind is not DeviceKind.CPU or hw.num_cores <= 1:
        return fixed + body_s
    return fixed + (body_s + hw.parallel_cost(1) if parallel else body_s * hw.num_cores)


def _conv_s(model: RooflineCostModel, work: ConvWork, layout: ChannelLayout, outs: int,
            written: int) -> float:
    """One conv kernel with ``outs`` output channels writing ``written`` channels:
    ``max(compute over the vectorised channels, input + weight + output traffic)`` at the
    conv rule's efficiency, run in parallel when the LLVM-CPU conv rule would."""
    hw = model.hw
    flops = work.flops(outs)
    compute = work.flops(layout.vector_channels(outs)) / hw.peak_flops[OpClass.CONV]
    traffic = (work.itemsize * work.batch * work.in_channels * work.in_pixels,
               work.itemsize * outs * work.in_channels * work.window, work.planes(written))
    memory = sum(b / model.bandwidth_for(b) for b in traffic)
    eff = model.efficiency("conv2d", shape_class("conv2d", {OpClass.CONV: flops}))
    return _kernel_s(hw, max(compute, memory) / eff, conv_parallel_pays(hw, flops, None))


def _copy_s(model: RooflineCostModel, work: ConvWork, channels: int, launch: bool) -> float:
    """A pass reading and writing ``channels`` output channels (a slice, a layout change)."""
    nbytes = 2 * work.planes(channels)
    body = nbytes / model.bandwidth_for(nbytes) / model.efficiency("elementwise", "copy")
    return _kernel_s(model.hw, body, parallel_pays(model.hw, body * model.hw.num_cores),
                     launch)


def _combined(model: RooflineCostModel, work: ConvWork, layout: ChannelLayout,
              outs: tuple[int, ...], order: tuple[int, ...],
              leading_view: bool) -> tuple[float, tuple[str, ...]]:
    """Seconds and copies of the combined conv with its channels in ``order``."""
    total = sum(outs)
    starts = itertools.accumulate((outs[k] for k in order), initial=0)
    begins = {k: b for k, b in zip(order, starts, strict=False)}
    misaligned = [k for k in order if not layout.slices_in_place(begins[k], outs[k], total)]
    lead = order[0] if leading_view else None
    # Slices in place and not the leading view are the conv's epilogue outputs (its
    # channels written once, as apart); a leading view or an unblocked output also makes
    # the conv write its whole output.
    written = total
    if lead is not None or misaligned:
        written += sum(outs[k] for k in order if k not in misaligned and k != lead)
    seconds = _conv_s(model, work, layout, total, written)
    copies = []
    if misaligned:  # ConvertLayout unblocks the whole output to slice it
        seconds += _copy_s(model, work, total, launch=False)
        copies.append(f"all {total} channels (unblocked to slice)")
    for k in misaligned:
        if k != lead:
            seconds += _copy_s(model, work, outs[k], launch=False)
            copies.append(f"[{begins[k]}:{begins[k] + outs[k]}) (not block-aligned)")
    if lead is not None:  # the copy, and its consumer (not fused across the view)
        seconds += 2 * _copy_s(model, work, outs[lead], launch=True)
        copies.append(f"[0:{outs[lead]}) (two kernels)")
    return seconds, tuple(copies)


def price_siblings(model: RooflineCostModel, work: ConvWork, outs: tuple[int, ...],
                   layout: ChannelLayout = ChannelLayout(),
                   leading_view: bool = False) -> SiblingCost:
    """Predicted time of sibling convs with output channels ``outs`` apart and combined.

    Apart, each conv is a kernel: a launch (and a fork/join when the conv rule runs it in
    parallel, else one core's share of the device), reading the shared input, its weights,
    writing its output, computing over its *vectorised* channels at the conv peak and the
    rule's calibrated efficiency — in a blocked layout a conv whose channels the network
    block does not divide gets a narrower block whose vectors cost full ones (24 channels
    under a 16-block: 3 vectors of 8, priced as 48 channels). Combined, one such kernel
    over ``sum(outs)`` channels, plus what its slices cost:

    - a slice of whole blocks (or any slice in NCHW) is written by the conv itself, as an
      epilogue output: nothing more;
    - when some slice is not whole blocks, the whole output is unblocked (one read and write
      of it) and each such slice copied;
    - with ``leading_view`` (a batch of 1) the first slice is a flat prefix of the output,
      which the fusion graph takes for a free reshape view and leaves out of every group: it
      runs as its own copy kernel, the op reading it as another (the search does not fuse
      across the view: the inception block's 8-channel lead slice and its ReLU measured
      2.1 and 1.8 us), and the conv writes its whole output too.

    The order of the branches in the combined conv is free: every order is tried (up to
    :data:`MAX_ORDERED_BRANCHES` branches), the cheapest kept (the smallest branch leads).

    Parameters
    ----------
    model : RooflineCostModel
        Supplies the hardware spec, efficiencies and the bandwidth of the level holding
        each tensor.
    work : ConvWork
    outs : tuple of int
        Output channels of each branch, in binding order.
    layout : ChannelLayout
    leading_view : bool

    Returns
    -------
    SiblingCost
    """
    apart = sum(_conv_s(model, work, layout, o, o) for o in outs)
    orders = itertools.permutations(range(len(outs))) if len(outs) <= MAX_ORDERED_BRANCHES \
        else [tuple(range(len(outs)))]
    best = None
    for order in orders:
        seconds, copies = _combined(model, work, layout, outs, order, leading_view)
        if best is None or seconds < best[0]:
            best = (seconds, order, copies)
    return SiblingCost(apart, best[0], best[1], best[2])


# -------------------------------------------------------------------------- analysis
@dataclass(frozen=True)
class ConvBranch:
    """One conv of a sibling group.

    Attributes
    ----------
    conv : relax.Var
        The conv2d's binding.
    weight : numpy.ndarray
        Its weight, evaluated at compile time.
    add : relax.Var or None
        The bias add consuming it (the conv's only use), if any.
    bias : numpy.ndarray or None
        That bias as a vector over the conv's output channels.
    """

    conv: relax.Var
    weight: np.ndarray
    add: relax.Var | None = None
    bias: np.ndarray | None = None


@dataclass(frozen=True)
class SiblingConvs:
    """Convs reading the same tensor with the same attributes and kernel size.

    Attributes
    ----------
    call : relax.Call
        The first conv2d (its data and attributes are the group's).
    branches : tuple of ConvBranch
        In binding order; at least two.
    order : tuple of int
        Branch indices in the order of the combined conv's channels (binding order unless
        :func:`plan_combination` chose another).
    """

    call: relax.Call
    branches: tuple[ConvBranch, ...]
    order: tuple[int, ...] = ()

    @property
    def with_bias(self) -> bool:
        """Whether every branch adds a bias (then the biases are concatenated too)."""
        return all(b.add is not None for b in self.branches)

    @property
    def weight_axis(self) -> int:
        """The output-channel axis of the weights (``O`` of the kernel layout)."""
        return str(self.call.attrs.kernel_layout).index("O")

    @property
    def channel_axis(self) -> int:
        """The channel axis of the outputs (``C`` of the out layout)."""
        return _out_layout(self.call).index("C")

    @property
    def outs(self) -> list[int]:
        """Output channels of each branch."""
        return [b.weight.shape[self.weight_axis] for b in self.branches]

    @property
    def channel_order(self) -> tuple[int, ...]:
        """:attr:`order`, binding order when unset."""
        return self.order or tuple(range(len(self.branches)))

    def begin(self, k: int) -> int:
        """First channel of branch ``k`` in the combined conv."""
        order = self.channel_order
        return sum(self.outs[j] for j in order[: order.index(k)])


def _out_layout(call: relax.Call) -> str:
    return str(call.attrs.out_layout or call.attrs.data_layout)


def _dims(expr) -> list[int | None] | None:
    """``expr``'s shape, None for symbolic dims (None when the rank is unknown)."""
    shape = static_shape(expr)
    return None if shape is None else [d if isinstance(d, int) else None for d in shape]


def _plain(layout: str, letters: str) -> bool:
    return len(layout) == len(letters) and sorted(layout) == sorted(letters)


def fold_constant(expr, var2val, depth: int = 0) -> np.ndarray | None:
    """The value of a constant expression (through bindings), computed at compile time in
    its own dtype: Relax constants, scalar immediates, and the elementwise arithmetic,
    square roots and reshapes of ``FoldBatchnormToConv2D``'s folded weights; None for
    anything else (a value known only at run time)."""
    if depth > 16:
        return None
    if isinstance(expr, relax.Var):
        bound = var2val.get(expr)
        return None if bound is None else fold_constant(bound, var2val, depth + 1)
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, (tirx.FloatImm, tirx.IntImm)):
        return np.array(expr.value, dtype=str(expr.ty.dtype))
    if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)):
        return None
    name = expr.op.name
    shape = _dims(expr)
    if (name not in _FOLDABLE and name not in _RESHAPES) or shape is None or None in shape:
        return None
    args = [fold_constant(a, var2val, depth + 1) for a in expr.args
            if not isinstance(a, relax.ShapeExpr)]
    if not args or any(a is None for a in args):
        return None
    if name in _RESHAPES:
        return args[0].reshape(shape)
    dtype = str(expr.ty.dtype)
    value = _FOLDABLE[name](*(a.astype(dtype, copy=False) for a in args))
    return np.broadcast_to(value, shape).astype(dtype, copy=False)


def _weight_key(call: relax.Call) -> tuple | None:
    """What convs must share to be combined, or None for a conv this pass does not handle
    (read from the types: the weight is evaluated only for a group of two or more)."""
    a = call.attrs
    data_layout, kernel_layout, out_layout = (str(a.data_layout), str(a.kernel_layout),
                                              _out_layout(call))
    if int(a.groups) != 1 or not (_plain(data_layout, "NCHW") and _plain(out_layout, "NCHW")
                                  and _plain(kernel_layout, "OIHW")):
        return None
    weight = call.args[1]
    shape = _dims(weight)
    if not isinstance(call.args[0], relax.Var) or not isinstance(call.ty, relax.TensorType) \
            or shape is None or len(shape) != 4 or None in shape:
        return None
    o = kernel_layout.index("O")
    others = tuple(d for k, d in enumerate(shape) if k != o)
    return (call.args[0], tuple(int(s) for s in a.strides), tuple(int(p) for p in a.padding),
            tuple(int(d) for d in a.dilation), data_layout, kernel_layout, out_layout,
            str(a.out_dtype), str(call.ty.dtype), str(weight.ty.dtype), others)


def _bias(call: relax.Call, conv: relax.Var, out_channels: int, channel_axis: int,
          var2val) -> np.ndarray | None:
    """The per-channel bias ``call`` adds to ``conv`` (either operand order), else None."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_ADD)):
        return None
    first = call.args[0].same_as(conv)
    other = call.args[1] if first else call.args[0]
    if other.same_as(conv) or not isinstance(call.ty, relax.TensorType) or \
            call.ty.dtype != conv.ty.dtype:
        return None
    value = fold_constant(other, var2val)
    rank = len(conv.ty.shape.values) if isinstance(conv.ty.shape, relax.ShapeExpr) else None
    if value is None or rank is None or value.ndim > rank:
        return None
    full = (1,) * (rank - value.ndim) + value.shape
    # varies along the output channels only, and adds no dimension to the conv's output
    if any(d != 1 for k, d in enumerate(full) if k != channel_axis) or \
            full[channel_axis] not in (1, out_channels):
        return None
    return np.broadcast_to(value.reshape(-1), (out_channels,))


def _uses(func: relax.Function, var2val) -> dict:
    """Binding vars -> the bindings (None: the function's result) that read them."""
    users: dict = {}

    def add(user, expr):
        relax.analysis.post_order_visit(
            expr, lambda e: users.setdefault(e, []).append(user)
            if isinstance(e, relax.Var) else None)

    for var, val in var2val.items():
        add(var, val)
    add(None, func.body.body if isinstance(func.body, relax.SeqExpr) else func.body)
    return users


def sibling_conv_groups(func: relax.Function) -> list[SiblingConvs]:
    """Every group of two or more combinable conv2ds of ``func`` (whether or not combining
    pays: see :func:`plan_combination`)."""
    if not isinstance(func.body, relax.SeqExpr):
        return []
    var2val = relax.analysis.get_var2val(func)
    users = _uses(func, var2val)
    groups = []
    for block in func.body.blocks:
        found: dict[tuple, list] = {}
        for binding in block.bindings:
            call = getattr(binding, "value", None)
            if not (isinstance(call, relax.Call) and call.op.same_as(_CONV2D)):
                continue
            key = _weight_key(call)
            if key is not None:
                found.setdefault(key, []).append((binding.var, call))
        for members in found.values():
            if len(members) < 2:
                continue
            weights = [fold_constant(c.args[1], var2val) for _v, c in members]
            kept = [(v, c, w) for (v, c), w in zip(members, weights, strict=True)
                    if w is not None]
            if len(kept) < 2:
                continue
            group = SiblingConvs(kept[0][1], tuple(ConvBranch(v, w) for v, _c, w in kept))
            groups.append(_with_biases(group, users, var2val))
    return groups


def _with_biases(group: SiblingConvs, users, var2val) -> SiblingConvs:
    """``group`` with every branch's bias add, when every branch has one."""
    branches = []
    for branch, o in zip(group.branches, group.outs, strict=True):
        uses = users.get(branch.conv, [])
        add = uses[0] if len(uses) == 1 and isinstance(branch.conv, relax.DataflowVar) \
            else None
        bias = None if add is None else _bias(var2val.get(add), branch.conv, o,
                                              group.channel_axis, var2val)
        if bias is None:
            return group
        branches.append(ConvBranch(branch.conv, branch.weight, add, bias))
    return SiblingConvs(group.call, tuple(branches))


def channel_layout(backend, hw: HardwareSpec, mod: tvm.IRModule | None = None) -> ChannelLayout:
    """The channel layout ``backend``'s layout passes give ``mod``'s convs: blocked by
    ``ConvertToNCHWc`` (its block for ``mod``, else its lanes) or NCHW."""
    passes = backend.layout_passes(hw) if backend is not None else []
    blocked = next((p for p in passes if isinstance(p, ConvertToNCHWc) and p.enabled), None)
    if blocked is None:
        return ChannelLayout()
    block = choose_block(mod, blocked.lanes, blocked.full_rate_lanes) if mod is not None \
        else blocked.lanes
    return ChannelLayout(block, blocked.lanes) if block is not None else ChannelLayout()


def plan_combination(model: RooflineCostModel, group: SiblingConvs,
                     layout: ChannelLayout = ChannelLayout()) -> tuple[SiblingConvs,
                                                                       FusionDecision]:
    """``group`` in the branch order :func:`price_siblings` finds cheapest, and whether to
    combine it (symbolic sizes are priced at 1)."""
    call = group.call
    a = call.attrs
    dl, ol, kl = str(a.data_layout), _out_layout(call), str(a.kernel_layout)
    data = dict(zip(dl, _dims(call.args[0]) or [None] * 4, strict=True))
    out = dict(zip(ol, _dims(call) or [None] * 4, strict=True))
    data, out = ({k: 1 if v is None else v for k, v in d.items()} for d in (data, out))
    w = group.branches[0].weight.shape
    work = ConvWork(
        batch=data["N"], in_channels=data["C"], in_pixels=data["H"] * data["W"],
        out_pixels=out["H"] * out["W"], window=w[kl.index("H")] * w[kl.index("W")],
        itemsize=math.ceil(tvm.DataType(str(call.ty.dtype)).bits / 8),
    )
    # The first slice is a flat prefix when every output dim before C is a static 1.
    static = _dims(call)
    leading_view = static is not None and all(d == 1 for d in static[: ol.index("C")])
    if dl != "NCHW":
        layout = ChannelLayout()  # ConvertToNCHWc blocks NCHW convs only
    cost = price_siblings(model, work, tuple(group.outs), layout, leading_view)
    return SiblingConvs(group.call, group.branches, cost.order), cost.decision()


# --------------------------------------------------------------------------- rewrite
@relax.expr_functor.mutator
class _Combiner(relax.PyExprMutator):
    """Emit each group's combined conv (and bias) at its first branch; every branch's conv
    (and add) is rebound to its channel slice. A conv binding whose add now reads the
    combined result is left dead (removed by DCE)."""

    def __init__(self, mod, groups: list[SiblingConvs]):
        super().__init__(mod)
        self.first = {g.branches[0].conv: g for g in groups}
        # var -> (group, branch index, whether it takes the biased result)
        self.slot = {}
        for g in groups:
            for k, b in enumerate(g.branches):
                self.slot[b.conv] = (g, k, False)
                if g.with_bias:
                    self.slot[b.add] = (g, k, True)
        self.combined: dict[int, tuple[relax.Var, relax.Var | None]] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: D102
        slot = self.slot.get(binding.var)
        if slot is None:
            super().visit_var_binding_(binding)
            return
        group, k, biased = slot
        if binding.var in self.first:
            self.combined[id(group)] = self._emit_combined(group)
        conv, added = self.combined[id(group)]
        begin = group.begin(k)
        piece = relax.op.strided_slice(added if biased else conv, axes=[group.channel_axis],
                                       begin=[begin], end=[begin + group.outs[k]],
                                       assume_inbound=True)
        self.builder_.emit_normalized(relax.VarBinding(binding.var,
                                                       self.builder_.normalize(piece)))

    def _emit_combined(self, group: SiblingConvs):
        call = group.call
        a = call.attrs
        order = group.channel_order
        weight = np.concatenate([group.branches[k].weight for k in order],
                                axis=group.weight_axis)
        conv = self.builder_.emit(relax.op.nn.conv2d(
            self.visit_expr(call.args[0]), relax.const(weight), strides=a.strides,
            padding=a.padding, dilation=a.dilation, groups=1, data_layout=a.data_layout,
            kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype,
        ))
        if not group.with_bias:
            return conv, None
        shape = [1] * len(call.ty.shape.values)
        shape[group.channel_axis] = -1
        bias = np.concatenate([group.branches[k].bias for k in order]).reshape(shape)
        return conv, self.builder_.emit(relax.op.add(conv, relax.const(
            bias.astype(str(call.ty.dtype)))))


def combine_sibling_convs(mod: tvm.IRModule, hw: HardwareSpec, backend=None) -> tvm.IRModule:
    """``mod`` with the sibling convs of every non-primitive Relax function combined where
    :func:`plan_combination` predicts a gain on ``hw`` in ``backend``'s layout; functions
    it cannot rewrite are left as they are."""
    model = RooflineCostModel(hw, backend)
    layout = channel_layout(backend, hw, mod)
    changed = False
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or (
            func.attrs is not None and "Primitive" in func.attrs
        ):
            continue
        try:
            plans = [plan_combination(model, g, layout) for g in sibling_conv_groups(func)]
            groups = [g for g, decision in plans if decision]
            if not groups:
                continue
            combiner = _Combiner(mod, groups)
            new = combiner.visit_expr(func)
            rewritten = tvm.IRModule(
                {g: (new if g.same_as(gv) else f) for g, f in mod.functions.items()},
                attrs=mod.attrs, global_infos=mod.global_infos,
            )
            relax.analysis.well_formed(rewritten)  # raises on a violation
        except Exception:  # noqa: BLE001 - an optional rewrite: leave the function as is
            continue
        mod, changed = rewritten, True
    return relax.transform.DeadCodeElimination()(mod) if changed else mod


@tvm.transform.module_pass(opt_level=0, name="CombineSiblingConvs")
class CombineSiblingConvs:
    """Combine conv2ds sharing their input when :func:`plan_combination` predicts a gain.

    Parameters
    ----------
    hw : HardwareSpec
        The device the times are predicted for.
    backend : Backend, optional
        Its layout passes say how conv channels are vectorised (``ConvertToNCHWc``: the
        channel block); its efficiency table prices the kernels. None: NCHW convs and the
        cost model's default efficiencies.
    """

    def __init__(self, hw: HardwareSpec, backend=None):
        self.hw = hw
        self.backend = backend

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every non-primitive Relax function of ``mod``."""
        return combine_sibling_convs(mod, self.hw, self.backend)
