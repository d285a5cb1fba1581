"""NCHW convs with narrow rows computed on padded rows (PadConvWidth)."""

from __future__ import annotations

import pytest

from fusion_tvm.testing.reference import assert_matches_onnxruntime, rule_counts

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
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    model = _mixed_depthwise(size)
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0), hw=HW)
    rules = rule_counts(compiled)
    # before: the window nest (reduction rule) or the fallback took them, 2.4-3.5 GFLOP/s
    assert rules["conv2d"] == 3, rules
    assert rules["fallback"] == 0 and rules["reduction"] == 0, rules
