"""CropConvTaps: drop the kernel taps of a convolution that only ever read zero padding.

A dilated conv whose dilation is not small against its feature map (DeepLab's ASPP: rates
12 / 24 / 36 on a 14x14 map) has taps that fall in the padding for every output position:
they multiply zeros. Cropping the kernel to the taps that read data, with the padding moved
along, gives the same result exactly; at rate 24 on 14x14 the 3x3 conv becomes a 1x1 conv
(9x fewer FLOPs and no 62x62 padded copy of the input). Runs before layout conversion and
``LegalizeOps``; convs with symbolic spatial sizes are left alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_rewrite import conv2d_like, rewrite_calls, static_conv_geometry, tap_outputs


def useful_taps(size: int, out: int, kernel: int, stride: int, dilation: int,
                pad_before: int) -> tuple[int, int] | None:
    """First and last tap along one axis that reads the input for some output position
    (None when none does)."""
    useful = [r for r, (lo, hi) in enumerate(
        tap_outputs(size, out, kernel, stride, dilation, pad_before)) if hi > lo]
    return (useful[0], useful[-1]) if useful else None


def cropped(call: relax.Call) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """``(begin taps, end taps, padding, dilation)`` of the cropped conv, None to keep it."""
    geometry = static_conv_geometry(call)
    if geometry is None:
        return None
    x, w, y, strides, dilation, pad = geometry
    begin, end, before, after, dil = [], [], [], [], []
    for axis in (0, 1):
        taps = useful_taps(x[2 + axis], y[2 + axis], w[2 + axis], strides[axis],
                           dilation[axis], pad[axis])
        if taps is None:
            return None
        r0, r1 = taps
        k = r1 - r0 + 1
        top = pad[axis] - r0 * dilation[axis]
        # the least bottom padding that keeps the output size (a stride leaves slack)
        bottom = max(0, (y[2 + axis] - 1) * strides[axis] + dilation[axis] * (k - 1) + 1
                     - x[2 + axis] - top)
        span = x[2 + axis] + top + bottom - dilation[axis] * (k - 1) - 1
        if top < 0 or span < 0 or span // strides[axis] + 1 != y[2 + axis]:
            return None
        begin.append(r0)
        end.append(r1 + 1)
        before.append(top)
        after.append(bottom)
        dil.append(dilation[axis] if k > 1 else 1)
    if begin == [0, 0] and end == w[2:]:
        return None
    return begin, end, [*before, *after], dil


def _rewrite(call: relax.Call, bb: relax.BlockBuilder) -> relax.Expr | None:
    crop = cropped(call)
    if crop is None:
        return None
    begin, end, padding, dilation = crop
    x, w = call.args
    if isinstance(w, tvm.ir.expr.Constant):  # stays a constant for the weight-folding passes
        weight = relax.const(np.ascontiguousarray(
            w.value.numpy()[:, :, begin[0]:end[0], begin[1]:end[1]]))
    else:
        weight = bb.emit(relax.op.strided_slice(w, axes=[2, 3], begin=begin, end=end))
    return conv2d_like(call, x, weight, padding=padding, dilation=dilation)


@tvm.transform.module_pass(opt_level=0, name="CropConvTaps")
class CropConvTaps:
    """Crop every NCHW conv's kernel to the taps that read its input (see the module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every qualifying conv of every Relax function."""
        return rewrite_calls(mod, "relax.nn.conv2d", _rewrite)
