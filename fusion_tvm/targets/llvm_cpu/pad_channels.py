"""Channel counts no vector-wide block divides computed padded, through chains of convs.

ShuffleNetV2 runs on 58 / 116 channels, GhostNet on 12, 36, 60, 92: no block of 8 or more
lanes divides them, so their convs stay in NCHW (58 channels at 28x28: 52 GFLOP/s) or in
4-lane blocks (116 channels: 93 GFLOP/s on two 16-lane cores, against ~190 in blocks of 16).
As oneDNN and onnxruntime's NCHWc kernels do, the tensors between convs are computed with
their channels padded to a multiple of ``MIN_BLOCK`` (8) instead (:func:`padded_count`):

- a dense or depthwise conv takes a padded input (zeros where it has to be padded here) and
  writes a padded output: its weights get zero filters and zero input channels;
- per-channel elementwise ops (bias, activations, a squeeze-and-excitation scale) run on the
  padded tensor, their per-channel operands padded;
- every other consumer reads a channel slice back to the model's count.

The padded channels hold finite values no result depends on: a dense conv multiplies them
by its zero input channels, and a depthwise conv or an elementwise op keeps them in padded
channels, which a slice drops. So a slice feeding a pad feeding a conv is never built: the
conv reads the padded tensor itself.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...relax_rewrite import conv2d_like, is_nchw_conv, static_shape, visit_functions
from ...tir_expr import equal

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
#: Elementwise ops that keep padded channels finite (zeros in, finite out); ``divide``,
#: ``exp`` and ``sqrt`` are left out (a zero operand would make inf / nan there, and a dense
#: conv's zero weight times inf is nan).
_ELEMENTWISE = frozenset(
    tvm.ir.Op.get(f"relax.{name}")
    for name in ("nn.relu", "clip", "sigmoid", "nn.silu", "tanh", "nn.gelu", "nn.leakyrelu",
                 "negative", "abs", "add", "subtract", "multiply", "maximum", "minimum")
)
#: Narrowest channel block that needs no padding (a block of 8 lanes runs near full rate).
MIN_BLOCK = 8
#: The most the padding may grow a channel count by.
MAX_GROWTH = 1.34


def padded_count(channels: int, lanes: int) -> int | None:
    """The padded channel count for ``channels`` on ``lanes``-wide vectors, None to keep it:
    counts no block of ``MIN_BLOCK`` lanes divides, padded to a multiple of ``MIN_BLOCK``
    when that grows them by at most ``MAX_GROWTH``. (Not to a multiple of ``lanes``: the
    network's block is chosen after, from all its convs; ShuffleNetV2's 58 / 116 channels
    padded to 64 / 128 made it pick 16 lanes and leave its 24-channel stem and max pool in
    NCHW, 8% slower than in blocks of 8.)"""
    if lanes < MIN_BLOCK or channels % MIN_BLOCK == 0:
        return None
    padded = -(-channels // MIN_BLOCK) * MIN_BLOCK
    return padded if padded <= MAX_GROWTH * channels else None


def _padded_like(wide: relax.Expr, call: relax.Call) -> bool:
    """Whether ``wide`` has ``call``'s output shape but for the channel axis (symbolic
    dims compared as expressions)."""
    a, b = wide.ty.shape.values, call.ty.shape.values
    return len(a) == len(b) and all(
        equal(x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if i != 1)


def _pad_axis(x: relax.Expr, rank: int, axis: int, extra: int) -> relax.Expr:
    """``x`` with ``extra`` zeros after its ``axis``; a constant padded here (weights stay
    constants for the layout pass to pack)."""
    if isinstance(x, tvm.ir.GenericConst):
        width = [(0, 0)] * rank
        width[axis] = (0, extra)
        return relax.const(np.pad(x.value.numpy(), width))
    width = [0] * (2 * rank)
    width[2 * axis + 1] = extra
    return relax.op.nn.pad(x, width)


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int):
        super().__init__(mod)
        self.lanes = lanes
        self.slices: dict[relax.Var, tuple[relax.Var, int, int]] = {}
        self.count = 0

    def _wide(self, arg: relax.Expr) -> tuple[relax.Var, int, int] | None:
        """``(padded tensor, channels, padded channels)`` when ``arg`` is our slice of one."""
        while isinstance(arg, relax.Var):
            if arg in self.slices:
                return self.slices[arg]
            arg = self.lookup_binding(arg)
        return None

    def _narrow(self, wide: relax.Var, channels: int, padded: int) -> relax.Var:
        out = self.builder_.emit(relax.op.strided_slice(wide, axes=[1], begin=[0],
                                                        end=[channels]))
        self.slices[out] = (wide, channels, padded)
        return out

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.same_as(_CONV2D):
            new = self._conv(call)
        elif call.op in _ELEMENTWISE:
            new = self._elementwise(call)
        else:
            new = None
        if new is None:
            return call
        self.count += 1
        return new

    def _conv(self, call: relax.Call) -> relax.Expr | None:
        if not is_nchw_conv(call):
            return None
        x, w, y = (static_shape(e) for e in (call.args[0], call.args[1], call))
        if any(s is None or len(s) != 4 for s in (x, w, y)) or not all(
                isinstance(d, int) for d in (x[1], y[1], *w)):
            return None  # batch and image may be symbolic, channels and weights not
        groups = int(call.attrs.groups)
        cin, cout = x[1], y[1]
        depthwise = groups == cin == cout and w[1] == 1
        if groups != 1 and not depthwise:
            return None
        source = self._wide(call.args[0])
        if source is not None and source[1] != cin:
            source = None
        pin = source[2] if source is not None else padded_count(cin, self.lanes)
        pout = pin if depthwise else padded_count(cout, self.lanes)
        if pin is None and pout is None:
            return None
        pin, pout = pin or cin, pout or cout
        if source is not None:
            x = source[0]
        elif pin > cin:
            x = self.builder_.emit(_pad_axis(call.args[0], 4, 1, pin - cin))
        else:
            x = call.args[0]
        w = call.args[1]
        if pout > cout:
            w = _pad_axis(w, 4, 0, pout - cout)
        if not depthwise and pin > cin:
            w = _pad_axis(w, 4, 1, pin - cin)
        if w is not call.args[1] and not isinstance(w, tvm.ir.GenericConst):
            w = self.builder_.emit(w)
        y = self.builder_.emit(conv2d_like(call, x, w, groups=pout if depthwise else 1))
        return self._narrow(y, cout, pout) if pout > cout else y

    def _elementwise(self, call: relax.Call) -> relax.Expr | None:
        wides = [self._wide(a) for a in call.args]
        first = next((w for w in wides if w is not None), None)
        out = static_shape(call)
        if first is None or out is None or len(out) != 4 \
                or not isinstance(out[1], int) or out[1] != first[1]:
            return None
        _, channels, padded = first
        args = []
        for arg, wide in zip(call.args, wides, strict=True):
            if wide is not None:
                if wide[1:] != (channels, padded) or not _padded_like(wide[0], call):
                    return None
                args.append(wide[0])
                continue
            operand = self._per_channel(arg, channels, padded)
            if operand is None:
                return None
            args.append(operand)
        y = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
        return self._narrow(y, channels, padded)

    def _per_channel(self, arg: relax.Expr, channels: int, padded: int) -> relax.Expr | None:
        """``arg`` broadcast per channel against a ``[N, channels, H, W]`` tensor, padded
        with zeros to ``padded`` channels (None when it is not per channel)."""
        if not isinstance(getattr(arg, "ty", None), relax.TensorType):
            return arg  # a scalar attribute (a clip bound)
        shape = static_shape(arg)
        if shape is None or len(shape) > 4:
            return None
        aligned = [1] * (4 - len(shape)) + list(shape)
        if not all(isinstance(d, int) for d in aligned) or aligned[0] != 1 \
                or aligned[1] not in (1, channels) or aligned[2:] != [1, 1]:
            return None
        if aligned[1] == 1:
            return arg
        return self.builder_.emit(_pad_axis(arg, len(shape), len(shape) - 3,
                                            padded - channels))


@tvm.transform.module_pass(opt_level=0, name="PadChannels")
class PadChannels:
    """Compute convs on channel counts no ``MIN_BLOCK``-lane block divides with their
    channels padded to a multiple of ``MIN_BLOCK``, and the per-channel elementwise ops
    between them on the padded tensors (see the module's docstring).

    Parameters
    ----------
    lanes : int
        SIMD lanes for the element type (16 for fp32 on AVX-512); below ``MIN_BLOCK``
        nothing is padded.
    """

    def __init__(self, lanes: int):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Pad every qualifying chain of every Relax function."""
        widen = _Widen(mod, self.lanes)
        out = visit_functions(widen, mod)
        if not widen.count:
            return mod
        return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(out))
