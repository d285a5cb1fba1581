"""The blocked NCHW[b]c conv layout (ConvertToNCHWc) and its schedule rule (Conv2dNCHWc)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax

import fusion_tvm
from fusion_tvm.errors import UnknownNameError
from fusion_tvm.passes.apply_target_schedule import RULE_ATTR
from fusion_tvm.presets import get_hardware
from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend
from fusion_tvm.targets.llvm_cpu.layout import ConvertToNCHWc, choose_block
from fusion_tvm.testing.reference import assert_matches_onnxruntime, rule_counts

HW = "ci-x86-avx2"  # frozen: 8 fp32 lanes, 16 vector registers
RNG = np.random.default_rng(0)


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype("float32") * 0.2)


def _cnn(channels: int = 16, batch="n", image: int = 13) -> tvm.IRModule:
    """conv+bias+relu, strided conv, depthwise + clip, 1x1 projection with residual add,
    max-pool and global average pool; weights are constants (pre-packed at compile time)."""
    c = channels
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    x = relax.Var("x", relax.TensorType((n, 3, image, image), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.conv2d(x, _const(c, 3, 3, 3), padding=1))  # 3 channels: NCHW
            y = bb.emit(nn.relu(relax.op.add(y, _const(1, c, 1, 1))))
            y = bb.emit(nn.conv2d(y, _const(c, c, 3, 3), padding=1))  # dense, blocked
            y = bb.emit(nn.relu(relax.op.add(y, _const(1, c, 1, 1))))
            s = bb.emit(nn.conv2d(y, _const(2 * c, c, 3, 3), strides=2, padding=1))
            s = bb.emit(nn.relu(s))
            d = bb.emit(nn.conv2d(s, _const(2 * c, 1, 3, 3), padding=1, groups=2 * c))
            d = bb.emit(relax.op.clip(relax.op.add(d, _const(1, 2 * c, 1, 1)), 0.0, 6.0))
            p = bb.emit(nn.conv2d(d, _const(2 * c, 2 * c, 1, 1)))
            r = bb.emit(relax.op.add(p, s))  # residual
            m = bb.emit(nn.max_pool2d(r, pool_size=2, strides=2))
            g = bb.emit(relax.op.mean(m, axis=[2, 3]))
            out = bb.emit_output(g)
        bb.emit_func_output(out)
    return bb.get()


def _run(compiled, x):
    out = compiled.run([x])
    return out[0] if isinstance(out, (list, tuple)) else out


@pytest.fixture(scope="module")
def builds():
    mod = _cnn()
    return {lay: fusion_tvm.compile(mod, target=LLVMCPUBackend(layout=lay), hw=HW)
            for lay in ("nchwc", "native")}


def test_choose_block_prefers_full_width_and_falls_back():
    assert choose_block(_cnn(16), 8) == 8
    assert choose_block(_cnn(16), 16) == 16
    # 12 and 24 channels: 8 blocks the depthwise and 1x1 convs on 24 (a block of 4, every
    # conv at a quarter of the rate, loses to the 12-channel dense convs in NCHW)
    assert choose_block(_cnn(12), 16) == 8
    assert choose_block(_cnn(3), 16) is None


def _grouped(group_width: int, groups: int = 4, depthwise: int = 0) -> tvm.IRModule:
    """1x1 conv, a grouped 3x3 conv of ``groups`` x ``group_width`` channels, 1x1 conv
    (ResNeXt / RegNet); with ``depthwise``, a depthwise 3x3 over that many channels."""
    c = groups * group_width
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 28, 28), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.relu(nn.conv2d(x, _const(c, 64, 1, 1))))
            y = bb.emit(nn.relu(nn.conv2d(y, _const(c, group_width, 3, 3), padding=1,
                                          groups=groups)))
            y = bb.emit(nn.conv2d(y, _const(64, c, 1, 1)))
            if depthwise:
                y = bb.emit(nn.conv2d(y, _const(depthwise, 64, 1, 1)))
                y = bb.emit(nn.conv2d(y, _const(depthwise, 1, 3, 3), padding=1,
                                      groups=depthwise))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_choose_block_weighs_the_fma_rate_against_convs_left_in_nchw():
    """Where a half-width vector computes at the full rate (Zen 4: two 256-bit FMA pipes),
    a block of 8 that also blocks grouped convs of 8 channels a group, or depthwise convs
    on 72 channels, wins; where it computes at half the rate, only a large share of such
    convs pays for it. Every channel count dividing by 16: 16 either way."""
    assert choose_block(_grouped(8), 16, 8) == 8
    assert choose_block(_grouped(16), 16, 8) == 16
    assert choose_block(_grouped(8), 16) == 8  # the grouped conv is most of the work
    assert choose_block(_grouped(16, depthwise=72), 16, 8) == 8
    assert choose_block(_grouped(16, groups=16, depthwise=72), 16) == 16
    assert get_hardware("epyc-znver4-2c").full_rate_lanes_fp32 == 8
    assert get_hardware("ci-x86-avx2").full_rate_lanes_fp32 == 8


def test_grouped_conv_of_half_blocks_runs_blocked_on_a_full_rate_half_width():
    """A grouped conv of 8 channels a group under 16 lanes, 8 at the full rate: blocked
    by 8, no conv left to the NCHW rule, and the result matches the NCHW build."""
    from fusion_tvm.hardware import HardwareSpec

    hw = get_hardware("epyc-znver4-2c")
    assert isinstance(hw, HardwareSpec) and hw.simd_lanes_fp32 == 16
    mod = _grouped(8)
    blocked = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=hw)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=hw)
    rules = rule_counts(blocked)
    assert rules.get("conv2d", 0) == 0 and rules["conv2d_nchwc"] >= 2, rules
    if not _has_avx512():
        pytest.skip("running the build needs AVX-512 (epyc-znver4-2c)")
    xs = RNG.standard_normal((1, 64, 28, 28)).astype("float32")
    np.testing.assert_allclose(_run(blocked, xs), _run(native, xs), rtol=1e-4, atol=1e-4)


def test_pass_blocks_convs_and_prepacks_weights():
    mod = ConvertToNCHWc(lanes=8)(_cnn())
    text = mod["main"].script(show_meta=False)
    # every conv is a TE call: the 3-channel stem reads its input as one block of 3
    # channels ([N, 1, H, W, 3]); the dense, strided, 1x1 and depthwise convs as usual
    assert text.count("R.nn.conv2d(") == 0
    funcs = [gv.name_hint for gv in mod.functions]
    assert sum(n.startswith("conv2d_nchwc") for n in funcs) == 4
    assert sum(n.startswith("depthwise_conv2d_nchwc") for n in funcs) == 1
    assert ", 1, 13, 13, 3)" in text  # the stem's input block
    # pooling follows the blocked tensor instead of unblocking it
    assert 'layout="NCHW8c"' in text and text.count("R.nn.max_pool2d(") == 1
    # packed weights are constants once folded: no transform of a constant is left to run
    folded = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))
    transforms = [
        b.value for b in folded["main"].body.blocks[0].bindings
        if isinstance(b.value, relax.Call) and "layout_transform" in str(b.value.args[0])
    ]
    assert not any(isinstance(a, tvm.ir.expr.Constant)
                   for t in transforms for a in t.args[1].fields)


def test_disabled_pass_is_identity():
    mod = _cnn()
    tvm.ir.assert_structural_equal(ConvertToNCHWc(lanes=8, enabled=False)(mod), mod)


@pytest.mark.parametrize("batch", [1, 3])
def test_nchwc_equals_nchw_build(builds, batch):
    x = RNG.standard_normal((batch, 3, 13, 13)).astype("float32")
    got, want = _run(builds["nchwc"], x), _run(builds["native"], x)
    assert got.shape == (batch, 32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_rule_schedules_every_blocked_conv(builds):
    rules = rule_counts(builds["nchwc"])
    # stem, dense 3x3, strided 3x3, depthwise and 1x1 convs: all by the blocked rule, none
    # by the fallback
    assert rules["conv2d_nchwc"] == 5
    assert rules["conv2d"] == 0
    assert rules["fallback"] == 0
    native = rule_counts(builds["native"])
    assert native["conv2d_nchwc"] == 0 and native["conv2d"] >= 4


def test_unknown_layout_is_refused():
    with pytest.raises(UnknownNameError):
        LLVMCPUBackend(layout="nhwc")


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512f" in f.read()
    except OSError:
        return False


@pytest.mark.parametrize(
    "name, kwargs, hw",
    [
        ("resnet18", dict(image=32, width=8), HW),
        # 16-lane blocks: 24-channel convs stay NCHW next to blocked ones; an NCHW conv whose
        # epilogue re-blocks its output once gave wrong results (tile-level to_nchwc)
        ("mobilenetv2", dict(image=32, width_mult=0.5), "epyc-znver4-2c"),
    ],
)
def test_onnx_cnn_matches_onnxruntime(name, kwargs, hw):
    pytest.importorskip("onnxruntime")
    if hw != HW and not _has_avx512():
        pytest.skip("needs AVX-512 (frozen znver4 preset)")
    from benchmarks import zoo

    model = zoo.get_model(name, **kwargs)
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0),
                                          rtol=1e-3, atol=1e-4, hw=hw)
    rules = rule_counts(compiled)
    assert rules["conv2d_nchwc"] >= 10 and rules["fallback"] == 0


def _mixed(batch: int = 1) -> tvm.IRModule:
    """3x3 convs on 32 channels (block 16) around a 1x1 bottleneck of 24 channels, which 16
    does not divide (MobileNetV2's 24-channel stage), with a residual add at 24 channels."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 32, 14, 14), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.relu(nn.conv2d(x, _const(32, 32, 3, 3), padding=1)))
            p = bb.emit(nn.conv2d(y, _const(24, 32, 1, 1)))  # 32 -> 24
            r = bb.emit(relax.op.add(p, nn.conv2d(p, _const(24, 24, 1, 1))))  # 24 -> 24
            e = bb.emit(nn.relu(nn.conv2d(r, _const(32, 24, 1, 1))))  # 24 -> 32
            out = bb.emit_output(nn.conv2d(e, _const(32, 32, 3, 3), padding=1))
        bb.emit_func_output(out)
    return bb.get()


def test_channels_the_block_does_not_divide_get_a_narrower_block():
    mod = _mixed()
    assert choose_block(mod, 16) == 16
    text = ConvertToNCHWc(lanes=16)(mod)["main"].script(show_meta=False)
    assert text.count("R.nn.conv2d(") == 0  # every conv blocked, 24 channels by 8
    assert ", 3, 14, 14, 8)" in text  # the 24-channel tensors as 3 blocks of 8
    if not _has_avx512():
        pytest.skip("the build check needs 16 fp32 lanes (AVX-512) for a block of 16")
    hw = get_hardware("host")
    x = RNG.standard_normal((1, 32, 14, 14)).astype("float32")
    blocked = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=hw)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=hw)
    assert rule_counts(blocked)["conv2d"] == 0 and rule_counts(blocked)["fallback"] == 0
    np.testing.assert_allclose(_run(blocked, x), _run(native, x), rtol=1e-4, atol=1e-4)


