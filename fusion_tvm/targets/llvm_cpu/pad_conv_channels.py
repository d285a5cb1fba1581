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

from ...relax_rewrite import conv2d_like, is_nchw_conv, rewrite_calls, static_shape
from .layout import MIN_WINDOW_BLOCK, channel_block

#: The most extra work the padding may add (as a share of the conv's own).
MAX_WASTE = 0.25


def padded_channels(call: relax.Call, lanes: int) -> int | None:
    """The padded output channel count for ``call``, None to leave it.

    Dense (one group) NCHW convs with static shapes whose input channels the SIMD width
    divides (the input is blocked already) and whose output channels no channel block
    divides (not even the narrowest, ``MIN_WINDOW_BLOCK``), when the zero filters add at
    most ``MAX_WASTE`` of the work.
    """
    if not is_nchw_conv(call) or int(call.attrs.groups) != 1:
        return None
    x, w = static_shape(call.args[0]), static_shape(call.args[1])
    if x is None or w is None or len(x) != 4 or not all(isinstance(d, int) for d in w):
        return None
    if not isinstance(x[1], int) or x[1] % lanes or channel_block(w[0], lanes,
                                                                   MIN_WINDOW_BLOCK):
        return None  # a narrower channel block takes it (ShuffleNetV2's 116 channels: 4)
    padded = -(-w[0] // lanes) * lanes
    return padded if padded - w[0] <= MAX_WASTE * w[0] else None


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
        return rewrite_calls(mod, "relax.nn.conv2d", self._rewrite, canonicalize=True)

    def _rewrite(self, call: relax.Call, bb: relax.BlockBuilder) -> relax.Expr | None:
        padded = padded_channels(call, self.lanes)
        if padded is None:
            return None
        x, w = call.args
        f = static_shape(w)[0]
        weight = bb.emit(relax.op.nn.pad(w, [0, padded - f, 0, 0, 0, 0, 0, 0]))
        y = bb.emit(conv2d_like(call, x, weight))
        return relax.op.strided_slice(y, axes=[1], begin=[0], end=[f])
