"""Optional tuning: rule knobs, the database, the measured search and the tuned build."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tvm import relax, tirx
from tvm.script import relax as R

import fusion_tvm
from fusion_tvm.cli import main as cli_main
from fusion_tvm.errors import UserInputError
from fusion_tvm.frontend import load_model
from fusion_tvm.passes.apply_target_schedule import KNOBS_ATTR, RULE_ATTR
from fusion_tvm.passes.mark_constant_params import MarkConstantParams
from fusion_tvm.pipeline import resolve, run_phases
from fusion_tvm.threads import physical_cores, use_all_cores
from fusion_tvm.tuning import TuningDatabase, TuningRecord, tune, workload_key
from fusion_tvm.tuning_db import target_key

RNG = np.random.default_rng(11)


def _conv_model():
    """conv 3x3 (16 -> 64) + ReLU, then a depthwise 3x3 + bias: two blocked-conv kernels."""
    w1 = RNG.standard_normal((64, 16, 3, 3)).astype("float32") * 0.2
    w2 = RNG.standard_normal((64, 1, 3, 3)).astype("float32") * 0.2
    bias = RNG.standard_normal((1, 64, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 16, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w1), padding=1)))
            y = bb.emit(relax.op.nn.conv2d(y, relax.const(w2), padding=1, groups=64))
            out = bb.emit_output(relax.op.add(y, relax.const(bias)))
        bb.emit_func_output(out)
    return bb.get()


def _linear_model(m):
    """``relu(x @ W + b)`` with ``m`` rows (an int, or a name for a symbolic dim)."""
    w = RNG.standard_normal((40, 24)).astype("float32")
    bb = relax.BlockBuilder()
    rows = tirx.Var(m, "int64") if isinstance(m, str) else m
    x = relax.Var("x", R.Tensor((rows, 40), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(np.ones(24, "f")))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get(), w


def _fused_kernels(mod, hw: str | None = None) -> dict:
    """Unscheduled fused PrimFuncs of ``mod`` (as the schedule phase sees them)."""
    result = run_phases(load_model(mod).mod, resolve(None, hw))
    parts, fused = result.parts, result.fused
    with parts.target:
        fused = MarkConstantParams()(fused)
    return parts, {gv.name_hint: f for gv, f in fused.functions_items()
                   if isinstance(f, tirx.PrimFunc)}


def _prims(cm) -> dict:
    return {gv.name_hint: f for gv, f in cm.fused_mod.functions_items()
            if isinstance(f, tirx.PrimFunc)}


def _rule(name: str, hw):
    """The LLVM-CPU backend's schedule rule called ``name``."""
    return next(r for r in fusion_tvm.get_backend("llvm").schedule_rules(hw) if r.name == name)


def _db_with(parts, func, rule: str, knobs: dict) -> TuningDatabase:
    db = TuningDatabase()
    db.commit(TuningRecord(workload_key(func), target_key(parts.target), rule, knobs, 1.0, 1.0))
    return db


@pytest.mark.parametrize("rows", [13, "m"])
def test_matmul_knobs_compute_the_same_numbers(rows):
    """Each matmul knob moved off its derived value, through the whole pipeline (packing
    at compile time included), still gives ``relu(x @ W + 1)``; ragged and symbolic M."""
    mod, w = _linear_model(rows)
    parts, kernels = _fused_kernels(mod)
    (func,) = kernels.values()
    rule = _rule("matmul", parts.hw)
    space = rule.knobs(func, parts.target, parts.hw)
    assert {"mr", "nr", "panel_outer"} <= set(space) and all(len(v) >= 2 for v in space.values())
    x = RNG.standard_normal((13, 40)).astype("float32")
    expect = np.maximum(x @ w + 1, 0)
    for knobs in ({"mr": space["mr"][1]}, {"nr": space["nr"][1], "panel_outer":
                                            space["panel_outer"][1]}):
        cm = fusion_tvm.compile(mod, tuning_db=_db_with(parts, func, "matmul", knobs))
        (scheduled,) = _prims(cm).values()
        assert dict(scheduled.attrs[KNOBS_ATTR]) == knobs
        np.testing.assert_allclose(cm.run([x])[0], expect, rtol=1e-4, atol=1e-4)


def test_bad_knobs_fall_back_to_the_default_schedule():
    """A record naming a knob the rule does not have costs the tuning, never the build."""
    mod, w = _linear_model(13)
    parts, kernels = _fused_kernels(mod)
    (func,) = kernels.values()
    cm = fusion_tvm.compile(mod, tuning_db=_db_with(parts, func, "matmul", {"bogus": 3}))
    (scheduled,) = _prims(cm).values()
    assert KNOBS_ATTR not in scheduled.attrs and str(scheduled.attrs[RULE_ATTR]) == "matmul"
    x = RNG.standard_normal((13, 40)).astype("float32")
    np.testing.assert_allclose(cm.run([x])[0], np.maximum(x @ w + 1, 0), rtol=1e-4, atol=1e-4)