def test_rgb_stem_with_a_narrower_output_block_runs_blocked():
    """A 3-channel stem whose 24 output channels the block 16 does not divide: one input
    block of 3 channels and 8-channel output blocks (was NCHW: ShuffleNetV2's 3 -> 24
    stem at 112x112 ran 286 us there against 112 blocked)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 32, 32), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.relu(nn.conv2d(x, _const(24, 3, 3, 3), strides=2, padding=1)))
            z = bb.emit(nn.relu(nn.conv2d(y, _const(32, 24, 1, 1))))
            out = bb.emit_output(nn.conv2d(z, _const(32, 32, 3, 3), padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    assert choose_block(mod, 16) == 16
    text = ConvertToNCHWc(lanes=16)(mod)["main"].script(show_meta=False)
    assert text.count("R.nn.conv2d(") == 0, text  # the stem blocked too
    assert "(1, 1, 32, 32, 3)" in text  # its input: one block of the 3 channels


def test_transposed_conv_keeps_the_rest_of_the_network_blocked():
    """A ConvTranspose (YOLOv8-seg's mask head upsampling) between blocked convs stays NCHW
    with layout transforms around it; left to TVM's layout inference it made ConvertLayout
    fail and the whole network fall back to NCHW (YOLOv8n-seg 1.43x slower)."""
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("upsample_head")
    x = g.silu(g.conv(g.add_input("x", [1, 16, 12, 12]), 16, 32, 3, bias=True))
    w = g.normal((32, 32, 2, 2), 0.1, "up.weight")
    up = g.op("ConvTranspose", [x, w, g.normal((32,), 0.01, "up.bias")], kernel_shape=[2, 2],
              strides=[2, 2], pads=[0, 0, 0, 0])
    g.add_output(g.silu(g.conv(up, 32, 32, 3, bias=True)))
    model = g.build()
    compiled = assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0),
                                          hw="epyc-znver4-2c")
    rules = rule_counts(compiled)
    assert rules["conv2d_nchwc"] == 2 and rules["fallback"] == 0, rules


def test_depthwise_reads_its_padding_inline(builds):
    """The blocked depthwise conv has no padded copy of its input: one root loop nest for
    the conv and its epilogue, the zero border read by guarded loads (equality with the
    NCHW build is test_nchwc_equals_nchw_build); the dense 3x3 convs keep theirs."""
    from tvm import s_tir

    roots = {}
    for gv, f in builds["nchwc"].fused_mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and str(f.attrs.get(RULE_ATTR, "")) == \
                "conv2d_nchwc":
            sch = s_tir.Schedule(f)
            roots[gv.name_hint] = [sch.get(b).name_hint
                                   for b in sch.get_child_blocks(sch.get_sblock("root"))]
    depthwise = [r for n, r in roots.items() if "depthwise" in n]
    assert len(depthwise) == 1 and not any("pad" in b for b in depthwise[0])
    dense = [r for n, r in roots.items() if "depthwise" not in n]
    assert any(any("pad" in b for b in r) for r in dense)


def _pad_blocks(compiled) -> dict:
    from tvm import s_tir

    found = {}
    for gv, f in compiled.fused_mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and str(f.attrs.get(RULE_ATTR, "")) == \
                "conv2d_nchwc":
            sch = s_tir.Schedule(f)
            found[gv.name_hint] = any(
                "pad" in sch.get(b).name_hint
                for b in sch.get_child_blocks(sch.get_sblock("root")))
    return found


def test_strided_dense_conv_keeps_the_padded_copy(builds):
    """A stride-2 dense conv reads its zero border from the padded copy (staged per row),
    static batch or symbolic: guarded loads read inline measured 2.1-2.3x slower on
    16-48-channel layers over 112-320 px (they were kept for a static batch before)."""
    mod = _cnn(batch=2)
    static = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=HW)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=HW)
    for pads in (_pad_blocks(static), _pad_blocks(builds["nchwc"])):
        strided = [n for n in pads if "nchwc2" in n and "depthwise" not in n]
        assert strided and all(pads[n] for n in strided)
    x = RNG.standard_normal((2, 3, 13, 13)).astype("float32")
    np.testing.assert_allclose(_run(static, x), _run(native, x), rtol=1e-4, atol=1e-4)


def test_dilated_conv_with_wide_padding_is_no_stride():
    """A dilation-4 3x3 conv over 16 x 16 (padding 4: 24 padded rows for 16 output rows;
    too many taps read data for SplitConvRegions) steps one row per output row: the
    blocked rule keeps the padded copy instead of guarded loads (read as "strided" from
    the extents, DeepLabV3's dilation-12 conv ran at 96 against 195 GFLOP/s), and the
    result matches."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, _const(16, 16, 1, 1))))
            y = bb.emit(relax.op.nn.conv2d(y, _const(16, 16, 3, 3), padding=4, dilation=4))
            y = bb.emit_output(relax.op.nn.relu(relax.op.add(y, _const(1, 16, 1, 1))))
        bb.emit_func_output(y)
    mod = bb.get()
    blocked = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=HW)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=HW)
    pads = {n: p for n, p in _pad_blocks(blocked).items() if "nchwc1" in n}
    assert pads and all(pads.values()), pads  # the dilated conv (the second)
    xs = RNG.standard_normal((1, 16, 16, 16)).astype("float32")
    np.testing.assert_allclose(_run(blocked, xs), _run(native, xs), rtol=1e-4, atol=1e-4)


