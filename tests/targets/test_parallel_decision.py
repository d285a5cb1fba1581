"""The LLVM-CPU parallel decision: one helper, from the HardwareSpec, for rules and model.

A loop runs in parallel only when its predicted serial time exceeds a few thread-pool
fork/joins (``HardwareSpec.parallel_overhead_s``); the roofline model, through the
backend's ``parallel_regions`` hook, charges exactly the parallel loops the rules emit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, tirx

import fusion_tvm
from fusion_tvm.calibration.kernels import plan_kernels
from fusion_tvm.calibration.micro import parallel_loops
from fusion_tvm.ops import OpClass
from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule
from fusion_tvm.pipeline import lower_passes
from fusion_tvm.presets import get_hardware
from fusion_tvm.targets.llvm_cpu.parallel import (
    PARALLEL_WORK_FACTOR,
    elementwise_seconds,
    matmul_tile_pays,
    parallel_pays,
    serial_seconds,
)

HW = get_hardware("ci-x86-avx2")  # 2 cores, 10 us per fork/join
TARGET = tvm.target.Target(dict(HW.target))
RNG = np.random.default_rng(0)


def test_helper_decides_from_the_spec():
    small = elementwise_seconds(HW, 64 * 256, 12.0)  # bias + ReLU, 64 x 256
    large = elementwise_seconds(HW, 1024 * 1024, 12.0)
    assert small < PARALLEL_WORK_FACTOR * HW.parallel_overhead_s < large
    assert not parallel_pays(HW, small, chunks=64)
    assert parallel_pays(HW, large, chunks=1024)
    # Too few chunks for two per thread, one core, or a symbolic (unknown) size.
    assert not parallel_pays(HW, large, chunks=3)
    assert not parallel_pays(replace(HW, num_cores=1, parallel_overhead_s=0.0), large, 1024)
    assert parallel_pays(HW, None)
    # The same work is parallel once the fork/join is cheap enough.
    assert parallel_pays(replace(HW, parallel_overhead_s=0.1 * small), small, chunks=64)
    # A slower calibrated elementwise efficiency makes the same loop worth it.
    slow = replace(HW, efficiency={"elementwise": 0.01})
    assert serial_seconds(slow, {OpClass.ELEMENTWISE: 1.0}) > serial_seconds(
        HW, {OpClass.ELEMENTWISE: 1.0})
    assert parallel_pays(slow, elementwise_seconds(slow, 64 * 256, 12.0), 64)
    # GEMM tiles: a 64^3 GEMM is serial, a 512^3 one parallel.
    assert not matmul_tile_pays(HW, 2 * 64**3, 64)
    assert matmul_tile_pays(HW, 2 * 512**3, 1024)


def _bias_relu(rows: int, cols: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    b = relax.Var("b", relax.TensorType((cols,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(x, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _matmul(m: int, k: int, n: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def _lower(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])(mod)


def _scheduled(mod: tvm.IRModule, rule: str) -> tuple[tvm.IRModule, tirx.PrimFunc]:
    scheduled = ApplyTargetSchedule("llvm", HW)(_lower(mod))
    funcs = [f for _, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert [str(f.attrs[RULE_ATTR]) for f in funcs] == [rule]
    return scheduled, funcs[0]


def _check_equal(mod: tvm.IRModule, scheduled: tvm.IRModule, shapes) -> None:
    def vm(m):
        ex = tvm.compile(m, TARGET, relax_pipeline=tvm.transform.Sequential(lower_passes()))
        return relax.VirtualMachine(ex, tvm.cpu())

    args = [tvm.runtime.tensor(RNG.standard_normal(s).astype("float32")) for s in shapes]
    np.testing.assert_allclose(vm(scheduled)["main"](*args).numpy(),
                               vm(_lower(mod))["main"](*args).numpy(), rtol=1e-4, atol=1e-4)


def _parallel_fors(func: tirx.PrimFunc) -> list:
    sch = s_tir.Schedule(func)
    loops = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops += [sch.get(lp) for lp in sch.get_loops(block)]
    return [lp for lp in loops if lp.kind == tirx.stmt.ForKind.PARALLEL]


@pytest.mark.parametrize("rows,cols,parallel", [(64, 256, False), (1024, 1024, True)])
def test_elementwise_serial_when_small(rows, cols, parallel):
    mod = _bias_relu(rows, cols)
    scheduled, func = _scheduled(mod, "elementwise")
    assert bool(_parallel_fors(func)) == parallel
    assert "T.vectorized" in func.script()
    _check_equal(mod, scheduled, [(rows, cols), (cols,)])


@pytest.mark.parametrize("size,parallel", [(32, False), (384, True)])
def test_matmul_tiles_serial_when_small(size, parallel):
    mod = _matmul(size, size, size)
    scheduled, func = _scheduled(mod, "matmul")
    assert bool(_parallel_fors(func)) == parallel
    _check_equal(mod, scheduled, [(size, size), (size, size)])


@pytest.mark.parametrize("model,overhead_s", [("mlp", None), ("bert_2l", None),
                                              ("bert_2l", 2e-7), ("vit_tiny", 2e-7),
                                              ("resnet18", None),
                                              pytest.param("mobilenetv2", 2e-7,
                                                           marks=pytest.mark.slow)])
def test_model_regions_equal_scheduled_parallel_loops(model, overhead_s):
    """The cost model's parallel regions (backend hook) equal the scheduled kernel's, with
    the preset's fork/join (small models: mostly serial) and a nearly free one (parallel)."""
    from benchmarks import zoo

    hw = HW if overhead_s is None else replace(HW, parallel_overhead_s=overhead_s)
    cm = fusion_tvm.compile(zoo.get_model(model, small=True), target="llvm", hw=hw)
    checked = []
    for k in plan_kernels(cm):
        if k.func is None or k.rule not in ("matmul", "elementwise", "reduction", "attention",
                                            "flash_attention", "staged_chain", "conv2d",
                                            "conv2d_nchwc"):
            continue
        checked.append((k.func_name, parallel_loops(k.func),
                        int(k.detail.get("parallel_regions", -1))))
    assert checked  # (a whole MLP is one staged kernel)
    assert [c for c in checked if c[1] != c[2]] == [], checked
    if overhead_s is not None:
        assert sum(c[1] for c in checked) >= 3  # the cheap fork/join parallelises kernels


