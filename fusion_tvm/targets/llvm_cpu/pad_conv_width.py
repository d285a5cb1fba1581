"""NCHW convs with rows too narrow to vectorise computed on rows padded to a vector multiple.

The NCHW conv template vectorises along the output row; a row of 7, 10 or 14 columns
gives it at most 2-wide vectors, so a depthwise or grouped conv there (MixNet's 9x9
depthwise convs on 90 channels, 14x14) falls to the plain window nest or the fallback:
measured 2.4-3.5 GFLOP/s. Widening the conv's right padding makes it compute a few more
columns (zeros read from the padding it materialises anyway) to a multiple of 4 or 8, and
a slice gives the model's row back.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_rewrite import conv2d_like, is_nchw_conv, rewrite_calls, static_shape
from ._util import pick_vector_width

#: The most extra columns the padding may add (as a share of the row).
MAX_WASTE = 0.34
#: Narrowest vector the conv template takes along a row.
MIN_VECTOR = 4


def padded_width(call: relax.Call, lanes: int) -> int | None:
    """The output row width to compute for ``call``, None to leave it.

    NCHW convs with static shapes whose row the template cannot vectorise (no vector of
    ``MIN_VECTOR`` lanes divides it), unless dense with a lane multiple of output channels
    (the template's channel-vector kernel takes those).
    """
    if not is_nchw_conv(call):
        return None
    y, w = static_shape(call), static_shape(call.args[1])
    if y is None or w is None or len(y) != 4 or not all(isinstance(d, int) for d in y[1:]):
        return None
    channels, width = y[1], y[3]
    if pick_vector_width(width, lanes) >= MIN_VECTOR:
        return None
    if int(call.attrs.groups) == 1 and channels % lanes == 0:
        return None
    for vec in (lanes, MIN_VECTOR):
        padded = -(-width // vec) * vec
        if padded - width <= MAX_WASTE * width:
            return padded
    return None


@tvm.transform.module_pass(opt_level=0, name="PadConvWidth")
class PadConvWidth:
    """Compute narrow-row NCHW convs on rows padded to a vector multiple (then slice).

    Parameters
    ----------
    lanes : int
        SIMD lanes for the element type (16 for fp32 on AVX-512).
    """

    def __init__(self, lanes: int):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every qualifying conv of every Relax function."""
        return rewrite_calls(mod, "relax.nn.conv2d", self._rewrite)

    def _rewrite(self, call: relax.Call, bb: relax.BlockBuilder) -> relax.Expr | None:
        padded = padded_width(call, self.lanes)
        if padded is None:
            return None
        width = static_shape(call)[3]
        top, left, bottom, right = (int(p) for p in call.attrs.padding)
        right += (padded - width) * int(call.attrs.strides[1])
        y = bb.emit(conv2d_like(call, *call.args, padding=[top, left, bottom, right]))
        return relax.op.strided_slice(y, axes=[3], begin=[0], end=[width])