def _sliced(cut: int, conv_after: bool):
    """A 1x1 conv (16 -> 32 channels, bias) whose output is cut along the channels at
    ``cut``: ``[0, cut)`` through ReLU (and a 3x3 conv with ``conv_after``), ``[cut, 32)``
    through ReLU; both are outputs."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("sliced")
    y = g.conv(g.add_input("x", [1, 16, 14, 14]), 16, 32, 1, bias=True)
    a = g.relu(g.op("Slice", [y, g.ints([0]), g.ints([cut]), g.ints([1])]))
    b = g.relu(g.op("Slice", [y, g.ints([cut]), g.ints([32]), g.ints([1])]))
    g.add_output(g.conv(a, cut, 16, 3, bias=True) if conv_after else a)
    g.add_output(b)
    return g.build()


def _layout_changes(mod: tvm.IRModule) -> list[tuple[str, tuple]]:
    """(kind, input shape) of every activation layout change in ``mod``'s main: our TE
    ``to_nchw`` / ``to_nchwc`` calls and any ``R.layout_transform`` of a non-constant."""
    found = []

    def visit(e):
        if not isinstance(e, relax.Call):
            return
        if e.op.same_as(tvm.ir.Op.get("relax.call_tir")) and \
                e.args[0].name_hint.startswith("to_nchw"):
            kind = "to_nchwc" if e.args[0].name_hint.startswith("to_nchwc") else "to_nchw"
            found.append((kind, tuple(int(d) for d in e.args[1].fields[0].ty.shape.values)))
        elif e.op.same_as(tvm.ir.Op.get("relax.layout_transform")) and \
                not isinstance(e.args[0], tvm.ir.expr.Constant):
            found.append(("layout_transform", ()))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _matches_onnxruntime(model):
    pytest.importorskip("onnxruntime")
    from benchmarks import zoo

    return assert_matches_onnxruntime(model, zoo.example_inputs(model, seed=0), hw=HW)


def test_block_aligned_channel_slices_stay_blocked():
    """Slices at channel 16 of a 32-channel NCHW8c tensor take whole blocks: each is a
    slice of the blocked tensor, so the conv's output is never unblocked and the 3x3 conv
    reads its slice without re-blocking it. The only layout changes left are the input's
    block and the two outputs' unblock, each of 16 channels."""
    from fusion_tvm.frontend import load_model

    model = _sliced(16, conv_after=True)
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert sorted(_layout_changes(mod)) == [
        ("to_nchw", (1, 2, 14, 14, 8)), ("to_nchw", (1, 2, 14, 14, 8)),
        ("to_nchwc", (1, 16, 14, 14)),
    ]
    assert "R.strided_slice(" in mod["main"].script(show_meta=False)  # on the blocked tensor
    assert rule_counts(_matches_onnxruntime(model))["conv2d_nchwc"] == 2


