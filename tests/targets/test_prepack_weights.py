"""PrepackWeights: constant matmul weights are packed at compile time, not on every call."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import relax as R

import fusion_tvm
from fusion_tvm.passes.mark_constant_params import CONSTANT_PARAMS_ATTR
from fusion_tvm.passes.prepack_weights import PREPACK_ATTR, _blocks, split_prepack

RNG = np.random.default_rng(7)


def _kernels(cm) -> dict:
    return {gv.name_hint: f for gv, f in cm.fused_mod.functions_items()
            if isinstance(f, tirx.PrimFunc)}


def _linear(m, k, n, weight, second_weight=None):
    """``relu(x @ W + b)``, and ``x @ V`` when ``second_weight`` is given (a parameter when
    it is the string "param")."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, k), "float32"))
    params = [x]
    if isinstance(second_weight, str):
        v = relax.Var("v", R.Tensor((k, n), "float32"))
        params.append(v)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.const(weight)),
                                                      relax.const(np.ones(n, "float32")))))
            if second_weight is not None:
                other = params[1] if isinstance(second_weight, str) else relax.const(second_weight)
                y = bb.emit(relax.op.add(y, relax.op.matmul(x, other)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("m,k,n", [(128, 64, 96), (197, 40, 70), (3, 33, 17)])
def test_constant_weight_is_packed_at_compile_time(m, k, n):
    w = RNG.standard_normal((k, n)).astype("float32")
    cm = fusion_tvm.compile(_linear(m, k, n, w))
    kernels = _kernels(cm)
    assert len(kernels) == 1
    (func,) = kernels.values()
    # The kernel reads a 4-d packed panel [1, N / nr, K, nr] and packs nothing itself.
    packed = [p for p in func.params if len(p.ty.shape) == 4]
    assert len(packed) == 1
    _, panels, kk, nr = (int(d) for d in packed[0].ty.shape)
    assert kk == k and panels * nr >= n and (panels - 1) * nr < n
    assert not any(b.annotations and PREPACK_ATTR in b.annotations for b in _blocks(func.body))
    assert relax.analysis.check_well_formed(cm.fused_mod)
    x = RNG.standard_normal((m, k)).astype("float32")
    ref = fusion_tvm.compile(_linear(m, k, n, w), fusion="none", schedule=False)
    np.testing.assert_allclose(cm.run([x])[0], ref.run([x])[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cm.run([x])[0], np.maximum(x @ w + 1, 0), rtol=1e-4, atol=1e-4)


def test_kernel_shared_with_a_runtime_weight_is_not_prepacked():
    """``x @ W`` (constant) and ``x @ v`` (a parameter) are the same PrimFunc; it keeps its
    in-kernel pack, since the constant-parameter attribute needs every caller to agree."""
    k, n, m = 32, 48, 200
    w, v = (RNG.standard_normal((k, n)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, k), "float32"))
    vv = relax.Var("v", R.Tensor((k, n), "float32"))
    with bb.function("main", [x, vv]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(w)))
            b = bb.emit(relax.op.matmul(x, vv))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    cm = fusion_tvm.compile(bb.get())
    kernels = _kernels(cm)
    assert len(kernels) == 1  # one PrimFunc, two calls
    (func,) = kernels.values()
    assert CONSTANT_PARAMS_ATTR not in (func.attrs or {})
    assert all(len(p.ty.shape) == 2 for p in func.params)
    x_ = RNG.standard_normal((m, k)).astype("float32")
    got = cm.run([x_, v])
    np.testing.assert_allclose(got[0], x_ @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], x_ @ v, rtol=1e-4, atol=1e-4)


def test_symbolic_rows_with_constant_weight():
    k, n = 48, 80
    w = RNG.standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    s = tirx.Var("S", "int64")
    x = relax.Var("x", R.Tensor((s, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    cm = fusion_tvm.compile(bb.get())
    (func,) = _kernels(cm).values()
    assert any(len(p.ty.shape) == 4 for p in func.params)
    for rows in (1, 7, 64, 131):
        x_ = RNG.standard_normal((rows, k)).astype("float32")
        np.testing.assert_allclose(cm.run([x_])[0], x_ @ w, rtol=1e-4, atol=1e-4)


def test_split_needs_constant_params():
    """Without ``fusion_tvm.constant_params`` nothing is split, whatever the marks say."""
    w = RNG.standard_normal((16, 32)).astype("float32")
    cm = fusion_tvm.compile(_linear(64, 16, 32, w))
    (func,) = _kernels(cm).values()
    assert split_prepack(func.without_attr(CONSTANT_PARAMS_ATTR)) is None


def test_schedule_only_pipeline_has_no_constant_attr():
    """``schedule=False`` leaves the stock TIR: no attribute, no split."""
    w = RNG.standard_normal((16, 32)).astype("float32")
    cm = fusion_tvm.compile(_linear(64, 16, 32, w), schedule=False)
    for func in _kernels(cm).values():
        assert CONSTANT_PARAMS_ATTR not in (func.attrs or {})
    assert isinstance(cm.fused_mod, tvm.IRModule)


@pytest.mark.parametrize("k,n", [(1280, 1000), (40, 17), (320, 21841), (64, 64)])
def test_one_row_gemv_streams_a_prepacked_weight(k, n):
    """A batch-1 classifier ``x[1, K] @ W[K, N]``: W is repacked at compile time into
    contiguous ``K x nr`` column panels of two full vectors (one per task), zero-padded
    when ``nr`` does not divide N (before: a ragged N ran its vector loop scalar, and
    narrowed panels part-width). Same numbers either way."""
    w = RNG.standard_normal((k, n)).astype("float32")
    cm = fusion_tvm.compile(_linear(1, k, n, w))
    (func,) = _kernels(cm).values()
    assert str(func.attrs["fusion_tvm.rule"]) == "matmul"
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    nr = 2 * max(1, cm.hw.simd_width_bits // 32)
    (panel,) = [s for s in shapes if len(s) == 3]
    assert panel == [-(-n // nr), k, nr]
    assert [k, n] not in shapes
    assert not any(b.annotations and PREPACK_ATTR in b.annotations for b in _blocks(func.body))
    x = RNG.standard_normal((1, k)).astype("float32")
    np.testing.assert_allclose(cm.run([x])[0], np.maximum(x @ w + 1, 0), rtol=1e-4, atol=1e-3)
