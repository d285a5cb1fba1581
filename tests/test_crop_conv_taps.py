"""CropConvTaps: taps that only read padding are dropped, the result unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import fusion_tvm
from fusion_tvm.passes.crop_conv_taps import CropConvTaps, useful_taps

RNG = np.random.default_rng(0)


def _conv(size: int, dilation: int, kernel: int = 3, stride: int = 1, channels: int = 8,
          pad: int | None = None):
    pad = dilation * (kernel - 1) // 2 if pad is None else pad
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = RNG.standard_normal((channels, channels, kernel, kernel)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), strides=stride,
                                                  padding=pad, dilation=dilation))
        bb.emit_func_output(y)
    return bb.get()


def _kernel_shapes(mod) -> list[tuple]:
    shapes = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: shapes.append(tuple(int(d) for d in e.args[1].ty.shape.values))
        if isinstance(e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.nn.conv2d"))
        else None)
    return shapes


def test_useful_taps():
    assert useful_taps(14, 14, 3, 1, 24, 24) == (1, 1)  # ASPP rate 24 on 14x14: centre only
    assert useful_taps(14, 14, 3, 1, 12, 12) == (0, 2)  # rate 12: the outer taps read 2 rows
    assert useful_taps(56, 56, 3, 1, 1, 1) == (0, 2)


@pytest.mark.parametrize(("size", "dilation", "kernel", "stride", "pad", "taps"), [
    (14, 24, 3, 1, None, 1),  # 3x3 -> 1x1
    (14, 36, 3, 1, None, 1),
    (9, 6, 3, 1, None, 3),  # partly in range: kept
    (5, 4, 5, 1, 8, 3),  # 5x5, rate 4, padding 8: taps 1-3 read
    (6, 8, 3, 2, 8, 1),  # strided: the crop needs less padding than the stride's slack
    (20, 1, 3, 1, 1, 3),  # ordinary conv: unchanged
])
def test_cropped_conv_equals_stock_tvm(size, dilation, kernel, stride, pad, taps):
    mod = _conv(size, dilation, kernel, stride, pad=pad)
    cropped = CropConvTaps()(mod)
    relax.analysis.well_formed(cropped)  # raises on a violation
    assert _kernel_shapes(cropped)[0][2:] == (taps, taps)
    x = RNG.standard_normal((1, 8, size, size)).astype("float32")
    exe = tvm.compile(mod, target="llvm")
    want = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    got = fusion_tvm.compile(mod, hw="ci-x86-avx2").run([x])
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