def test_misaligned_channel_slice_unblocks_and_matches_onnxruntime():
    """A cut at channel 12 is not whole 8-channel blocks: the conv's whole output is
    unblocked and sliced in NCHW, as TVM's layout inference does it."""
    from fusion_tvm.frontend import load_model

    model = _sliced(12, conv_after=False)
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert ("to_nchw", (1, 4, 14, 14, 8)) in _layout_changes(mod)  # all 32 channels
    _matches_onnxruntime(model)


@pytest.mark.parametrize("stride", [1, 2])
def test_grouped_conv_of_whole_blocks_is_lowered_blocked(stride):
    """ConvertLayout blocks a grouped conv whose groups are whole channel blocks (ResNeXt's
    32 groups of 16 channels under b = 8); the rewriter lowers it to the blocked kernel
    (it was left as an ``R.nn.conv2d`` in NCHW8c that no pass lowers: "CodeGenVM cannot
    emit this Relax operator", ResNeXt-50 did not compile)."""
    from benchmarks.zoo.builder import GraphBuilder
    from fusion_tvm.frontend import load_model

    g = GraphBuilder("grouped")
    y = g.relu(g.conv(g.add_input("x", [1, 64, 10, 10]), 64, 128, 1, bias=True))
    y = g.relu(g.conv(y, 128, 128, 3, stride=stride, group=8, bias=True))
    g.add_output(g.conv(y, 128, 32, 1))
    model = g.build()
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert "R.nn.conv2d(" not in mod["main"].script(show_meta=False)
    rules = rule_counts(_matches_onnxruntime(model))
    assert rules["conv2d_nchwc"] == 3 and rules["fallback"] == 0