def _conv(channels: int, size: int, kernel: int, pad: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels, kernel, kernel), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=pad))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("channels,size,kernel,pad,parallel",
                         [(16, 2, 3, 1, False), (64, 56, 1, 0, True), (64, 56, 3, 1, True)])
def test_conv_rows_parallel_only_when_they_pay(channels, size, kernel, pad, parallel):
    """A conv with a 2 x 2 output (4 tasks for 2 threads x 2 chunks, ~10 us of work) stays
    serial; a 1 x 1 conv reads its input in place (TOPI's zero-width padding copy is
    inlined: no spatial pass of its own), a padded one materialises the padding."""
    mod = _conv(channels, size, kernel, pad)
    scheduled, func = _scheduled(mod, "conv2d")
    names = [b.name_hint for b in _root_block_stmts(func)]
    assert ("pad_temp" in names) == (pad > 0), names
    assert bool(_parallel_fors(func)) == parallel
    _check_equal(mod, scheduled, [(1, channels, size, size),
                                  (channels, channels, kernel, kernel)])


def _pointwise_on_a_pixel(c_in: int, c_out: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c_in, 1, 1), "float32"))
    w = relax.Var("w", relax.TensorType((c_out, c_in, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w)))
        bb.emit_func_output(out)
    return bb.get()


def test_conv_on_one_pixel_parallel_for_its_weight_stream():
    """A 2048 -> 512 conv on a 1 x 1 image (a pooled ASPP branch) is 2 MFLOP, too little
    arithmetic for the fork/join, but streams 4 MB of filters: its output channels run in
    parallel, as a GEMV's panels do, and the kernel model counts the same loop."""
    mod = _pointwise_on_a_pixel(2048, 512)
    scheduled, func = _scheduled(mod, "conv2d")
    assert _parallel_fors(func)
    _check_equal(mod, scheduled, [(1, 2048, 1, 1), (512, 2048, 1, 1)])
    cm = fusion_tvm.compile(mod, target="llvm", hw=HW)
    (k,) = [k for k in plan_kernels(cm) if k.rule.startswith("conv2d")]
    assert parallel_loops(k.func) == int(k.detail["parallel_regions"]) >= 1


