"""Bad inputs fail with our exception types and messages that name what and where.

Every case asserts the type (a :class:`~fusion_tvm.errors.FusionTVMError` subclass, never a
TVM traceback) and the parts of the message a user needs to fix the input. Run-time cases are
also replayed in a child process, so that a crash (a segfault in the VM) fails a test instead
of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fusion_tvm
from fusion_tvm.errors import (
    CapacityError,
    InputMismatchError,
    InvalidHardwareSpecError,
    ModelLoadError,
    UnknownNameError,
    UnsupportedOperatorError,
    UserInputError,
)
from fusion_tvm.hardware import HardwareSpec
from fusion_tvm.testing.random_onnx import compare, random_model
from fusion_tvm.testing.small_models import float_model as _model
from fusion_tvm.testing.small_models import two_input_model as _two_input_model

HW = "ci-x86-avx2"


@pytest.fixture(scope="module")
def compiled():
    return fusion_tvm.compile(_two_input_model(), hw=HW)


def _feeds(n=2, m=None):
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((n, 4), dtype=np.float32),
            "b": rng.standard_normal((m or n, 3), dtype=np.float32)}


# ------------------------------------------------------------------------- model files
def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a protobuf\n" * 20)
    with pytest.raises(ModelLoadError) as err:
        fusion_tvm.compile(str(path), hw=HW)
    assert str(path) in str(err.value)
    assert "not" in str(err.value) and "ONNX" in str(err.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not an ONNX model") as err:
        fusion_tvm.load_model(path)
    assert str(path) in str(err.value)


def test_truncated_model(tmp_path):
    data = _two_input_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated") as err:
        fusion_tvm.compile(path, hw=HW)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found") as err:
        fusion_tvm.load_model(tmp_path / "nope.onnx")
    assert "nope.onnx" in str(err.value)


def test_unsupported_operator():
    model = _model([helper.make_node("Relu", ["x"], ["r"], name="first"),
                    helper.make_node("FrobnicateTensor", ["r"], ["y"], name="the_culprit")],
                   [("x", [2, 3])], [("y", [2, 3])])
    with pytest.raises(UnsupportedOperatorError) as err:
        fusion_tvm.compile(model, hw=HW)
    assert err.value.op_type == "FrobnicateTensor"
    assert "'FrobnicateTensor'" in str(err.value) and "'the_culprit'" in str(err.value)


def test_unsupported_operator_of_custom_domain():
    node = helper.make_node("Relu", ["x"], ["y"], name="custom_relu", domain="com.example")
    model = _model([node], [("x", [2, 3])], [("y", [2, 3])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError) as err:
        fusion_tvm.load_model(model)
    assert "custom_relu" in str(err.value) and "com.example" in str(err.value)


def test_training_mode_batchnorm():
    """Our inference passes would normalise with the running statistics: refused, not wrong
    (conformance test_batchnorm_*_training_mode)."""
    params = [helper.make_tensor(n, TensorProto.FLOAT, [3], [1.0, 0.5, 2.0])
              for n in ("scale", "bias", "mean", "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                            name="bn_train", training_mode=1)
    model = _model([node], [("x", [2, 3, 4])], [("y", [2, 3, 4])], params)
    with pytest.raises(UnsupportedOperatorError, match="training_mode=1") as err:
        fusion_tvm.compile(model, hw=HW)
    assert "'bn_train'" in str(err.value)
    model.graph.node[0].attribute[0].i = 0  # the same node in inference mode loads
    fusion_tvm.load_model(model)


def test_missing_initializer():
    model = _model([helper.make_node("MatMul", ["x", "weights_fc1"], ["y"], name="fc1")],
                   [("x", [2, 4])], [("y", [2, 3])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ONNX checker's warning says the same
        with pytest.raises(UserInputError) as err:
            fusion_tvm.compile(model, hw=HW)
    msg = str(err.value)
    assert "'fc1'" in msg and "'weights_fc1'" in msg and "initializer" in msg


def test_not_a_model_object():
    with pytest.raises(UserInputError, match="cannot load a model from dict"):
        fusion_tvm.compile({"not": "a model"}, hw=HW)


# ------------------------------------------------------------------------ run-time feeds
def test_wrong_input_count(compiled):
    with pytest.raises(InputMismatchError, match=r"takes 2 inputs \['a', 'b'\], got 1"):
        compiled.run([_feeds()["a"]])


def test_wrong_input_name(compiled):
    feeds = _feeds()
    feeds["B"] = feeds.pop("b")
    with pytest.raises(InputMismatchError) as err:
        compiled.run(feeds)
    msg = str(err.value)
    assert "missing ['b']" in msg and "unknown ['B']" in msg


def test_wrong_static_dim(compiled):
    feeds = _feeds()
    feeds["a"] = np.zeros((2, 5), np.float32)
    with pytest.raises(InputMismatchError, match="input 'a' axis 1 is 5, the model expects 4"):
        compiled.run(feeds)


def test_wrong_rank(compiled):
    feeds = _feeds()
    feeds["b"] = np.zeros((2, 3, 1), np.float32)
    with pytest.raises(InputMismatchError, match="input 'b' has rank 3"):
        compiled.run(feeds)


def test_wrong_dtype(compiled):
    feeds = _feeds()
    feeds["a"] = feeds["a"].astype(np.float64)
    with pytest.raises(InputMismatchError, match="input 'a' has dtype float64, .* float32"):
        compiled.run(feeds)


def test_symbolic_dim_mismatch_between_inputs(compiled):
    with pytest.raises(InputMismatchError) as err:
        compiled.run(_feeds(n=2, m=3))
    msg = str(err.value)
    assert "symbolic dim 'N'" in msg and "input 'b' axis 0" in msg and "2" in msg and "3" in msg


def test_symbolic_dim_takes_any_value(compiled):
    for n in (1, 5):
        feeds = _feeds(n)
        (y,) = compiled.run(feeds)
        ref = np.maximum(feeds["a"] @ np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), 0)
        np.testing.assert_allclose(y, ref + feeds["b"], rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------------- NaN and Inf
def _inject(feeds, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for name, arr in feeds.items():
        arr = arr.copy()
        flat = arr.reshape(-1)
        idx = rng.choice(flat.size, size=min(3, flat.size), replace=False)
        for i, v in zip(idx, [np.nan, np.inf, -np.inf], strict=False):
            flat[i] = v
        out[name] = arr
    return out



@pytest.mark.parametrize("seed", [0, 1, 2, 4, 5, 8, 9, 10])
def test_nan_inf_propagate_as_unfused(seed):
    """NaN/Inf in the inputs come out where the unfused build puts them (same NaN mask,
    same infinities, the rest equal within tolerance). Ours runs first, so an output element
    our kernels never write cannot inherit the unfused build's value from a reused block
    (seed 0 found test_fuzz_regressions.py::test_reduce_then_concat_writes_every_row)."""
    case = random_model(seed, 4, 8)
    feeds = _inject(case.feeds, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = fusion_tvm.compile(case.model, hw=HW, fusion="cost").run(feeds)
        base = fusion_tvm.compile(case.model, hw=HW, fusion="none").run(feeds)
    assert any(np.isnan(o).any() for o in base), "the injection should reach an output"
    diff = compare(ours, base)
    assert not diff, f"seed {seed}: {diff}"


def test_nan_inf_elementwise_exact():
    """Ops where IEEE semantics are unambiguous: the NaN mask and infinities match numpy."""
    model = _model(
        [helper.make_node("Add", ["x", "x"], ["s"], name="add"),
         helper.make_node("Mul", ["s", "x"], ["m"], name="mul"),
         helper.make_node("Neg", ["m"], ["y"], name="neg")],
        [("x", [2, 4])], [("y", [2, 4])],
    )
    x = np.array([[1, np.nan, np.inf, -np.inf], [0, -2, 3, np.nan]], np.float32)
    want = -((x + x) * x)
    for fusion in ("cost", "none"):
        (y,) = fusion_tvm.compile(model, hw=HW, fusion=fusion).run({"x": x})
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_array_equal(y[~np.isnan(want)], want[~np.isnan(want)])


# ---------------------------------------------------------------------- hardware specs
def _ci_spec() -> dict:
    return fusion_tvm.get_hardware(HW).to_json()


def test_negative_bandwidth():
    spec = _ci_spec()
    spec["memory"][3]["bandwidth_bytes_per_s"] = -1.0
    with pytest.raises(InvalidHardwareSpecError) as err:
        HardwareSpec.from_json(spec)
    msg = str(err.value)
    assert "'ci-x86-avx2'" in msg and "'DRAM'" in msg and "bandwidth_bytes_per_s" in msg
    assert "-1.0" in msg


def test_zero_cache():
    spec = _ci_spec()
    spec["memory"][0]["capacity_bytes"] = 0
    with pytest.raises(InvalidHardwareSpecError, match="'L1' capacity_bytes must be a positive"):
        HardwareSpec.from_json(spec)


def test_missing_field():
    spec = _ci_spec()
    del spec["peak_flops"]
    with pytest.raises(InvalidHardwareSpecError, match="'ci-x86-avx2': missing field 'peak_flops'"):
        HardwareSpec.from_json(spec)


def test_missing_op_class():
    spec = _ci_spec()
    del spec["peak_flops"]["conv"]
    with pytest.raises(InvalidHardwareSpecError, match="peak_flops lacks op class 'conv'"):
        HardwareSpec.from_json(spec)


def test_unknown_field():
    spec = _ci_spec()
    spec["flux_capacitors"] = 3
    with pytest.raises(InvalidHardwareSpecError, match="flux_capacitors"):
        HardwareSpec.from_json(spec)


def test_bad_spec_from_json_file_through_compile(tmp_path):
    spec = _ci_spec()
    spec["name"] = "my-board"
    spec["memory"][1]["bandwidth_bytes_per_s"] = -5e9
    path = tmp_path / "board.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(InvalidHardwareSpecError) as err:
        fusion_tvm.compile(_two_input_model(), hw=str(path))
    assert "'my-board'" in str(err.value) and "'L2'" in str(err.value)


def test_unreadable_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", "kind": ')
    with pytest.raises(InvalidHardwareSpecError, match="cannot read hardware spec") as err:
        fusion_tvm.get_hardware(str(path))
    assert str(path) in str(err.value)


def test_good_spec_round_trips_through_a_file(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_ci_spec()))
    assert fusion_tvm.get_hardware(str(path)) == fusion_tvm.get_hardware(HW)


# ------------------------------------------------------------------------ unknown names
@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"target": "tpu"}, "unknown target 'tpu'"),
        ({"hw": "b200"}, "unknown hardware preset 'b200'"),
        ({"cost_model": "oracle"}, "unknown cost model 'oracle'"),
        ({"fusion": "greedy"}, "unknown fusion mode 'greedy'"),
    ],
)
def test_unknown_names(kwargs, what):
    kwargs = {"hw": HW, **kwargs}
    with pytest.raises(UnknownNameError, match=what) as err:
        fusion_tvm.compile(_two_input_model(), **kwargs)
    assert "known" in str(err.value)  # the message lists the valid choices


# ----------------------------------------------------------------------------- FPGA
def test_model_too_large_for_the_fpga():
    try:
        fusion_tvm.get_backend("hls")
    except UnknownNameError:
        pytest.skip("the HLS backend is not registered")
    model = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0], name="tr"),
                    helper.make_node("Relu", ["t"], ["y"], name="relu")],
                   [("x", [1024, 1024])], [("y", [1024, 1024])])
    with pytest.raises(CapacityError) as err:
        fusion_tvm.compile(model, target="hls", hw="zcu104")
    msg = str(err.value)
    assert "zcu104" in msg and "BRAM" in msg and "transpose" in msg


# -------------------------------------------------------------------- no process crash
_CHILD = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    import numpy as np
    sys.path.insert(0, {tests!r})
    import fusion_tvm
    from fusion_tvm.errors import FusionTVMError
    from test_bad_inputs import _inject, _two_input_model
    cm = fusion_tvm.compile(_two_input_model(), hw="ci-x86-avx2")
    good = {{"a": np.ones((2, 4), np.float32), "b": np.ones((2, 3), np.float32)}}
    bad = [
        [], [good["a"]], {{"a": good["a"]}}, {{**good, "c": good["a"]}},
        {{**good, "a": np.ones((2, 4), np.float64)}}, {{**good, "a": np.ones((2, 4), np.int32)}},
        {{**good, "a": np.ones((2, 5), np.float32)}}, {{**good, "b": np.ones((3, 3), np.float32)}},
        {{**good, "a": np.ones((0, 4), np.float32), "b": np.ones((0, 3), np.float32)}},
        {{**good, "a": np.ones(4, np.float32)}}, {{**good, "a": np.float32(1.0)}},
        {{**good, "a": np.ones((2, 8), np.float32)[:, ::2]}},
    ]
    raised = 0
    for feeds in bad:
        try:
            cm.run(feeds)
        except FusionTVMError:
            raised += 1
    cm.run(_inject(good, 1))
    print("raised", raised, "of", len(bad))
    """
)