def _squeeze_excite(gate: str = "Sigmoid", scale_first: bool = True):
    """EfficientNet's block: 1x1 expand + SiLU, depthwise 3x3 + SiLU, squeeze-and-excite
    (global average pool, 1x1 reduce + SiLU, 1x1 expand + gate, channel scale, the scale
    first as torchvision writes it), 1x1 projection."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("se")
    x = g.silu(g.conv(g.add_input("x", [1, 16, 12, 12]), 16, 32, 1, bias=True))
    x = g.silu(g.conv(x, 32, 32, 3, group=32, bias=True))
    s = g.op("GlobalAveragePool", [x])
    s = g.silu(g.conv(s, 32, 8, 1, bias=True))
    s = g.op(gate, [g.conv(s, 8, 32, 1, bias=True)])
    g.add_output(g.conv(g.op("Mul", [s, x] if scale_first else [x, s]), 32, 16, 1, bias=True))
    return g.build()


@pytest.mark.parametrize(("gate", "scale_first"),
                         [("Sigmoid", True), ("HardSigmoid", True), ("Sigmoid", False)])
def test_squeeze_excitation_stays_blocked(gate, scale_first):
    """The pool, the two small convs, the gate and the channel scale run on the blocked
    tensors: the only layout changes are the input's block and the output's unblock (the
    pool read an unblocked copy and the scale unblocked and re-blocked its operand: four
    more). The scale and the projection reading it are one kernel (the rewrite left an
    alias binding between them that kept them apart)."""
    from fusion_tvm.frontend import load_model

    model = _squeeze_excite(gate, scale_first)
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert sorted(k for k, _ in _layout_changes(mod)) == ["to_nchw", "to_nchwc"]
    compiled = _matches_onnxruntime(model)
    assert compiled.num_kernels == 6
    last = compiled.plan.groups[-1].prim_funcs  # the gate may join them (cost model)
    kinds = [p.rstrip("0123456789") for p in last]
    assert "multiply" in kinds and kinds[kinds.index("multiply") + 1] == "conv2d_nchwc", last
    assert rule_counts(compiled)["fallback"] == 0


def test_inception_concat_stays_blocked():
    """Branches of whole channel blocks (a 1x1 conv, a 3x3 conv, a pooled 1x1 conv) joined
    along the channels are joined block by block: no branch is unblocked to concatenate
    in NCHW and re-blocked for the next conv (GoogLeNet: 53 layout changes a run, now 1)."""
    from benchmarks.zoo.builder import GraphBuilder
    from fusion_tvm.frontend import load_model

    g = GraphBuilder("inception")
    x = g.relu(g.conv(g.add_input("x", [1, 8, 12, 12]), 8, 16, 3, bias=True))
    a = g.relu(g.conv(x, 16, 16, 1, bias=True))
    b = g.relu(g.conv(x, 16, 8, 3, bias=True))
    p = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    c = g.relu(g.conv(p, 16, 8, 1, bias=True))
    y = g.op("Concat", [a, b, c], axis=1)
    g.add_output(g.conv(y, 32, 16, 1, bias=True))
    model = g.build()
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert sorted(k for k, _ in _layout_changes(mod)) == ["to_nchw", "to_nchwc"]
    compiled = _matches_onnxruntime(model)
    assert compiled.plan.num_kernels == compiled.num_kernels


def test_leading_block_slice_is_a_kernel_not_a_view():
    """A slice of the first channel blocks maps flat index to flat index (TVM calls it a
    reshape pattern), but it copies: the plan prices and counts it as a kernel, so the
    plan's kernel count is the built one (it said 2 for 3 built)."""
    compiled = _matches_onnxruntime(_sliced(16, conv_after=True))
    assert compiled.plan.num_kernels == compiled.num_kernels


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsampling_stays_blocked(mode):
    """An FPN top-down step (upsample x2 of the coarse level, add the lateral 1x1 conv, a
    3x3 conv) resizes the blocked tensor: no unblock before the resize and no re-block after
    it (torchvision's ResNet-18 FPN: 12 layout changes a run -> 6, the outputs' own)."""
    from benchmarks.zoo.builder import GraphBuilder
    from fusion_tvm.frontend import load_model

    g = GraphBuilder("fpn")
    x = g.relu(g.conv(g.add_input("x", [1, 8, 12, 12]), 8, 16, 3, bias=True))
    coarse = g.relu(g.conv(x, 16, 16, 3, stride=2, bias=True))
    scales = g.const([1.0, 1.0, 2.0, 2.0], "scales")
    attrs = {"mode": mode, "coordinate_transformation_mode":
             "asymmetric" if mode == "nearest" else "half_pixel"}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    up = g.op("Resize", [coarse, "", scales], **attrs)
    y = g.op("Add", [up, g.conv(x, 16, 16, 1, bias=True)])
    g.add_output(g.conv(y, 16, 16, 3, bias=True))
    model = g.build()
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert sorted(k for k, _ in _layout_changes(mod)) == ["to_nchw", "to_nchwc"]
    assert 'layout="NCHW8c"' in mod["main"].script(show_meta=False)
    _matches_onnxruntime(model)


