"""Minimal repros of bugs found by fuzzing, replayed on every run.

Two kinds live here:

* hand-written minimal graphs (below), each named after the bug;
* cases saved by the reducer (``benchmarks/fuzz.py --reduce``) as
  ``tests/data/fuzz_regressions/<name>.{onnx,npz,json}``, replayed by one parametrized test.

A repro of a bug that is not fixed yet is ``xfail(strict=True)`` (hand-written) or carries an
``"xfail"`` key in its JSON (saved): once the bug is fixed the test XPASSes, fails as strict,
and whoever fixed it removes the mark.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusion_tvm
from fusion_tvm.testing.random_onnx import FuzzCase, check_case

HW = "ci-x86-avx2"
DATA = Path(__file__).parent / "data" / "fuzz_regressions"


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(
        nodes, "repro",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(model, feeds, schedule=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_case(FuzzCase(0, model, feeds, 1), schedule=schedule)
    assert result.ok, f"{result.kind}: {result.detail}"


def _ints(v):
    return np.asarray(v, dtype=np.int64)


# ------------------------------------------------------------------------- hand-written
def test_symbolic_dims_not_shared_between_fused_functions():
    """Found by seed 1: ``Max(x[N,4,6,6], c[1])`` legalizes to broadcast_to x2 + stack + max,
    which fuses into two groups; both Primitive functions used the caller's tirx.Var ``N``,
    and ``check_well_formed`` rejects a symbolic var shared between Relax functions (stock
    FuseOps renews them). Fixed in grouping.py with ``copy_with_new_vars``."""
    x = np.random.default_rng(1).uniform(-1, 1, (2, 4, 6, 6)).astype(np.float32)
    model = _model([helper.make_node("Max", ["x", "c"], ["y"])],
                   [("x", ["N", 4, 6, 6])], [("y", ["N", 4, 6, 6])],
                   [("c", np.array([-0.04], np.float32))])
    _check(model, {"x": x})


def test_reduce_then_concat_writes_every_row():
    """Found by seeds 0/3 with NaN feeds (tests/test_bad_inputs.py): ReduceMax over the last
    axis of x[2,3,5] then Concat with a [2,3] constant on axis 0 -> y[4,3]. The llvm_cpu
    'reduction' rule computed the concat at the reduction's row loop, so rows 2..3 (the
    constant's part) were never written (uninitialized -> wrong values / NaN)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 5)).astype(np.float32)
    model = _model([helper.make_node("ReduceMax", ["x"], ["r"], axes=[2], keepdims=0),
                    helper.make_node("Concat", ["r", "w"], ["y"], axis=0)],
                   [("x", [2, 3, 5])], [("y", [4, 3])], [("w", w)])
    (y,) = fusion_tvm.compile(model, hw=HW, fusion="cost").run({"x": x})  # ours first
    np.testing.assert_allclose(y, np.concatenate([x.max(2), w]), rtol=1e-6)


def test_reduce_and_slice_share_a_producer():
    """Found by seeds 6, 88, 92: Neg -> {ReduceSum(all axes, keepdims), Slice}, one group. The
    llvm_cpu 'reduction' rule computed the shared producer inside the reduction loop; FlattenBuffer
    then failed: 'Buffer compute_intermediate is used before its definition'."""
    x = np.array([[0.5, -0.25]], np.float32)
    model = _model(
        [helper.make_node("Neg", ["x"], ["a"]),
         helper.make_node("ReduceSum", ["a", "axes"], ["r"], keepdims=1),
         helper.make_node("Slice", ["a", "starts", "ends", "sl_axes"], ["s"])],
        [("x", [1, 2])], [("r", [1, 1]), ("s", [1, 1])],
        [("axes", _ints([0, 1])), ("starts", _ints([0])), ("ends", _ints([1])),
         ("sl_axes", _ints([1]))],
    )
    _check(model, {"x": x})


