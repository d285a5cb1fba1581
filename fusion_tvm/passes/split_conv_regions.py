"""SplitConvRegions: a conv whose taps mostly read zero padding, split by output region.

A dilated conv whose dilation is large against its feature map reads the padding with most
of its taps for most output positions (DeepLabV3's ASPP, rate 12 on a 14x14 map: the outer
taps reach data from 2 of 14 rows and columns, 82% of the MACs multiply zeros). The output
splits into bands per axis where the same taps read data (rows 0-1: centre and lower tap;
2-11: centre only; 12-13: upper and centre), and each region into one conv of exactly those
taps over the input it reads, without padding; the regions are concatenated back. Runs after
:class:`~fusion_tvm.passes.crop_conv_taps.CropConvTaps` (which drops taps that read padding
for every output) and before layout conversion; static NCHW convs only.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_rewrite import (
    ConvGeometry,
    conv2d_like,
    rewrite_calls,
    static_conv_geometry,
    tap_outputs,
)

#: Split only where the taps that read data are at most this share of the conv's MACs
#: (the rest of its time are the extra kernels and the concatenation).
MAX_USEFUL_SHARE = 0.5
#: At most this many bands per axis (regions: its square).
MAX_BANDS = 3


def bands(size: int, out: int, kernel: int, stride: int, dilation: int,
          pad_before: int) -> list[tuple[int, int, int, int]] | None:
    """``(first output, end output, first tap, end tap)`` of each band of outputs along one
    axis in which the same taps read the input; None where some band reads none."""
    valid = tap_outputs(size, out, kernel, stride, dilation, pad_before)
    cuts = sorted({0, out, *(v for lo, hi in valid for v in (lo, hi) if 0 < v < out)})
    result = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        taps = [r for r, (lo, hi) in enumerate(valid) if lo <= a and b <= hi]
        if not taps:
            return None
        result.append((a, b, taps[0], taps[-1] + 1))
    return result


def regions(call: relax.Call) -> tuple[ConvGeometry, list, list] | None:
    """The conv's geometry and its row and column bands where it is worth splitting, None
    to keep it."""
    geometry = static_conv_geometry(call)
    if geometry is None:
        return None
    x, w, y, strides, dilation, pad = geometry
    per_axis = [bands(x[2 + i], y[2 + i], w[2 + i], strides[i], dilation[i], pad[i])
                for i in (0, 1)]
    if any(b is None or len(b) > MAX_BANDS for b in per_axis):
        return None
    rows, cols = per_axis
    if len(rows) == 1 and len(cols) == 1:
        return None
    useful = sum((r1 - r0) * (c1 - c0) * (rt1 - rt0) * (ct1 - ct0)
                 for r0, r1, rt0, rt1 in rows for c0, c1, ct0, ct1 in cols)
    if useful > MAX_USEFUL_SHARE * y[2] * y[3] * w[2] * w[3]:
        return None
    return geometry, rows, cols


def _join(bb: relax.BlockBuilder, parts: list[relax.Expr], axis: int) -> relax.Expr:
    return parts[0] if len(parts) == 1 else bb.emit(relax.op.concat(parts, axis=axis))


def _rewrite(call: relax.Call, bb: relax.BlockBuilder) -> relax.Expr | None:
    split = regions(call)
    if split is None:
        return None
    (_, _, _, (sh, sw), (dh, dw), (ph, pw, _, _)), rows, cols = split
    x, w = call.args
    weights = w.value.numpy() if isinstance(w, tvm.ir.expr.Constant) else None
    band_outputs = []
    for y0, y1, r0, r1 in rows:
        parts = []
        for x0, x1, c0, c1 in cols:
            top, left = y0 * sh + r0 * dh - ph, x0 * sw + c0 * dw - pw
            bottom = (y1 - 1) * sh + (r1 - 1) * dh - ph + 1
            right = (x1 - 1) * sw + (c1 - 1) * dw - pw + 1
            data = bb.emit(relax.op.strided_slice(x, axes=[2, 3], begin=[top, left],
                                                  end=[bottom, right]))
            if weights is not None:  # a constant for the weight-folding passes
                kernel = relax.const(np.ascontiguousarray(weights[:, :, r0:r1, c0:c1]))
            else:
                kernel = bb.emit(relax.op.strided_slice(w, axes=[2, 3], begin=[r0, c0],
                                                        end=[r1, c1]))
            conv = conv2d_like(call, data, kernel, padding=[0, 0, 0, 0],
                               dilation=[dh if r1 - r0 > 1 else 1, dw if c1 - c0 > 1 else 1])
            parts.append(bb.emit(conv))
        band_outputs.append(_join(bb, parts, axis=3))
    return _join(bb, band_outputs, axis=2)


@tvm.transform.module_pass(opt_level=0, name="SplitConvRegions")
class SplitConvRegions:
    """Split every NCHW conv whose taps mostly read padding into output regions (see the
    module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every qualifying conv of every Relax function."""
        return rewrite_calls(mod, "relax.nn.conv2d", _rewrite)