def test_conv_the_row_kernel_cannot_take_gets_a_half_width_block():
    """116 channels at 14 x 14 (ShuffleNetV2's stage 3): neither the NCHW row kernel (rows
    not a multiple of 4 wide) nor the channel-vector one (116 % 8) takes it, and the plain
    window nest ran at 5 GFLOP/s; a block of 4 channels keeps it on the blocked kernel."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("narrow")
    x = g.relu(g.conv(g.add_input("x", [1, 64, 14, 14]), 64, 64, 3, bias=True))  # b = 8
    x = g.relu(g.conv(x, 64, 116, 1, bias=True))
    g.add_output(g.relu(g.conv(x, 116, 116, 1, bias=True)))
    model = g.build()
    from fusion_tvm.frontend import load_model

    assert choose_block(load_model(model).mod, 8) == 8
    rules = rule_counts(_matches_onnxruntime(model))
    assert rules["conv2d_nchwc"] == 3 and rules["reduction"] == 0


def _concat_squeeze(channels: int = 16, size: int = 14) -> tvm.IRModule:
    """SqueezeNet's fire module into the next one's squeeze: a 1 x 1 and a 3 x 3 expand
    conv concatenated along the channels, then a 1 x 1 conv + bias + ReLU."""
    c = channels
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, size, size), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(nn.relu(nn.conv2d(x, _const(c, c, 1, 1))))
            b = bb.emit(nn.relu(nn.conv2d(x, _const(c, c, 3, 3), padding=1)))
            y = bb.emit(relax.op.concat([a, b], axis=1))
            y = bb.emit(nn.conv2d(y, _const(c, 2 * c, 1, 1)))
            y = bb.emit_output(nn.relu(relax.op.add(y, _const(1, c, 1, 1))))
        bb.emit_func_output(y)
    return bb.get()


def test_concat_before_a_conv_is_computed_per_row():
    """A concat the plan fuses in front of a blocked 1 x 1 conv is computed per task of the
    conv's parallel row loop (one input row, in cache) instead of a pass of its own over
    the whole input: SqueezeNet's and YOLOv8n's concat + 1 x 1 conv kernels ran 1.3-2.8x
    faster. The kernel model says so (nothing staged through memory, one parallel loop)
    and the result matches the NCHW build."""
    from tvm import s_tir

    from fusion_tvm.calibration.kernels import plan_kernels
    from fusion_tvm.calibration.micro import parallel_loops

    hw = replace(get_hardware(HW), parallel_overhead_s=2e-7)
    mod = _concat_squeeze()
    blocked = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=hw)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=hw)
    found = [k for k in plan_kernels(blocked)
             if k.func is not None and "concatenate" in k.func_name and k.rule == "conv2d_nchwc"]
    assert len(found) == 1, [k.func_name for k in plan_kernels(blocked)]
    kernel = found[0]
    sch = s_tir.Schedule(kernel.func)
    concat = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
              if sch.get(b).name_hint.startswith("T_concat")]
    assert len(concat) == 1
    kinds = [sch.get(lp).kind for lp in sch.get_loops(concat[0])]
    assert kinds[0] == tvm.tirx.stmt.ForKind.PARALLEL, kinds  # under the conv's row loop
    assert parallel_loops(kernel.func) == 1 == int(kernel.detail["parallel_regions"])
    graph = blocked.plan.blocks[0].graph
    group = next(g for g in blocked.plan.groups if g.kernel == kernel.func_name)
    traits = LLVMCPUBackend().kernel_traits(graph, frozenset(group.node_ids), "conv2d", hw)
    assert traits is not None and traits.staged_bytes == 0
    x = RNG.standard_normal((1, 16, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(blocked, x), _run(native, x), rtol=1e-4, atol=1e-4)


def test_row_staging_pays_by_recompute_and_lanes():
    """Per-row staging is taken up to 4 recomputes for any producer and 12 for one copying
    whole lane vectors (the measured cases in ``row_staging_pays``' docstring)."""
    from fusion_tvm.targets.llvm_cpu.row_staging import row_staging_pays

    assert row_staging_pays(1.0, False) and row_staging_pays(4.0, False)
    assert row_staging_pays(10.0, True) and not row_staging_pays(10.0, False)
    assert not row_staging_pays(29.0, True) and not row_staging_pays(29.0, False)


def _ghost_then_depthwise() -> tvm.IRModule:
    """GhostNet's ghost module (a 1 x 1 conv and a cheap depthwise conv on its output,
    concatenated along the channels) into a 3 x 3 / 2 depthwise conv + bias."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 28, 28), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(nn.relu(nn.conv2d(x, _const(16, 32, 1, 1))))
            b = bb.emit(nn.relu(nn.conv2d(a, _const(16, 1, 3, 3), padding=1, groups=16)))
            y = bb.emit(relax.op.concat([a, b], axis=1))
            z = bb.emit(nn.conv2d(y, _const(32, 1, 3, 3), strides=2, padding=1, groups=32))
            z = bb.emit_output(relax.op.add(z, _const(1, 32, 1, 1)))
        bb.emit_func_output(z)
    return bb.get()


def test_depthwise_conv_reads_a_concat_inline():
    """A concat along the channel blocks fused in front of a depthwise conv is read inline
    by the conv's guarded loads, no padded pass (GhostNet's ghost halves: 67 -> 13 us; the
    pass with the concat's select in it took 4x the conv). The kernel model counts the
    same parallel loops, and the result matches the NCHW build."""
    from tvm import s_tir

    from fusion_tvm.calibration.kernels import plan_kernels
    from fusion_tvm.calibration.micro import parallel_loops

    hw = replace(get_hardware(HW), parallel_overhead_s=2e-7)
    mod = _ghost_then_depthwise()
    blocked = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="nchwc"), hw=hw)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=hw)
    found = [k for k in plan_kernels(blocked) if k.func is not None
             and "concatenate" in k.func_name and "depthwise" in k.func_name]
    assert len(found) == 1, [k.func_name for k in plan_kernels(blocked)]
    kernel = found[0]
    sch = s_tir.Schedule(kernel.func)
    root = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert not any(n.startswith(("pad", "T_concat")) for n in root), root
    assert parallel_loops(kernel.func) == int(kernel.detail["parallel_regions"])
    x = RNG.standard_normal((1, 32, 28, 28)).astype("float32")
    np.testing.assert_allclose(_run(blocked, x), _run(native, x), rtol=1e-4, atol=1e-4)


def test_channel_vector_conv_weights_are_packed_at_compile_time():
    """The NCHW channel-vector conv kernel reads its constant weight packed
    ``[f // fr, c, kh, kw, f % fr]`` at compile time (PrepackWeights), not repacked on
    every call (MixNet-S's SE expand convs: 59 -> 6 us, the model 1.13x faster)."""
    from fusion_tvm.passes.prepack_weights import PREPACK_ATTR, _blocks

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 1, 1), "float32"))
    nn = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.sigmoid(nn.conv2d(nn.relu(x), _const(96, 24, 1, 1))))
            y = bb.emit_output(y)
        bb.emit_func_output(y)
    mod = bb.get()
    hw = get_hardware(HW)
    native = fusion_tvm.compile(mod, target=LLVMCPUBackend(layout="native"), hw=hw)
    ref = fusion_tvm.compile(mod, fusion="none", schedule=False)
    convs = [f for gv, f in native.fused_mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]
    assert len(convs) == 1 and convs[0].attrs[RULE_ATTR] == "conv2d"
    packed = [p for p in convs[0].params if len(p.ty.shape) == 5]
    assert len(packed) == 1, convs[0].script()
    assert not any(b.annotations and PREPACK_ATTR in b.annotations
                   for b in _blocks(convs[0].body))
    v = RNG.standard_normal((1, 24, 1, 1)).astype("float32")
    np.testing.assert_allclose(_run(native, v), _run(ref, v), rtol=1e-5, atol=1e-5)