def test_tune_writes_records_the_compile_uses(tmp_path):
    """``tune`` measures every blocked conv, saves a database, and ``compile`` schedules
    each recorded kernel with its knobs; the numbers equal the untuned build's."""
    mod = _conv_model()
    path = tmp_path / "db.json"
    report = tune(mod, path, trials=3)
    assert {k.rule for k in report.kernels} == {"conv2d_nchwc"}
    assert len(report.kernels) == 2 and all(k.trials >= 1 for k in report.kernels)
    assert all(k.best_us <= k.default_us for k in report.kernels)
    db = TuningDatabase(path)
    assert len(db) == 2
    tuned = fusion_tvm.compile(mod, tuning_db=str(path))
    recorded = [f for f in _prims(tuned).values() if KNOBS_ATTR in f.attrs]
    assert len(recorded) == 2
    x = RNG.standard_normal((1, 16, 14, 14)).astype("float32")
    ref = fusion_tvm.compile(mod, fusion="none", schedule=False).run([x])[0]
    np.testing.assert_allclose(tuned.run([x])[0], ref, rtol=1e-4, atol=1e-4)
    assert "conv2d_nchwc" in report.table()


def test_conv_knobs_outside_the_register_budget_are_refused():
    """On a frozen AVX-512 spec (32 vector registers) a 4 x 14 tile of accumulators is
    offered; 56 accumulators exceed the registers and are refused. (The host's own width
    is what it is: 16 registers on an AVX2 part offer no 14-column tile.)"""
    mod = _conv_model()
    parts, kernels = _fused_kernels(mod, "epyc-znver4-2c")
    rule = _rule("conv2d_nchwc", parts.hw)
    dense = next(f for n, f in kernels.items() if "depthwise" not in n)
    space = rule.knobs(dense, parts.target, parts.hw)
    assert 14 in space["xr"] and 4 in space["fo"]
    with pytest.raises(ValueError, match="registers"):
        rule.apply(dense, parts.target, parts.hw, knobs={"fo": 4, "xr": 14})


def test_workload_key_ignores_the_name_only():
    mod, _ = _linear_model(13)
    _, kernels = _fused_kernels(mod)
    (func,) = kernels.values()
    assert workload_key(func) == workload_key(func.with_attr("global_symbol", "other"))
    other, _ = _linear_model(14)
    (func14,) = _fused_kernels(other)[1].values()
    assert workload_key(func14) != workload_key(func)


def test_database_files_are_checked(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        TuningDatabase.of(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserInputError, match="not readable JSON"):
        TuningDatabase(bad)
    bad.write_text(json.dumps({"version": 99, "records": []}))
    with pytest.raises(UserInputError, match="version"):
        TuningDatabase(bad)
    bad.write_text(json.dumps({"version": 1, "records": [{"workload": "x"}]}))
    with pytest.raises(UserInputError, match="record 0"):
        TuningDatabase(bad)
    db = TuningDatabase(tmp_path / "new.json")
    db.commit(TuningRecord("k", "llvm", "matmul", {"mr": 4}, 10.0, 8.0, "f"))
    db.commit(TuningRecord("k", "llvm", "matmul", {"mr": 2}, 10.0, 9.0, "f"))  # slower: kept out
    db.save()
    again = TuningDatabase(tmp_path / "new.json")
    assert [r.knobs for r in again.records.values()] == [{"mr": 4}]


def test_cli_tune_then_compile(tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(RNG.standard_normal((32, 8, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
        initializer=[w])
    model = tmp_path / "conv.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                      .SerializeToString())
    db = tmp_path / "t.json"
    assert cli_main(["tune", str(model), "--db", str(db), "--trials", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["database"] == str(db) and out["kernels"][0]["rule"] == "conv2d_nchwc"
    assert cli_main(["tune", str(model), "--db", str(db), "--trials", "0"]) == 2
    lib = tmp_path / "conv.so"
    assert cli_main(["compile", str(model), "--tuning-db", str(db), "-o", str(lib), "-q"]) == 0
    assert lib.exists()


def test_thread_pool_uses_the_physical_cores(monkeypatch):
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert use_all_cores.__wrapped__() == 3


def test_symbolic_kernels_are_timed_at_the_given_sizes(tmp_path):
    mod, _ = _linear_model("m")
    skipped = tune(mod, tmp_path / "a.json", trials=2)
    (kernel,) = skipped.kernels
    assert kernel.status.startswith("skipped") and "'m'" in kernel.status
    timed = tune(mod, tmp_path / "b.json", trials=2, dims={"m": 13})
    (kernel,) = timed.kernels
    assert kernel.status in ("tuned", "kept") and kernel.trials == 2 and kernel.default_us > 0