def test_bad_feeds_never_crash_the_process(tmp_path):
    """A child process runs a list of malformed feeds (and NaN/Inf feeds); it must exit
    normally, whatever each case raises."""
    from pathlib import Path

    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(Path(__file__).parent)))
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package in the child
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    # Every malformed feed but the empty batch and the strided view is refused by our checks.
    assert "raised 10 of 12" in proc.stdout, proc.stdout


def test_models_in_onnx_checker_order_of_errors(tmp_path):
    """A model with a bad op *and* a missing input reports the first problem in node order."""
    model = _model([helper.make_node("Add", ["x", "ghost"], ["s"], name="first_add"),
                    helper.make_node("Mystery", ["s"], ["y"], name="second")],
                   [("x", [2])], [("y", [2])])
    onnx.save(model, tmp_path / "two_errors.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UserInputError, match="'first_add'.*'ghost'"):
            fusion_tvm.load_model(tmp_path / "two_errors.onnx")


# --------------------------------------------------------------------- index values
@pytest.fixture(scope="module")
def embedding():
    from fusion_tvm.testing.small_models import embedding_model

    model = embedding_model(rows=10)
    return model, fusion_tvm.compile(model)


@pytest.mark.parametrize("bad", [10, 10**7, -11])
def test_out_of_range_index_is_an_error_not_a_crash(embedding, bad):
    """A token id outside the table (TVM's fast take would read outside it: segfault)."""
    _, cm = embedding
    ids = np.array([[1, 2, bad]], dtype="int64")
    with pytest.raises(InputMismatchError, match=rf"'ids' has value {bad} at index \(0, 2\)"):
        cm.run({"ids": ids})


def test_in_range_and_negative_indices_match_onnxruntime(embedding):
    ort = pytest.importorskip("onnxruntime")
    model, cm = embedding
    ids = np.array([[0, 9, -1, -10], [3, 4, 5, 6]], dtype="int64")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(cm.run({"ids": ids})[0], sess.run(None, {"ids": ids})[0],
                               rtol=1e-6)
    assert [(r.name, r.size, r.allow_negative) for r in cm.index_ranges] == [("ids", 10, True)]


def test_loaded_library_keeps_the_index_checks(embedding, tmp_path):
    """An exported library read back with ``fusion_tvm.load`` range-checks its lookups
    too (the checks travel in the plan JSON; a loaded model ran an id of 10**9 into a
    segfault)."""
    _, cm = embedding
    path = cm.export(tmp_path / "embedding.so")
    loaded = fusion_tvm.load(path)
    assert [(r.name, r.size, r.allow_negative) for r in loaded.index_ranges] \
        == [("ids", 10, True)]
    with pytest.raises(InputMismatchError, match=r"'ids' has value 1000000000 at index"):
        loaded.run({"ids": np.array([[1, 10**9]], dtype="int64")})
    ids = np.array([[0, 9, -1]], dtype="int64")
    np.testing.assert_array_equal(loaded.run({"ids": ids})[0], cm.run({"ids": ids})[0])
