"""Output channels of dense convs padded to a SIMD multiple, so they join the blocked layout.

A conv whose output channel count no channel block divides (179: three sibling heads
combined, 64 + 64 + 51; 117 in RexNet) stays in NCHW, where narrow rows (a 10-wide feature
map) leave only the reduction template: measured 1.6 GFLOP/s against ~200 in ``NCHW[b]c``.
Zero filters up to the next multiple of the SIMD width make it blockable; a channel slice
after it gives the model's tensor back (for combined siblings, the split that follows
already ignores the extra channels).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .layout import MIN_WINDOW_BLOCK, channel_block, static_shape

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
#: The most extra work the padding may add (as a share of the conv's own).
MAX_WASTE = 0.25


def padded_channels(call: relax.Call, lanes: int) -> int | None:
    """The padded output channel count for ``call``, None to leave it.

    Dense (one group) NCHW convs with static shapes whose input channels the SIMD width
    divides (the input is blocked already) and whose output channels no channel block
    divides (not even the narrowest, ``MIN_WINDOW_BLOCK``), when the zero filters add at
    most ``MAX_WASTE`` of the work.
    """
    a = call.attrs
    if (a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or a.out_layout != "NCHW"
            or int(a.groups) != 1):
        return None
    x, w = static_shape(call.args[0]), static_shape(call.args[1])
    if x is None or w is None or len(x) != 4 or not all(isinstance(d, int) for d in w):
        return None
    if not isinstance(x[1], int) or x[1] % lanes or channel_block(w[0], lanes,
                                                                   MIN_WINDOW_BLOCK):
        return None  # a narrower channel block takes it (ShuffleNetV2's 116 channels: 4)
    padded = -(-w[0] // lanes) * lanes
    return padded if padded - w[0] <= MAX_WASTE * w[0] else None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int):
        super().__init__(mod)
        self.lanes = lanes
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CONV2D)):
            return call
        padded = padded_channels(call, self.lanes)
        if padded is None:
            return call
        x, w = call.args
        f = static_shape(w)[0]
        a = call.attrs
        weight = self.builder_.emit(
            relax.op.nn.pad(w, [0, padded - f, 0, 0, 0, 0, 0, 0]))
        y = self.builder_.emit(relax.op.nn.conv2d(
            x, weight, strides=a.strides, padding=a.padding, dilation=a.dilation,
            groups=int(a.groups), data_layout="NCHW", kernel_layout="OIHW",
            out_layout="NCHW", out_dtype=a.out_dtype))
        self.count += 1
        return relax.op.strided_slice(y, axes=[1], begin=[0], end=[f])


@tvm.transform.module_pass(opt_level=0, name="PadConvChannels")
class PadConvChannels:
    """Pad dense convs' output channels to a multiple of ``lanes`` (zero filters, then a
    slice back to the model's channels).

    Parameters
    ----------
    lanes : int
        SIMD lanes for the element type (16 for fp32 on AVX-512): the widest channel block.
    """

    def __init__(self, lanes: int):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Pad every qualifying conv of every Relax function."""
        rewriter = _Rewriter(mod, self.lanes)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        if not rewriter.count:
            return mod
        return relax.transform.CanonicalizeBindings()(rewriter.builder_.get())
