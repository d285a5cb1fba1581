"""1x1 convolutions left in NCHW rewritten as matmuls (``W[F, C] @ X[N, C, H*W]``).

A pointwise conv is a matmul over the spatial positions. In NCHW the conv template vectorises
along the image row, which runs at a fraction of the SIMD width when the row is not a multiple
of it (7, 14, 28 wide: measured 10x slower than the matmul template on RexNet's 1x1 convs whose
channel counts keep them out of the blocked layout). The matmul template vectorises and
register-tiles along ``H*W`` and the output channels instead, whatever the row width.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ...relax_rewrite import is_nchw_conv, rewrite_calls, static_shape
from ._util import pick_vector_width


def _ints(values) -> list[int] | None:
    return [int(v) for v in values] if all(isinstance(v, (int, tirx.IntImm)) for v in values) \
        else None


def rewritable(call: relax.Call, lanes: int) -> bool:
    """Whether ``call`` is an NCHW 1x1 conv (stride, dilation 1, no padding, one group) with
    a static ``[F, C, 1, 1]`` weight, whose rows vectorise below the full SIMD width.

    Convs over a 1x1 image (squeeze-excitation) stay convs: their fused bias and activation
    epilogue is worth more than the layout (measured 1.1x slower as matmuls, EfficientNet-B0).
    """
    a = call.attrs
    if (not is_nchw_conv(call) or int(a.groups) != 1 or _ints(a.strides) != [1, 1]
            or _ints(a.dilation) != [1, 1] or _ints(a.padding) != [0, 0, 0, 0]):
        return False
    x, w = static_shape(call.args[0]), static_shape(call.args[1])
    if x is None or w is None or len(x) != 4 or len(w) != 4:
        return False
    if not all(isinstance(d, int) for d in w) or w[2:] != [1, 1]:
        return False
    out_dtype = call.ty.dtype if isinstance(call.ty, relax.TensorType) else None
    if out_dtype is None or not (out_dtype == call.args[0].ty.dtype == call.args[1].ty.dtype):
        return False
    h, width = x[2], x[3]
    if not isinstance(h, int) or not isinstance(width, int):
        return True  # symbolic image: the row width is unknown, the matmul is safe
    return h * width > 1 and pick_vector_width(width, lanes) < lanes


@tvm.transform.module_pass(opt_level=0, name="PointwiseConvAsMatmul")
class PointwiseConvAsMatmul:
    """Rewrite NCHW pointwise convs whose rows vectorise poorly as weight-left matmuls.

    Parameters
    ----------
    lanes : int
        SIMD lanes for the element type (16 for fp32 on AVX-512).
    """

    def __init__(self, lanes: int):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Rewrite every qualifying conv of every Relax function."""
        return rewrite_calls(mod, "relax.nn.conv2d", self._rewrite, canonicalize=True)

    def _rewrite(self, call: relax.Call, bb: relax.BlockBuilder) -> relax.Expr | None:
        if not rewritable(call, self.lanes):
            return None
        x, w = call.args
        n, c, h, width = static_shape(x)
        f = static_shape(w)[0]
        weight = bb.emit(relax.op.reshape(w, [f, c]))
        rows = bb.emit(relax.op.reshape(x, [n, c, h * width]))
        y = bb.emit(relax.op.matmul(weight, rows))
        return relax.op.reshape(y, [n, f, h, width])
