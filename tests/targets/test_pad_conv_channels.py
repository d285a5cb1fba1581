"""Dense convs' output channels padded to the SIMD width (PadConvChannels)."""

from __future__ import annotations

import pytest

from fusion_tvm.testing.reference import assert_matches_onnxruntime, rule_counts

HW = "ci-x86-avx2"  # frozen: 8 fp32 lanes


def _heads():
    """Three sibling 3x3 heads on a 10x10 map (64 + 64 + 51 channels, as YOLOv8-pose's):
    combined into one 179-channel conv, which no channel block divides."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("heads")
    x = g.silu(g.conv(g.add_input("x", [1, 32, 10, 10]), 32, 64, 3, bias=True))
    for cout in (64, 64, 51):
        g.add_output(g.silu(g.conv(x, 64, cout, 3, bias=True)))
    return g.build()


def test_padded_heads_are_blocked_and_match_onnxruntime():
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    model = _heads()
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0), hw=HW)
    rules = rule_counts(compiled)
    # every conv blocked (the 179-channel one padded to 184); before, the combined conv
    # stayed NCHW and only the reduction rule took it (1.6 GFLOP/s)
    assert rules["conv2d_nchwc"] == 2, rules
    assert rules["reduction"] == 0 and rules["fallback"] == 0 and rules["conv2d"] == 0, rules


def test_only_convs_with_blocked_input_and_little_padding_are_padded():
    from tvm import relax

    from fusion_tvm.targets.llvm_cpu.pad_conv_channels import padded_channels

    def conv(c, f, groups=1):
        x = relax.Var("x", relax.TensorType((1, c, 10, 10), "float32"))
        w = relax.Var("w", relax.TensorType((f, c // groups, 3, 3), "float32"))
        return relax.op.nn.conv2d(x, w, groups=groups)

    def typed(call):
        bb = relax.BlockBuilder()
        with bb.function("f", list(call.args)):
            out = bb.emit(call)
            bb.emit_func_output(out)
        return bb.get()["f"].body.blocks[0].bindings[0].value

    assert padded_channels(typed(conv(256, 179)), 8) == 184
    assert padded_channels(typed(conv(256, 184)), 8) is None  # divisible already
    assert padded_channels(typed(conv(256, 116)), 8) is None  # a block of 4 takes it
    assert padded_channels(typed(conv(255, 179)), 8) is None  # input not blocked
    assert padded_channels(typed(conv(256, 9)), 8) is None  # 7 of 16 filters zero
    assert padded_channels(typed(conv(256, 180, groups=4)), 8) is None  # grouped