def _group_norm_one_group(channels: int):
    """conv -> GroupNorm(1, C) as timm exports it (Reshape to [1, 1, -1],
    InstanceNormalization, Reshape back, per-channel Mul / Add) -> GELU-free 1x1 conv."""
    from benchmarks.zoo.builder import GraphBuilder

    g = GraphBuilder("group_norm_1")
    y = g.conv(g.add_input("x", [1, 16, 14, 14]), 16, channels, 3, bias=True)
    flat = g.op("Reshape", [y, g.ints([1, 1, -1])])
    normed = g.op("InstanceNormalization", [flat, g.normal((1,), 0.1, "in.scale"),
                                            g.normal((1,), 0.1, "in.bias")], epsilon=1e-5)
    back = g.op("Reshape", [normed, g.ints([1, channels, 14, 14])])
    affine = g.op("Add", [g.op("Mul", [back, g.normal((channels, 1, 1), 1.0, "gamma")]),
                          g.normal((channels, 1, 1), 0.1, "beta")])
    g.add_output(g.conv(affine, channels, 16, 1, bias=True))
    return g.build()


def test_group_norm_with_one_group_stays_blocked():
    """A GroupNorm of one group flattens the tensor and normalises every element the same
    way: it runs on the blocked tensor flattened, so the only layout changes left are the
    network's input and output (PoolFormer and MobileViTv2 unblocked and re-blocked
    around each norm: 1.06x and 1.10x faster without). Channels the block does not divide
    (padded ones included) keep the NCHW round trip."""
    from fusion_tvm.frontend import load_model

    model = _group_norm_one_group(32)
    mod = ConvertToNCHWc(lanes=8)(load_model(model).mod)
    assert sorted(_layout_changes(mod)) == [("to_nchw", (1, 2, 14, 14, 8)),
                                            ("to_nchwc", (1, 16, 14, 14))]
    _matches_onnxruntime(model)
    # 36 channels, padded to 40 by PadChannels: the norm must not see the padding.
    _matches_onnxruntime(_group_norm_one_group(36))
