"""SplitConvRegions: a conv whose taps mostly read padding runs as one conv per output
region with exactly the taps that read data there; the result unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import fusion_tvm
from fusion_tvm.passes.split_conv_regions import SplitConvRegions, bands

RNG = np.random.default_rng(0)


def _conv(size: int, dilation: int, kernel: int = 3, stride: int = 1, channels: int = 16,
          pad: int | None = None, weights_const: bool = True):
    pad = dilation * (kernel - 1) // 2 if pad is None else pad
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w_np = (RNG.standard_normal((channels, channels, kernel, kernel)) * 0.2).astype("float32")
    params = [x]
    if weights_const:
        w = relax.const(w_np)
    else:
        w = relax.Var("w", relax.TensorType(w_np.shape, "float32"))
        params.append(w)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad,
                                           dilation=dilation))
            y = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(y)
    return bb.get(), w_np


def _convs(mod) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e)
        if isinstance(e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.nn.conv2d"))
        else None)
    return found


def test_bands_of_the_aspp_rate_12_conv():
    # 14 x 14, rate 12: rows 0-1 read through the centre and lower taps, 2-11 the centre
    # only, 12-13 the upper and centre taps
    assert bands(14, 14, 3, 1, 12, 12) == [(0, 2, 1, 3), (2, 12, 1, 2), (12, 14, 0, 2)]
    assert bands(56, 56, 3, 1, 1, 1) == [(0, 1, 1, 3), (1, 55, 0, 3), (55, 56, 0, 2)]


@pytest.mark.parametrize(("size", "dilation", "stride", "regions"), [
    (14, 12, 1, 9),  # DeepLabV3's ASPP on 14 x 14: 18% of the MACs read data
    (9, 6, 1, 9),
    (20, 1, 1, 1),  # an ordinary conv: unchanged (its border is a sliver)
    (28, 12, 1, 1),  # rate 12 on 28 x 28: 51% read data, kept whole
])
def test_split_conv_equals_the_whole_conv(size, dilation, stride, regions):
    mod, _ = _conv(size, dilation, stride=stride)
    split = SplitConvRegions()(mod)
    relax.analysis.well_formed(split)
    convs = _convs(split)
    assert len(convs) == regions
    if regions > 1:  # no region reads padding
        assert all(list(int(p) for p in c.attrs.padding) == [0, 0, 0, 0] for c in convs)
    x = RNG.standard_normal((1, 16, size, size)).astype("float32")
    exe = tvm.compile(mod, target="llvm")
    want = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    for hw in ("ci-x86-avx2", "epyc-znver4-2c"):
        cm = fusion_tvm.compile(mod, hw=hw)
        if hw != "ci-x86-avx2" and "avx512f" not in open("/proc/cpuinfo").read():
            continue
        got = cm.run([x])
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_split_with_weights_as_inputs():
    """Weights that are function parameters are sliced in the graph, not folded."""
    mod, w = _conv(14, 12, weights_const=False)
    split = SplitConvRegions()(mod)
    assert len(_convs(split)) == 9
    x = RNG.standard_normal((1, 16, 14, 14)).astype("float32")
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    want = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    got = fusion_tvm.compile(mod, hw="ci-x86-avx2").run([x, w])
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