def _one_module(shape, body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _from_blocked(bb, x):  # NCHW16c -> NCHW, as ConvertToNCHWc's to_nchw
    return bb.emit_te(lambda t: te.compute(
        (1, 64, 56, 56), lambda n, c, h, w: t[n, c // 16, h, w, c % 16], name="to_nchw"), x)


def test_layout_change_to_nchw_reads_tiles_of_channel_lanes():
    """NCHW16c -> NCHW: the 16 channel lanes of a pixel are one 64-byte line; read back a
    row at a time, every line was touched 16 times from L2 (144 us for 64 x 56 x 56). The
    channel lane loop (16) sits just outside the output's vector, so a tile of lines is used
    whole from L1; the tiles run in parallel."""
    mod = _one_module((1, 4, 56, 56, 16), _from_blocked)
    scheduled, func = _scheduled(mod, "elementwise")
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loops = [sch.get(lp) for lp in sch.get_loops(block)]
    assert [lp.kind for lp in loops[-2:]] == [tirx.ForKind.SERIAL, tirx.ForKind.VECTORIZED]
    assert int(loops[-2].extent) == 16 and loops[0].kind == tirx.ForKind.PARALLEL
    _check_equal(mod, scheduled, [(1, 4, 56, 56, 16)])


def test_one_long_row_runs_its_vectors_in_parallel():
    """A (1, 1, 200704) output is one row: its vectors are the parallel chunks (the rows
    alone were one chunk, so the whole pass ran on one core), and the model counts it."""
    mod = _one_module((1, 1, 200704), lambda bb, x: relax.op.nn.relu(x))
    scheduled, func = _scheduled(mod, "elementwise")
    (par,) = _parallel_fors(func)
    assert int(par.extent) == 200704 // 16 or int(par.extent) == 200704 // 8
    _check_equal(mod, scheduled, [(1, 1, 200704)])
    cm = fusion_tvm.compile(mod, target="llvm", hw=HW)
    (k,) = plan_kernels(cm)
    assert parallel_loops(k.func) == int(k.detail["parallel_regions"]) == 1


def test_spatial_parallel_loop_fuses_only_the_loops_it_needs():
    """A (12, 114, 114, 8) pass: the parallel loop fuses the channel blocks and rows (enough
    iterations for every thread), the columns stay a serial loop around the lane vector
    (all fused, each 8-lane vector recomputed its indices by division: a MixNet prologue
    4x slower)."""
    mod = _one_module((12, 114, 114, 8), lambda bb, x: relax.op.nn.relu(x))
    scheduled, func = _scheduled(mod, "elementwise")
    (par,) = _parallel_fors(func)
    assert int(par.extent) == 12 * 114
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    kinds = [(sch.get(lp).kind, int(sch.get(lp).extent)) for lp in sch.get_loops(block)]
    assert kinds == [(tirx.stmt.ForKind.PARALLEL, 12 * 114), (tirx.stmt.ForKind.SERIAL, 114),
                     (tirx.stmt.ForKind.VECTORIZED, 8)]
    _check_equal(mod, scheduled, [(12, 114, 114, 8)])


def _root_block_stmts(func: tirx.PrimFunc) -> list:
    sch = s_tir.Schedule(func)
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _inverted_residual(channels: int, expand: int, size: int, stride: int):
    """1 x 1 expand conv -> bias -> ReLU6 -> 3 x 3 depthwise -> bias -> ReLU6 (MobileNetV2)."""
    wide = channels * expand
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w1 = relax.Var("w1", relax.TensorType((wide, channels, 1, 1), "float32"))
    b1 = relax.Var("b1", relax.TensorType((1, wide, 1, 1), "float32"))
    w2 = relax.Var("w2", relax.TensorType((wide, 1, 3, 3), "float32"))
    b2 = relax.Var("b2", relax.TensorType((1, wide, 1, 1), "float32"))
    with bb.function("main", [x, w1, b1, w2, b2]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.nn.conv2d(x, w1), b1))
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            y = bb.emit(relax.op.nn.conv2d(y, w2, strides=stride, padding=1, groups=wide))
            out = bb.emit_output(relax.op.clip(relax.op.add(y, b2), 0.0, 6.0))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("channels,size,stride", [(24, 56, 2), (16, 28, 1)])
def test_depthwise_prologue_priced_as_the_kernel_runs(channels, size, stride):
    """A bias + ReLU6 between a 1 x 1 conv and a depthwise conv goes with the 1 x 1 conv
    (its epilogue, computed in registers) rather than in front of the depthwise conv: there
    it reads a second tensor (the bias), so the depthwise rule stages a padded copy of its
    input in a parallel pass while its own rows stay serial. The model once counted that
    pass as the kernel's parallelism (half the time) and chose it; MobileNetV2's three such
    kernels ran 1.5-3x slower in the model than the depthwise conv alone (24 x 6 channels,
    56 x 56, stride 2 is its first)."""
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

    mod = _inverted_residual(channels, 6, size, stride)
    cm = fusion_tvm.compile(mod, target="llvm", hw=HW)
    graph = cm.plan.blocks[0].graph
    convs = [n.id for n in graph.nodes if n.is_contraction]
    assert len(convs) == 2
    between = {n.id for n in graph.nodes if convs[0] < n.id < convs[1] and n.fusible
               and not n.func_name.startswith(("te_layout", "to_nchw"))}
    assert len(between) == 2, [graph.nodes[i].func_name for i in between]  # add, clip
    owner = {i: k for k, g in enumerate(cm.plan.groups) for i in g.node_ids}
    assert {owner[i] for i in between} == {owner[convs[0]]}
    assert owner[convs[1]] != owner[convs[0]]
    # The other plan, as the backend reports it: a staged padded input.
    prologue = frozenset(between | {i for i, k in owner.items() if k == owner[convs[1]]})
    traits = LLVMCPUBackend().kernel_traits(graph, prologue, "conv2d", HW)
    assert traits is not None and traits.staged_bytes > 0
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
             for p in mod["main"].params]
    want = fusion_tvm.compile(mod, target="llvm", hw=HW, fusion="none").run(feeds)[0]
    np.testing.assert_allclose(cm.run(feeds)[0], want, rtol=1e-4, atol=1e-4)


def _depthwise(channels: int, size: int, stride: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, 1, 5, 5), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=2, groups=channels))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("channels,size,stride", [(58, 56, 2), (36, 28, 1)])
def test_nchw_grouped_conv_priced_off_the_fast_path(channels, size, stride):
    """A depthwise conv no channel block divides stays in NCHW, where it runs ~6x slower
    per FLOP than the conv rule's calibrated rate (GhostNet's 5 x 5 / 2 at 16 GFLOP/s,
    predicted 3.6x too fast): the kernel model scales its compute by ``NCHW_PENALTY``, and
    the rule and the model take the parallel decision on the scaled work alike."""
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend
    from fusion_tvm.targets.llvm_cpu.efficiency import NCHW_PENALTY

    mod = _depthwise(channels, size, stride)
    cm = fusion_tvm.compile(mod, target="llvm", hw=HW)
    kernels = [k for k in plan_kernels(cm) if k.rule == "conv2d"]
    assert len(kernels) == 1, [(k.func_name, k.rule) for k in plan_kernels(cm)]
    kernel = kernels[0]
    assert parallel_loops(kernel.func) == int(kernel.detail["parallel_regions"])
    graph = cm.plan.blocks[0].graph
    group = next(g for g in cm.plan.groups if g.kernel == kernel.func_name)
    traits = LLVMCPUBackend().kernel_traits(graph, frozenset(group.node_ids), "conv2d", HW)
    assert traits is not None and traits.compute_scale == NCHW_PENALTY
    assert traits.main_parallel  # at 1x the work both would stay serial at these sizes
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
             for p in mod["main"].params]
    want = fusion_tvm.compile(mod, target="llvm", hw=HW, fusion="none").run(feeds)[0]
    np.testing.assert_allclose(cm.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
