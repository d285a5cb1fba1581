"""NCHW convs with narrow rows computed on padded rows (PadConvWidth)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import fusion_tvm
from fusion_tvm.targets.schedule import applied_rules

HW = "ci-x86-avx2"  # frozen: 8 fp32 lanes


def _mixed_depthwise(size: int):
    """MixNet's mixed depthwise conv: 90-channel groups (no channel block divides them, so
    they stay NCHW) with 3x3, 5x5 and 9x9 kernels on a narrow map, then concatenated."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("mixed_depthwise")
    x = g.add_input("x", [1, 270, size, size])
    parts = g.op("Split", [x, g.ints([90, 90, 90])], num_outputs=3, axis=1)
    convs = [g.silu(g.conv(p, 90, 90, k, group=90, bias=True))
             for p, k in zip(parts, (3, 5, 9), strict=True)]
    g.add_output(g.op("Concat", convs, axis=1))
    return g.build()


@pytest.mark.parametrize("size", [14, 7])
def test_narrow_depthwise_convs_run_on_the_conv_template(size):
    ort = pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    model = _mixed_depthwise(size)
    feeds = zoo.example_inputs(model, seed=0)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    compiled = fusion_tvm.compile(model, hw=HW)
    got = compiled.run(feeds)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    rules = collections.Counter(applied_rules(compiled.fused_mod).values())
    # before: the window nest (reduction rule) or the fallback took them, 2.4-3.5 GFLOP/s
    assert rules["conv2d"] == 3, rules
    assert rules["fallback"] == 0 and rules["reduction"] == 0, rules
