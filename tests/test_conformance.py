"""ONNX backend node tests: our pipeline must pass every test stock TVM passes.

A fixed, representative subset (the ops the fuzzer and the model zoo use, plus a few
neighbours) runs through ``benchmarks/conformance.py`` in one child process (a crash fails
one model, not the session): ours is ``fusion_tvm.compile(fusion="cost")`` on LLVM, stock is
the Relax ONNX importer + ``relax.get_pipeline("zero")`` + ``tvm.compile``. The full table:
``python benchmarks/conformance.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tvm  # noqa: E402

import fusion_tvm  # noqa: E402
from benchmarks.conformance import PASS, UNSUPPORTED, load_cases, run_isolated  # noqa: E402

SUBSET = [
    # elementwise
    "test_abs", "test_relu", "test_sigmoid", "test_tanh", "test_exp", "test_erf", "test_sqrt",
    "test_neg", "test_add_bcast", "test_sub_bcast", "test_mul_bcast", "test_div_bcast",
    "test_max_example", "test_min_example", "test_pow", "test_clip", "test_leakyrelu",
    "test_hardsigmoid", "test_gelu_default_1", "test_where_example", "test_cast_FLOAT_to_DOUBLE",
    # reductions
    "test_reduce_sum_keepdims_example", "test_reduce_mean_default_axes_keepdims_example",
    "test_reduce_max_do_not_keepdims_example", "test_reduce_sum_negative_axes_keepdims_random",
    # contractions
    "test_matmul_2d", "test_matmul_3d", "test_matmul_4d", "test_matmul_bcast",
    "test_gemm_default_vector_bias", "test_gemm_transposeB", "test_gemm_all_attributes",
    "test_gemm_default_scalar_bias",
    "test_conv_with_strides_padding", "test_conv_with_strides_no_padding",
    "test_conv_with_autopad_same", "test_basic_conv_with_padding",
    # pooling
    "test_maxpool_2d_default", "test_maxpool_2d_pads", "test_maxpool_2d_strides",
    "test_averagepool_2d_default", "test_averagepool_2d_pads", "test_globalaveragepool",
    # data movement
    "test_reshape_reordered_all_dims", "test_reshape_negative_dim",
    "test_transpose_all_permutations_3", "test_concat_3d_axis_negative_1",
    "test_split_equal_parts_2d", "test_slice", "test_slice_negative_axes", "test_flatten_axis1",
    "test_squeeze", "test_unsqueeze_axis_1", "test_expand_dim_changed", "test_gather_0",
    # normalisation
    "test_softmax_axis_0", "test_softmax_large_number", "test_layer_normalization_2d_axis1",
    "test_layer_normalization_3d_axis_negative_1_epsilon", "test_batchnorm_example",
    "test_instancenorm_example",
    # data the generator hands over as TensorProto / numpy scalars, an optional input of
    # open element type, and an op the importer refuses (ours must refuse it too)
    "test_cast_FLOAT_to_DOUBLE", "test_cast_FLOAT_to_FLOAT16",
    "test_range_float_type_positive_delta",
    "test_optional_has_element_tensor_input", "test_blackmanwindow",
    # a data-dependent shape (call_packed tensor_to_shape): stock FastMathTransform crashed
    "test_expand_dim_unchanged",
]

# Bugs outside our passes that make ours fail where stock passes (strict: fixing one turns
# its test into an XPASS failure, and the mark comes off).
KNOWN: dict[str, str] = {}  # known failures (strict xfail) — none at the moment


@pytest.fixture(scope="module")
def results():
    return run_isolated(SUBSET, chunk=len(SUBSET))


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[n])] if n in KNOWN
                  else []) for n in SUBSET],
)
def test_no_failure_added(results, name):
    row = results[name]
    if row["stock"] != PASS:
        pytest.skip(f"stock TVM: {row['stock']}: {row['stock_detail']}")
    assert row["ours"] == PASS, f"{row['ours']}: {row['ours_detail']}"


def test_ours_refuses_what_stock_refuses(results):
    """Where the stock importer refuses a model, ours refuses it as unsupported too."""
    refused = {n for n, r in results.items() if r["stock"] == UNSUPPORTED}
    assert "test_blackmanwindow" in refused
    assert all(results[n]["ours"] == UNSUPPORTED for n in refused), {
        n: results[n]["ours_detail"] for n in refused if results[n]["ours"] != UNSUPPORTED}


def test_ours_pass_contains_stock_pass(results):
    ours = {n for n, r in results.items() if r["ours"] == PASS}
    stock = {n for n, r in results.items() if r["stock"] == PASS}
    assert stock - ours <= set(KNOWN), sorted(stock - ours)
    assert len(stock) >= len(SUBSET) * 3 // 4  # the subset is mostly supported


def _fast_math_module():
    from tvm import relax
    from tvm.script import relax as R

    @R.function
    def main(x: R.Tensor((2, 8), "float32"), s: R.Tensor((2,), "int64")):
        with R.dataflow():
            a = R.nn.softmax(x, axis=-1)
            b = R.exp(a)
            c = R.erf(b)
            d = R.tanh(c)
            e = R.add(d, x)
            R.output(e)
        return e

    mod = tvm.IRModule({"main": main})
    return relax.transform.Normalize()(mod)


def test_fast_math_matches_stock_and_skips_packed_calls():
    """Our FastMath rewrites operators exactly as TVM's FastMathTransform does, and leaves a
    call of a packed function (which crashed the stock pass) alone."""
    from tvm import relax

    from fusion_tvm.passes.fast_math import FastMath

    mod = _fast_math_module()
    ours = FastMath()(mod)
    tvm.ir.assert_structural_equal(ours, relax.transform.FastMathTransform()(mod))
    assert len([gv for gv, _ in ours.functions_items()]) == 5  # main + 4 TE functions

    loaded = fusion_tvm.load_model(load_cases(["test_expand_dim_unchanged"])[
        "test_expand_dim_unchanged"].model)
    with pytest.raises(AttributeError):
        relax.transform.FastMathTransform()(loaded.mod)
    tvm.ir.assert_structural_equal(FastMath()(loaded.mod), loaded.mod)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fast_math_computes_half_precision_in_float32(dtype):
    """TVM's polynomials exist for float32 only; a half-precision exp / tanh / sigmoid /
    softmax is computed in float32 and rounded back, not a scalar libm call per element
    (TVM #20342's fp16 exp chain: 13x slower)."""
    from tvm import relax

    from fusion_tvm.passes.fast_math import FastMath
    from fusion_tvm.targets.llvm_cpu._util import count_calls

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.exp(x))
            y = bb.emit(relax.op.tanh(y))
            y = bb.emit(relax.op.sigmoid(y))
            y = bb.emit_output(relax.op.nn.softmax(y, axis=-1))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(FastMath()(bb.get()))
    libm = frozenset({"tirx.exp", "tirx.tanh", "tirx.sigmoid"})
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) >= 4
    assert not any(count_calls(f.body, libm) for f in funcs)
    if dtype == "float16":  # numpy has no bfloat16
        x = np.random.default_rng(0).uniform(-2, 2, (4, 8)).astype(dtype)
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        ref = 1 / (1 + np.exp(-np.tanh(np.exp(x.astype(np.float64)))))
        ref = np.exp(ref - ref.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (ref / ref.sum(-1, keepdims=True)), rtol=2e-3)
