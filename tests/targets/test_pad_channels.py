"""Convs on channel counts no 8-lane block divides computed padded (PadChannels)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from fusion_tvm.targets.llvm_cpu.pad_channels import PadChannels, padded_count
from fusion_tvm.testing.reference import assert_matches_onnxruntime, rule_counts

HW = "epyc-znver4-2c"  # frozen: 16 fp32 lanes


def _shuffle_unit(divide: bool = False):
    """A ShuffleNetV2 unit on 58 channels: 1x1 conv + BN + ReLU, 3x3 depthwise + BN,
    1x1 conv + BN + ReLU, concatenated with the other half and channel-shuffled; then a
    squeeze-and-excitation scale and a 1x1 conv. With ``divide``, the depthwise output is
    divided by a per-channel constant (an op the padding does not cross)."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("shuffle_unit")
    x = g.add_input("x", [1, 116, 14, 14])
    left, right = g.op("Split", [x, g.ints([58, 58], "halves")], num_outputs=2, axis=1)
    y = g.conv_bn(right, 58, 58, 1)
    y = g.conv_bn(y, 58, 58, 3, group=58, act=None)
    if divide:
        y = g.op("Div", [y, g.uniform((1, 58, 1, 1), 0.5, 1.5, "div")])
    y = g.conv_bn(y, 58, 58, 1)
    y = g.op("Concat", [left, y], axis=1)
    y = g.op("Reshape", [y, g.ints([1, 2, 58, 14, 14], "to5")])
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3, 4])
    y = g.op("Reshape", [y, g.ints([1, 116, 14, 14], "to4")])
    s = g.op("ReduceMean", [y], axes=[2, 3], keepdims=1)
    s = g.op("Sigmoid", [g.conv(g.relu(g.conv(s, 116, 29, 1, bias=True)), 29, 116, 1, bias=True)])
    g.add_output(g.conv(g.op("Mul", [y, s]), 116, 58, 1, bias=True))
    return g.build()


@pytest.mark.parametrize("divide", [False, True])
def test_padded_shuffle_unit_matches_onnxruntime_and_is_blocked(divide):
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    model = _shuffle_unit(divide)
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0), hw=HW)
    rules = rule_counts(compiled)
    # the 58-channel convs padded to 64 run blocked; before, the NCHW template took them
    assert rules["conv2d"] == 0 and rules["fallback"] == 0, rules
    assert rules["conv2d_nchwc"] >= 3, rules


def _prepared(model):
    from fusion_tvm import pipeline
    from fusion_tvm.frontend.onnx_loader import convert_onnx

    mod = convert_onnx(model, "test")[0]
    passes = pipeline.prepare_passes(None)
    last = next(i for i, p in enumerate(passes) if p.info.name == "CanonicalizeBindings")
    return tvm.transform.Sequential(passes[:last + 1])(mod)


def _ops(mod, name):
    calls = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
        and isinstance(e.op, tvm.ir.Op) and e.op.name == name else None)
    return calls


def test_chain_runs_padded_between_convs():
    """Feature maps are padded where a chain starts (the split half, the SE-scaled map),
    the convs and the ops between them see padded channels, and slices leave it only where
    a non-per-channel op reads it (the concat, the squeeze's mean, the model output): no
    slice-then-pad between two convs."""
    mod = _prepared(_shuffle_unit())
    padded = PadChannels(16)(mod)
    relax.analysis.well_formed(padded)
    convs = [c for c in _ops(padded, "relax.nn.conv2d")]
    widths = sorted(int(c.ty.shape.values[1]) for c in convs)
    assert widths == [32, 64, 64, 64, 64, 120], widths  # 29 -> 32, 58 -> 64, 116 -> 120
    maps = [c for c in _ops(padded, "relax.nn.pad")
            if int(c.ty.shape.values[0]) == 1 and int(c.ty.shape.values[2]) > 1]
    assert len(maps) == 2, maps  # the split half, the SE-scaled map: not between convs
    for call in _ops(padded, "relax.nn.pad"):
        src = call.args[0]
        assert not (isinstance(src, relax.Call) and src.op.name == "relax.strided_slice")
    got, want = (_run(m) for m in (padded, mod))
    np.testing.assert_array_equal(got, want)


def _run(mod):
    from benchmarks import zoo

    model = _shuffle_unit()
    feeds = list(zoo.example_inputs(model, seed=1).values())
    ex = tvm.compile(mod, tvm.target.Target({"kind": "llvm"}))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(f) for f in feeds])
    return out.numpy()


def test_padded_counts():
    assert padded_count(58, 16) == 64
    assert padded_count(116, 16) == 120  # to a multiple of 8, not of the lanes
    assert padded_count(12, 16) == 16
    assert padded_count(24, 16) is None  # a block of 8 divides it
    assert padded_count(3, 16) is None  # an RGB input: 8 channels would be 2.7x the work
    assert padded_count(58, 4) is None  # no 8-lane vectors to fill


def _dynamic_chain():
    """Two 1x1 convs on 58 channels with a ReLU between them, batch and image symbolic."""
    bb = relax.BlockBuilder()
    n, h = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("h", "int64")
    x = relax.Var("x", relax.TensorType((n, 58, h, 8), "float32"))
    rng = np.random.default_rng(0)
    w1, w2 = (relax.const(rng.standard_normal((58, 58, 1, 1)).astype("float32") / 8)
              for _ in range(2))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1)))
            out = bb.emit_output(relax.op.nn.conv2d(y, w2))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_batch_and_image_are_padded_and_match_the_nchw_build():
    import fusion_tvm
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

    mod = _dynamic_chain()
    padded = PadChannels(16)(mod)
    assert sorted(int(c.ty.shape.values[1]) for c in _ops(padded, "relax.nn.conv2d")) \
        == [64, 64]
    assert len(_ops(padded, "relax.strided_slice")) == 1  # the output only
    blocked = fusion_tvm.compile(mod, hw=HW)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=HW)
    assert rule_counts(blocked)["conv2d"] == 0, rule_counts(blocked)
    for shape in ((1, 58, 5, 8), (3, 58, 7, 8)):
        x = np.random.default_rng(1).standard_normal(shape).astype("float32")
        np.testing.assert_allclose(blocked.run(x), native.run(x), rtol=1e-4, atol=1e-4)


def test_grouped_convs_are_left_alone():
    bb = relax.BlockBuilder()
    z = relax.Var("z", relax.TensorType((1, 58, 8, 8), "float32"))
    g = relax.Var("g", relax.TensorType((58, 29, 3, 3), "float32"))
    with bb.function("main", [z, g]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(z, g, padding=1, groups=2))
        bb.emit_func_output(out)
    mod = bb.get()
    assert PadChannels(16)(mod).same_as(mod)
