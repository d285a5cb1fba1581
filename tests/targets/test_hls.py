"""HLS backend: emitted projects compile with g++, C-simulate equal to onnxruntime, and fit.

Frozen boards (``zcu104``, ``u250`` presets, a tiny spec built here) keep the plans and
the estimates deterministic. g++ builds use -O1; the models are small.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import fusion_tvm
from fusion_tvm.cost_models import FpgaResources, get_cost_model, get_hardware
from fusion_tvm.errors import CapacityError, UnsupportedOperatorError
from fusion_tvm.frontend import load_model
from fusion_tvm.graph import build_fusion_graph, default_dims
from fusion_tvm.grouping import vars_used_after
from fusion_tvm.pipeline import make_pipeline
from fusion_tvm.presets import fpga_spec
from fusion_tvm.targets import get_backend
from fusion_tvm.targets.hls import HLSBackend, HLSModel
from fusion_tvm.targets.hls import examples as ex
from fusion_tvm.targets.hls.cgen import DataType
from fusion_tvm.targets.hls.cost_model import (
    FpgaConfig,
    FpgaCostModel,
    NestCost,
    bram_blocks,
    choose_unroll,
)
from fusion_tvm.targets.hls.program import extract_program

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FIXED = "ap_fixed<16,6>"
MODELS = {
    "mlp": ex.mlp,
    "cnn": ex.small_cnn,
    "transformer": ex.transformer_block,
}


def _input(model, seed=1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _fits(cm: HLSModel) -> None:
    r = cm.summary()["resources"]
    assert 0 < r["dsp"] <= r["dsp_budget"]
    assert 0 <= r["bram_18k"] <= r["bram_budget"]


@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request):
    model = MODELS[request.param]()
    cm = fusion_tvm.compile(model, target="hls", hw="zcu104")
    return request.param, model, cm


# ------------------------------------------------------------------- registration
def test_backend_and_cost_model_registered():
    be = get_backend("hls")
    assert be.default_hardware == "zcu104" and be.default_cost_model == "fpga"
    assert be.device_kind.value == "fpga"
    assert get_backend("fpga").name == "hls"
    assert isinstance(get_cost_model("fpga", get_hardware("zcu104"), be), FpgaCostModel)


def test_fpga_model_needs_fpga_spec():
    with pytest.raises(fusion_tvm.errors.InvalidHardwareSpecError, match="FPGA"):
        get_cost_model("fpga", get_hardware("ci-x86-avx2"))


# --------------------------------------------------------------------- end to end
def test_float_csim_matches_onnxruntime(built):
    name, model, cm = built
    feeds = _input(model)
    ref = ex.reference(model, feeds)
    out = cm.run(feeds)
    assert len(out) == len(ref)
    for o, r in zip(out, ref, strict=True):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5)
    # a second run reuses the compiled simulation
    out2 = cm.run(_input(model, seed=2))
    np.testing.assert_allclose(out2[0], ex.reference(model, _input(model, seed=2))[0],
                               rtol=1e-4, atol=1e-5)
    assert cm.num_kernels == cm.plan.num_kernels >= 1


def test_design_fits_board_and_report(built):
    _, _, cm = built
    _fits(cm)
    s = cm.summary()
    assert s["latency_cycles"] > 0 and s["latency_us"] > 0
    assert s["interval_cycles"] <= s["latency_cycles"]
    for g in s["groups"]:
        assert g["cycles"] > 0 and g["ii"] >= 1 and g["dsp"] >= 0 and g["bram_18k"] >= 0
        assert all(n["unroll"] >= 1 for n in g["nests"])
    text = cm.report()
    for word in ("cycles", "II", "DSP", "BRAM18K", "end-to-end latency", "/ 1728", "/ 624"):
        assert word in text
    assert text.count("\n") >= 6 + len(s["groups"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fixed_point_error_is_bounded(name):
    model = MODELS[name]()
    feeds = _input(model)
    ref = ex.reference(model, feeds)
    cm = fusion_tvm.compile(model, target=HLSBackend(precision=FIXED), hw="zcu104")
    assert "ap_fixed<16, 6" in cm.summary()["precision"]
    err = cm.precision_error(feeds, reference=ref)
    assert err["max_abs_error"] < 0.05, err
    assert err["max_abs_error"] > 0  # it is really fixed point
    _fits(cm)


def test_export_is_a_vitis_project(built, tmp_path):
    name, _, cm = built
    path = tmp_path / name
    cm.export(path)
    for rel in ("model.cpp", "model.h", "weights.h", "tb.cpp", "run_hls.tcl", "report.json",
                "include/ft_hls.h"):
        assert (path / rel).is_file(), rel
    src = (path / "model.cpp").read_text()
    for pragma in ("#pragma HLS DATAFLOW", "#pragma HLS PIPELINE II=", "#pragma HLS STREAM",
                   "#pragma HLS INTERFACE m_axi", "#pragma HLS INTERFACE s_axilite",
                   "hls::stream<data_t>"):
        assert pragma in src, pragma
    assert "static const data_t W_" in (path / "weights.h").read_text()
    tcl = (path / "run_hls.tcl").read_text()
    assert "csim_design" in tcl and "csynth_design" in tcl and "xczu7ev" in tcl
    assert src.count("static void g") == cm.num_kernels


def test_unroll_and_partition_pragmas():
    cm = fusion_tvm.compile(ex.mlp(), target="hls", hw="zcu104")
    src = cm.design.kernels[0].code
    assert "#pragma HLS UNROLL factor=" in src
    assert "#pragma HLS ARRAY_PARTITION variable=" in src


# ----------------------------------------------------------- FPGA vs CPU planning
def _plan(model, target, hw):
    parts = make_pipeline(target=target, hw=hw)
    with parts.target:
        parts.fuse(parts.prepare(load_model(model).mod))
    return parts.fuse_pass.plan


def test_fpga_plans_differently_from_cpu():
    """Small MLP: on the CPU the two layers are one kernel of two stages, each matmul
    scheduled by its own template (``staged_chain``); on the FPGA they chain in one
    dataflow process (the stream hand-off between processes costs cycles, and the DSP
    share is enough for both). Wide MLP: the FPGA splits the group again, differently from
    the CPU, because two big matmuls in one process would share one DSP budget (lower
    unroll, more cycles) -- the fused estimate says so."""
    from fusion_tvm.chain_stages import chain_stages

    small = ex.mlp()
    cpu = _plan(small, "llvm", "ci-x86-avx2")
    fpga = _plan(small, "hls", "zcu104")
    assert cpu.num_kernels == 1 and fpga.num_kernels == 1
    cpu_block = cpu.blocks[0]
    assert len(chain_stages(cpu_block.graph, frozenset(cpu_block.groups[0]))) == 2
    assert cpu.cost_model == "roofline" and fpga.cost_model == "fpga"

    wide = ex.mlp(batch=64, d_in=128, hidden=128, d_out=128)
    cpu = _plan(wide, "llvm", "ci-x86-avx2")
    fpga = _plan(wide, "hls", "zcu104")
    assert fpga.num_kernels == 2
    assert [g.ops for g in fpga.groups] != [g.ops for g in cpu.groups]
    block = fpga.blocks[0]
    graph, model = block.graph, fpga.cost_model_obj
    chosen = sum(model.estimate(graph, g).time_s for g in block.groups)
    everything = frozenset(i for g in block.groups for i in g)
    fused = model.estimate(graph, everything)
    assert fused.feasible and fused.time_s > chosen
    split_unroll = {name: u for g in block.groups
                    for name, u in model.estimate(graph, g).detail["unroll"].items()}
    shared = [n for n in fused.detail["unroll"] if n in split_unroll]
    assert shared and all(split_unroll[n] >= fused.detail["unroll"][n] for n in shared)
    assert any(split_unroll[n] > fused.detail["unroll"][n] for n in shared)
    dsp_budget = get_hardware("zcu104").fpga.dsp * FpgaConfig().dsp_share
    assert all(model.estimate(graph, g).detail["dsp"] <= dsp_budget for g in block.groups)


# ------------------------------------------------------------------ cost model units
def test_bram_blocks():
    assert bram_blocks(16, 32) == 0  # LUTRAM
    assert bram_blocks(512, 32) == 1 and bram_blocks(513, 32) == 2
    assert bram_blocks(1024, 16) == 1
    assert bram_blocks(4096, 32, partition=8) == 8


def test_unroll_respects_dsp_budget():
    nest = NestCost("mm", trips=64 * 64 * 64, inner_extent=64, ops={"mul": 1, "add": 1},
                    accumulates=True)
    for budget in (5, 40, 200, 10_000):
        (n,) = choose_unroll([nest], fixed=False, dsp_budget=budget)
        assert n.dsp <= max(budget, 5)
        assert n.unroll == 1 or n.dsp <= budget
    (small,) = choose_unroll([nest], fixed=False, dsp_budget=40)
    (big,) = choose_unroll([nest], fixed=False, dsp_budget=10_000)
    assert big.unroll == 64 and small.unroll == 8 and big.cycles < small.cycles
    (fx,) = choose_unroll([nest], fixed=True, dsp_budget=40)
    assert fx.unroll == 32 and fx.ii == 1  # fixed point: 1 DSP per MAC, no adder latency


def _tiny_board(dsp=64, bram=8):
    res = FpgaResources(dsp=dsp, bram_18k=bram, uram=0, lut=20000, ff=40000, clock_hz=100e6)
    return fpga_spec("tiny", "xc7z010", res, 4.0, bram * 2304)


def test_infeasible_group_is_never_planned():
    """On a board with 16 DSPs the whole MLP in one process needs more DSPs than exist:
    the model says infeasible (with the reason) and the search splits it."""
    hw = _tiny_board(dsp=16, bram=64)
    model = ex.mlp()
    parts = make_pipeline(target="hls", hw=hw)
    with parts.target:
        mod = parts.prepare(load_model(model).mod)
    cm = parts.fuse_pass.cost_model
    fn = mod["main"]
    graph = build_fusion_graph(mod, fn.body.blocks[0], vars_used_after(fn, 0),
                               default_dims(mod))
    cost = cm.estimate(graph, frozenset(graph.fusible_nodes))
    assert not cost.feasible and "DSP" in cost.reason and "16" in cost.reason
    with parts.target:
        parts.fuse(mod)
    groups = parts.fuse_pass.plan.blocks[0].groups
    assert len([g for g in groups if cm.estimate(graph, g).detail]) >= 2
    for g in groups:
        assert cm.estimate(graph, g).feasible or len(g) == 1


# ---------------------------------------------------------------- capacity, weights
def test_capacity_error_names_group_and_resource():
    big = ex.mlp(batch=512, d_in=8, hidden=1024, d_out=8)  # 512x1024 fp32 intermediate
    with pytest.raises(CapacityError, match=r"group '.*matmul.*'.*BRAM18K.*zcu104"):
        fusion_tvm.compile(big, target="hls", hw="zcu104")


def test_weights_go_off_chip_when_bram_is_short():
    hw = _tiny_board(dsp=256, bram=40)
    model = ex.mlp(batch=2, d_in=64, hidden=256, d_out=8)
    cm = fusion_tvm.compile(model, target="hls", hw=hw)
    s = cm.summary()
    assert s["weights_off_chip"] and s["weights_on_chip"]
    assert any("const data_t* M_" in k.proto for k in cm.design.kernels)
    _fits(cm)
    feeds = _input(model)
    np.testing.assert_allclose(cm.run(feeds)[0], ex.reference(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_shared_weight_gets_one_port_per_process():
    """DATAFLOW wants one reader per array / m_axi port: a weight read by two processes is
    emitted once per process (and counted once per process in BRAM)."""
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((64, 64)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("MatMul", ["t", "W"], ["y"])]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    feeds = _input(model)
    ref = ex.reference(model, feeds)[0]
    for hw, kind in (("zcu104", "rom"), (_tiny_board(dsp=256, bram=12), "offchip")):
        cm = fusion_tvm.compile(model, target="hls", hw=hw, fusion="none")
        names = [p.cname for k in cm.design.kernels for p in k.ports.values() if p.kind == kind]
        assert len(names) == 2 and len(set(names)) == 2
        np.testing.assert_allclose(cm.run(feeds)[0], ref, rtol=1e-4, atol=1e-5)


def test_u250_keeps_more_on_chip_than_zcu104():
    model = ex.mlp(batch=2, d_in=256, hidden=1024, d_out=256)
    small = fusion_tvm.compile(model, target="hls", hw="zcu104").summary()
    large = fusion_tvm.compile(model, target="hls", hw="u250").summary()
    assert small["weights_off_chip"] and not large["weights_off_chip"]
    assert large["latency_cycles"] < small["latency_cycles"]


# ------------------------------------------------------------ Relax bindings handled
def test_reshape_views_and_unfused_build():
    model = ex.small_cnn()
    feeds = _input(model)
    ref = ex.reference(model, feeds)[0]
    cm = fusion_tvm.compile(model, target="hls", hw="zcu104", fusion="none")
    np.testing.assert_allclose(cm.run(feeds)[0], ref, rtol=1e-4, atol=1e-5)
    # after RewriteDataflowReshape, reshapes are R.reshape calls: aliases of the stream
    mod = relax.transform.RewriteDataflowReshape()(cm.fused_mod)
    ops = set()
    relax.analysis.post_order_visit(
        mod["main"].body, lambda e: ops.add(getattr(getattr(e, "op", None), "name", "")))
    assert "relax.reshape" in ops
    loaded = load_model(model)
    parts = make_pipeline(target="hls", hw="zcu104", fusion="none")
    view = HLSBackend().build_model(mod, loaded, parts, None)
    np.testing.assert_allclose(view.run(feeds)[0], ref, rtol=1e-4, atol=1e-5)
    assert view.num_kernels < len(extract_program(cm.fused_mod).kernels) + 1


def _split_model():
    """MatMul -> Split -> Tanh * other half; the MatMul output is also a model output."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Split", ["h"], ["a", "b"], axis=1, num_outputs=2),
             helper.make_node("Tanh", ["a"], ["ta"]),
             helper.make_node("Mul", ["ta", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("fusion", ["cost", "none"])
def test_tuple_outputs_and_fan_out(fusion, tmp_path):
    model = _split_model()
    feeds = _input(model)
    ref = ex.reference(model, feeds)
    cm = fusion_tvm.compile(model, target="hls", hw="zcu104", fusion=fusion)
    out = cm.run(feeds)
    assert [o.shape for o in out] == [(4, 4), (4, 8)]
    for o, r in zip(out, ref, strict=True):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5)
    cm.export(tmp_path, feeds=feeds)
    assert (tmp_path / "io" / "in0.bin").stat().st_size == 4 * 8 * 4
    assert "data_t* out1" in (tmp_path / "model.h").read_text()


@pytest.mark.parametrize("name,board", [("gpt2_tiny", "u250"), ("bert_tiny", "u250")])
def test_tiny_transformer_fixtures_with_integer_inputs(name, board):
    """Token ids / masks (int64) stream as integers; embeddings (Gather), masks with -inf
    weights, GELU and LayerNorm all simulate equal to onnxruntime."""
    import onnx

    model = onnx.load(Path(__file__).resolve().parents[1] / "data" / f"{name}.onnx")
    rng = np.random.default_rng(0)
    feeds, shapes = {}, {}
    for inp in model.graph.input:
        shapes[inp.name] = [1, 8]
        if "mask" in inp.name:
            feeds[inp.name] = np.ones((1, 8), np.int64)
        else:
            high = 2 if "type" in inp.name else 50
            feeds[inp.name] = rng.integers(0, high, (1, 8)).astype(np.int64)
    ref = ex.reference(model, feeds)
    cm = fusion_tvm.compile(model, target="hls", hw=board, shape_dict=shapes)
    out = cm.run(feeds)
    for o, r in zip(out, ref, strict=True):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5)
    _fits(cm)


def test_unsupported_binding_is_a_clear_error():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.softmax(x))  # left unlegalized
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    with pytest.raises(UnsupportedOperatorError, match="softmax"):
        extract_program(bb.get())


def test_precision_parsing():
    assert DataType.parse("float").ctype == "float"
    dt = DataType.parse("ap_fixed<16,6>")
    assert dt.is_fixed and dt.width == 16 and dt.int_bits == 6
    assert dt.literal(1e9) == "data_t(31.9990234375)"
    with pytest.raises(ValueError):
        DataType.parse("half")
    assert tvm is not None
