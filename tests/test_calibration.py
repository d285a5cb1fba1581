"""Calibration: quick micro-benchmarks give a valid spec; RPC loopback; prediction report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from fusion_tvm.calibration import calibrate_full, cli_main, make_runner  # noqa: E402
from fusion_tvm.calibration.micro import (  # noqa: E402
    RULES,
    aggregate,
    kernel_efficiency,
    measure_call,
    measure_launch,
    monotone,
    triad_func,
)
from fusion_tvm.calibration.report import median_ape, spearman  # noqa: E402
from fusion_tvm.hardware import HardwareSpec  # noqa: E402
from fusion_tvm.presets import get_hardware  # noqa: E402
from fusion_tvm.targets import get_backend  # noqa: E402


@pytest.fixture(scope="module")
def quick():
    """One quick calibration of this machine, shared by the tests below."""
    return calibrate_full("host")


# ------------------------------------------------------------------------------ pure parts
def test_spearman_and_error():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) > 0.9  # ties averaged
    assert np.isnan(spearman([1, 2], [1, 2]))
    assert median_ape([1.1, 0.5, 2.0], [1.0, 1.0, 2.0]) == pytest.approx(0.1)


def test_monotone_bandwidths():
    assert monotone([50.0, 80.0, 30.0, 10.0]) == [80.0, 80.0, 30.0, 10.0]
    assert monotone([5.0, 4.0, 3.0]) == [5.0, 4.0, 3.0]


def test_kernel_efficiency_bounds():
    assert kernel_efficiency(1.0, 0.0, 2.0) == pytest.approx(0.5)
    assert kernel_efficiency(1.0, 0.0, 0.1) == 1.5  # capped as the spec validator requires
    assert kernel_efficiency(1.0, 3.0, 2.0) == 1.5  # internal traffic explains it all


def test_triad_is_valid_tir():
    func = triad_func(2, 8, 16, 3)
    assert len(func.params) == 2


# ----------------------------------------------------------------------------- calibration
def test_quick_calibration_spec(quick, tmp_path):
    spec = quick.spec
    assert isinstance(spec, HardwareSpec) and spec.name == "host-calibrated"
    bws = [lvl.bandwidth_bytes_per_s for lvl in spec.memory]
    assert all(b > 1e8 for b in bws)  # > 0.1 GB/s
    assert bws == sorted(bws, reverse=True)
    assert bws[0] > bws[-1]  # L1 faster than DRAM
    assert 1e-8 <= spec.launch_overhead_s <= 1e-4
    assert set(spec.efficiency) >= {"matmul", "conv2d", "reduction", "elementwise"}
    assert all(0 < e <= 1.5 for e in spec.efficiency.values())
    # Capacities and peaks come from the preset.
    base = get_hardware("host")
    assert [lvl.capacity_bytes for lvl in spec.memory] == [
        lvl.capacity_bytes for lvl in base.memory]
    from fusion_tvm.ops import OpClass

    for cls in OpClass:
        assert spec.peak_flops[cls] == base.peak_flops[cls]
    # The JSON round trip is what get_hardware(path) reads.
    path = tmp_path / "host.json"
    path.write_text(json.dumps(spec.to_json()))
    assert get_hardware(str(path)) == spec


def test_rule_coverage(quick):
    rules = {k.rule for k in quick.kernels}
    assert rules <= set(RULES)
    assert set(RULES) <= rules  # every rule has a representative kernel
    assert aggregate(quick.kernels).keys() == set(RULES)
    assert any(k.calibrates == "transcendental" for k in quick.kernels)


def test_transcendental_peak_is_measured(quick):
    from fusion_tvm.ops import OpClass

    # Measured and recorded; the spec keeps the preset's peak unless asked (see micro).
    assert 1e6 < quick.transcendental_flops_per_s < 1e13
    preset = get_hardware("host").peak_flops[OpClass.TRANSCENDENTAL]
    assert quick.spec.peak_flops[OpClass.TRANSCENDENTAL] == preset


def test_cli_writes_spec(tmp_path, monkeypatch, quick):
    import fusion_tvm.calibration as cal

    monkeypatch.setattr(cal, "calibrate_full", lambda *a, **k: quick)
    out = tmp_path / "spec.json"
    assert cli_main(["-o", str(out), "--details", str(tmp_path / "d.json")]) == 0
    assert HardwareSpec.from_json(out) == quick.spec
    assert "kernels" in json.loads((tmp_path / "d.json").read_text())


def test_fusion_tvm_cli_hands_over(tmp_path, monkeypatch, quick):
    import fusion_tvm.calibration as cal
    from fusion_tvm.cli import main

    monkeypatch.setattr(cal, "calibrate_full", lambda *a, **k: quick)
    out = tmp_path / "spec.json"
    assert main(["hw", "calibrate", str(out)]) == 0
    assert HardwareSpec.from_json(out).name == "host-calibrated"
    assert main(["hw", "calibrate", "--", "-o", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "b.json").is_file()


# ------------------------------------------------------------------------------------ RPC
def test_rpc_loopback():
    rpc = pytest.importorskip("tvm.rpc")
    from fusion_tvm.calibration.remote import LocalServer, benchmark_kernel, echo, remote_runner

    hw = get_hardware("host")
    try:
        server = LocalServer("127.0.0.1").__enter__()
    except Exception as err:  # noqa: BLE001 - an RPC-less wheel skips, it does not fail
        pytest.skip(f"RPC server unavailable: {err}")
    try:
        session = server.connect()
        assert isinstance(session, rpc.RPCSession)
        np.testing.assert_array_equal(echo(session, np.arange(4, dtype="float32")),
                                      np.arange(4, dtype="float32"))
        runner = remote_runner(session, hw)
        try:
            call = measure_call(runner)
            launch, chain = measure_launch(runner)
        finally:
            runner.close()
        assert 0 < call < 1e-3
        assert 0 < launch < 1e-3 and set(chain) == {1, 32, 96}
        t = benchmark_kernel(session, hw, triad_func(2, 64, 16, 2))
        assert 0 < t < 1.0
    finally:
        server.__exit__(None, None, None)


# --------------------------------------------------------------------------- report smoke
def test_prediction_report_structure(quick):
    from fusion_tvm.calibration.report import zoo_report

    runner = make_runner(quick.spec)
    report = zoo_report(["mlp"], quick.spec, runner, quick.call_s, rounds=2)
    d = report.to_json()
    assert d["hardware"]["name"] == "host-calibrated"
    (model,) = d["models"]
    assert model["model"] == "mlp" and model["kernels"] == len(d["kernels"]) >= 1
    assert model["measured_s"] > 0 and model["measured_fuseops_s"] > 0
    assert model["predicted_speedup"] is not None and model["measured_speedup"] > 0
    rules = {r.name for r in get_backend("llvm").schedule_rules(quick.spec)}
    for k in d["kernels"]:
        assert k["predicted_s"] > 0 and k["measured_s"] > 0
        assert k["rule"] in rules  # (the whole MLP: one staged_chain kernel)
    assert not model["skipped"]  # every kernel of the plan found in fused_mod and timed
    assert set(d["summary"]) >= {"spearman", "median_ape", "median_speedup_error"}
    assert "mlp" in report.table()


def test_models_report_over_named_models(quick, tmp_path):
    """Any (name, model, feeds) triples: held-out rows marked, a failing model listed with
    keep_going (raised without), the callback called after every model."""
    from benchmarks import zoo
    from fusion_tvm.calibration.report import models_report

    runner = make_runner(quick.spec)
    model = zoo.get_model("mlp", small=True)
    missing = str(tmp_path / "missing.onnx")
    with pytest.raises(Exception, match="missing"):
        models_report([("gone", missing, {})], quick.spec, runner, quick.call_s)
    seen = []
    report = models_report(
        [("tiny", model, zoo.example_inputs(model)), ("gone", missing, {})], quick.spec,
        runner, quick.call_s, rounds=2, held_out={"tiny"}, keep_going=True,
        on_model=lambda r: seen.append((len(r.models), len(r.failed))))
    assert seen == [(1, 0), (1, 1)]
    assert "missing" in report.failed["gone"]
    (row,) = report.models
    assert row.model == "tiny" and row.held_out and row.kernels >= 1
    assert row.predicted_ratio == pytest.approx(row.predicted_s / row.measured_s)
    s = report.summary()
    assert (s["models"], s["failed"], s["speedup_compared"], s["held_out_compared"]) == \
        (1, 1, 1, 1)
    assert s["speedup_within_tolerance"] == int(row.speedup_error <= s["speedup_tolerance"])
    d = report.to_json()
    assert d["models"][0]["held_out"] is True and d["models"][0]["predicted_over_measured"] > 0
    assert set(d["failed"]) == {"gone"}
    table = report.table()
    assert "tiny*" in table and "gone" in table and "within 15% of measured: " in table


# ------------------------------------------------------------ the model uses what is calibrated
def _elementwise_graph(rows: int, cols: int, transcendental: bool = False):
    """A one-op graph: ``x + 1`` (or ``tanh(x)``) on a ``rows x cols`` tensor."""
    import tvm
    from tvm import relax, topi

    from fusion_tvm.graph import build_fusion_graph
    from fusion_tvm.grouping import vars_used_after

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if transcendental:
                y = bb.emit_te(topi.tanh, x, primfunc_name_hint="tanh")
            else:
                y = bb.emit_te(lambda a: topi.add(a, tvm.tirx.const(1.0, "float32")), x,
                               primfunc_name_hint="add_one")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(bb.get())
    func = mod["main"]
    return build_fusion_graph(mod, func.body.blocks[0], vars_used_after(func, 0), {})


def _matmul_graph(m: int, k: int, n: int):
    from tvm import relax, topi

    from fusion_tvm.graph import build_fusion_graph
    from fusion_tvm.grouping import vars_used_after

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_te(topi.nn.matmul, x, w, primfunc_name_hint="matmul")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(bb.get())
    func = mod["main"]
    return build_fusion_graph(mod, func.body.blocks[0], vars_used_after(func, 0), {})


def _frozen(**changes) -> HardwareSpec:
    from dataclasses import replace

    return replace(get_hardware("ci-x86-avx2"), **changes)


def test_roofline_charges_each_parallel_region():
    from fusion_tvm.cost_models.roofline import RooflineCostModel

    big, small = _elementwise_graph(256, 128), _elementwise_graph(16, 16)
    g = frozenset([0])
    base = RooflineCostModel(_frozen(parallel_overhead_s=0.0))
    slow = RooflineCostModel(_frozen(parallel_overhead_s=20e-6))
    # 32768 elements: one parallel loop; 256 elements: serial, never charged.
    assert slow.estimate(big, g).detail["parallel_regions"] == 1
    assert slow.estimate(big, g).time_s - base.estimate(big, g).time_s == pytest.approx(20e-6)
    assert slow.estimate(small, g).detail["parallel_regions"] == 0
    assert slow.estimate(small, g).time_s == pytest.approx(base.estimate(small, g).time_s)
    # Further parallel loops of one kernel cost parallel_region_s each (workers awake).
    assert _frozen(parallel_overhead_s=20e-6).parallel_cost(3) == pytest.approx(60e-6)
    assert _frozen(parallel_overhead_s=20e-6, parallel_region_s=5e-6).parallel_cost(3) == \
        pytest.approx(30e-6)
    assert _frozen(parallel_overhead_s=20e-6).parallel_cost(0) == 0.0
    one_core = RooflineCostModel(_frozen(parallel_overhead_s=20e-6, num_cores=1,
                                         target={"kind": "llvm", "mcpu": "haswell"}))
    assert one_core.estimate(big, g).detail["parallel_regions"] == 0


def test_roofline_uses_class_efficiencies():
    from fusion_tvm.cost_models.roofline import RooflineCostModel, shape_class
    from fusion_tvm.ops import OpClass

    assert shape_class("matmul", {OpClass.MATMUL: 1e4}) == "small"
    assert shape_class("matmul", {OpClass.MATMUL: 1e9}) == "large"
    assert shape_class("elementwise", {OpClass.ELEMENTWISE: 10.0}) == "plain"
    assert shape_class("elementwise", {OpClass.TRANSCENDENTAL: 10.0}) == "transcendental"
    assert shape_class("elementwise", {}) == "copy"  # a layout transform moves data only
    small, large, g = _matmul_graph(16, 64, 64), _matmul_graph(512, 512, 512), frozenset([0])
    flat = RooflineCostModel(_frozen(efficiency={"matmul": 0.5}))
    split = RooflineCostModel(_frozen(efficiency={"matmul": 0.5, "matmul:small": 0.05}))
    assert split.estimate(small, g).detail["shape_class"] == "small"
    assert split.estimate(small, g).detail["efficiency"] == 0.05
    # A lower small-GEMM efficiency makes small GEMMs dearer and leaves large ones alone.
    def body(cost):
        return cost.time_s - cost.detail["launch_s"] - cost.detail["internal_s"]

    assert body(split.estimate(small, g)) == pytest.approx(10 * body(flat.estimate(small, g)))
    assert split.estimate(large, g).time_s == pytest.approx(flat.estimate(large, g).time_s)
    # An injected table wins over the spec (no global state: a second model is unaffected).
    injected = RooflineCostModel(_frozen(efficiency={"matmul:small": 0.05}),
                                 efficiency={"matmul": 1.0})
    assert injected.estimate(small, g).detail["efficiency"] == 1.0
    assert split.estimate(small, g).detail["efficiency"] == 0.05
    tanh, add = _elementwise_graph(64, 64, True), _elementwise_graph(64, 64)
    cm = RooflineCostModel(_frozen(efficiency={"elementwise": 0.5,
                                               "elementwise:transcendental": 0.01}))
    assert cm.estimate(tanh, g).detail["shape_class"] == "transcendental"
    assert cm.estimate(add, g).detail["efficiency"] == 0.5


def test_class_efficiencies_round_trip(tmp_path):
    spec = _frozen(parallel_overhead_s=12e-6, parallel_region_s=4e-6,
                   efficiency={"matmul": 0.4, "matmul:small": 0.1, "reduction:window": 0.02})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_json()))
    back = get_hardware(str(path))
    assert back == spec and back.parallel_overhead_s == 12e-6 and back.parallel_region_s == 4e-6
    assert back.rule_efficiency("matmul", "small") == 0.1
    assert back.rule_efficiency("matmul", "large") == 0.4


def test_aggregate_by_class():
    from fusion_tvm.calibration.micro import KernelEfficiency

    def k(rule, cls, eff, calibrates=None):
        return KernelEfficiency("w", "k", rule, 1.0, 0.0, 1.0, eff, calibrates=calibrates or rule,
                                shape_class=cls)

    effs = [k("matmul", "small", 0.1), k("matmul", "large", 0.9), k("matmul", "large", 0.4),
            k("elementwise", "plain", 0.5), k("elementwise", "transcendental", 0.02,
                                              "transcendental"),
            k("elementwise", "plain", 0.001, "transcendental")]  # pow(x, 3): not a plain figure
    agg = aggregate(effs, classes=True)
    assert agg["matmul:small"] == pytest.approx(0.1)
    assert agg["matmul:large"] == pytest.approx(0.6)
    assert agg["matmul"] == pytest.approx((0.1 * 0.9 * 0.4) ** (1 / 3))
    assert agg["elementwise"] == pytest.approx(0.5)
    assert agg["elementwise:plain"] == pytest.approx(0.5)
    assert agg["elementwise:transcendental"] == pytest.approx(0.02)
    assert set(aggregate(effs)) == {"matmul", "elementwise"}


def test_calibration_writes_parallel_overhead_and_classes(quick):
    spec = quick.spec
    # Measured (near zero where TVM_NUM_THREADS=1 leaves one worker), and in the spec.
    assert spec.parallel_overhead_s == quick.parallel_overhead_s >= 0.0
    probe = quick.parallel_probe_s
    assert probe["parallel"] > 0 and probe["serial"] > 0 and probe["parallel_x2"] > 0
    assert spec.parallel_region_s is not None and spec.parallel_region_s >= 0.0
    assert {"matmul:small", "matmul:large", "elementwise:transcendental"} <= set(spec.efficiency)
    assert all(0 < v <= 1.5 for v in spec.efficiency.values())
    # Each kernel's efficiency has its parallel loops' overhead taken out.
    for k in quick.kernels:
        body = k.measured_s - quick.call_s - spec.parallel_cost(k.regions)
        expect = kernel_efficiency(k.roofline_s, k.internal_s, max(body, 1e-9))
        assert k.efficiency == pytest.approx(expect)
    assert HardwareSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