def test_reduce_and_slice_share_a_producer_unscheduled():
    """The same graph builds and is right without our schedule rules: the partition is fine."""
    x = np.array([[0.5, -0.25]], np.float32)
    model = _model(
        [helper.make_node("Neg", ["x"], ["a"]),
         helper.make_node("ReduceSum", ["a", "axes"], ["r"], keepdims=1),
         helper.make_node("Slice", ["a", "starts", "ends", "sl_axes"], ["s"])],
        [("x", [1, 2])], [("r", [1, 1]), ("s", [1, 1])],
        [("axes", _ints([0, 1])), ("starts", _ints([0])), ("ends", _ints([1])),
         ("sl_axes", _ints([1]))],
    )
    _check(model, {"x": x}, schedule=False)


# ------------------------------------------------------------------- saved by the reducer
def _saved():
    if not DATA.is_dir():
        return []
    params = []
    for meta_path in sorted(DATA.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        marks = []
        if meta.get("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=meta["xfail"]))
        params.append(pytest.param(meta_path.stem, meta, marks=marks, id=meta_path.stem))
    return params


@pytest.mark.parametrize(("name", "meta"), _saved())
def test_saved_regression(name, meta):
    model = onnx.load(DATA / f"{name}.onnx")
    feeds = dict(np.load(DATA / f"{name}.npz"))
    _check(model, feeds, schedule=meta.get("schedule", True))


# ------------------------------------------------------------ found by the conformance run
@pytest.mark.parametrize("fusion", ["cost", "none"])
def test_cumsum_is_lowered(fusion):
    """ONNX node test test_unsqueeze_axis_1 (stock passes, ours fails), reduced to CumSum."""
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"])],
                   [("x", [2, 3])], [("y", [2, 3])], [("axis", np.array(1, np.int64))])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = fusion_tvm.compile(model, hw=HW, fusion=fusion).run({"x": x})
    np.testing.assert_array_equal(y, np.cumsum(x, axis=1))


def test_rank0_input():
    """ONNX node test test_gemm_default_scalar_bias (stock passes, ours fails), reduced."""
    model = _model([helper.make_node("Add", ["x", "c"], ["y"])],
                   [("x", [2, 3]), ("c", [])], [("y", [2, 3])])
    x = np.ones((2, 3), np.float32)
    (y,) = fusion_tvm.compile(model, hw=HW).run({"x": x, "c": np.array(2.0, np.float32)})
    np.testing.assert_array_equal(y, x + 2)


@pytest.mark.parametrize("op", ["Cosh", "Sinh"])
def test_hyperbolic_ops_schedule(op):
    """ONNX node test test_cosh: the llvm_cpu elementwise rule vectorised tirx.cosh/sinh, which
    LLVM codegen cannot lower ('unknown intrinsic tirx.cosh'); fixed in 725d76b."""
    model = _model([helper.make_node(op, ["x"], ["y"])], [("x", [3, 4])], [("y", [3, 4])])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    (y,) = fusion_tvm.compile(model, hw=HW, fusion="none", schedule=True).run({"x": x})
    np.testing.assert_allclose(y, getattr(np, op.lower())(x), rtol=1e-5)


def test_sibling_pass_with_constant_operand():
    """Found by fuzz seed 5124 (unfused build crashed too), reduced: Abs/Add of constants
    (folded) feed one MatMul, an input feeds another."""
    rng = np.random.default_rng(0)
    model = _model(
        [helper.make_node("Abs", ["w1"], ["t2"]),
         helper.make_node("Add", ["t2", "c4"], ["t5"]),
         helper.make_node("MatMul", ["t5", "w11"], ["t12"]),
         helper.make_node("MatMul", ["x", "w30"], ["t31"])],
        [("x", ["N", 5])], [("t12", [1, 4]), ("t31", ["N", 4])],
        [("w1", np.full((1, 1), -0.5, np.float32)), ("c4", np.array(0.25, np.float32)),
         ("w11", rng.uniform(-1, 1, (1, 4)).astype(np.float32)),
         ("w30", rng.uniform(-1, 1, (5, 4)).astype(np.float32))],
    )
    _check(model, {"x": rng.uniform(-1, 1, (2, 5)).astype(np.float32)}, schedule=False)
