"""Relax conformance: the runnable modules of TVM's fusion tests through our fusion.

Each case is a module of the shape TVM's own tests use (origin noted per case; shapes made
smaller so the unscheduled builds run fast). Every case runs through ``FuseByCostModel``
(roofline on a frozen CPU spec) + ``FuseTIR`` with ``relax.analysis.well_formed`` after
every pass, is built and compared with TVM's unfused build on random inputs (ints
exactly, floats within a tolerance scaled to the output), and its kernel count is set
against FuseOps + FuseTIR's: ours must not be larger unless the case says why.
``KERNELS`` records the table (``python -m pytest tests/test_relax_conformance.py -s``
prints it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import tvm
from test_relax_user_modules import DeadGroup, Inplace, MixedIndexDtypes
from tvm import relax, topi
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from fusion_tvm.api import count_kernels
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.pipeline import lower_passes

F32 = "float32"
UPSTREAM = "apache/tvm tests/python/relax/"


@dataclass
class Case:
    name: str
    origin: str
    build: Callable[[], tvm.IRModule]
    dims: dict[str, int] = field(default_factory=dict)
    #: why ours may launch more kernels than FuseOps (None: it must not)
    more_kernels_reason: str | None = None
    #: FuseOps + FuseTIR cannot lower the module (the reason)
    fuseops_fails: str | None = None


def _bb_main(params, body, name="main"):
    bb = relax.BlockBuilder()
    with bb.function(name, params):
        with bb.dataflow():
            out = body(bb, *params)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _t(shape, dtype=F32, name="x"):
    return relax.Var(name, R.Tensor(shape, dtype))


def _c(v, dtype=F32):
    return relax.const(v, dtype)


# --------------------------------------------------------------------------- cases
def fuse_simple():
    return _bb_main([_t((10, 20))], lambda bb, x: bb.call_te(
        topi.squeeze, bb.emit_te(topi.exp, bb.emit_te(topi.add, x, _c(1)))))


def conv2d_fuse():
    def body(bb, x, w1, w2, w3):
        lv0 = bb.emit_te(topi.add, x, _c(1))
        lv1 = bb.emit_te(topi.nn.conv2d, lv0, w1, strides=1, padding=1, dilation=1)
        lv2 = bb.emit_te(topi.add, _c(1), lv1)
        lv3 = bb.emit_te(topi.add, lv1, lv2)
        lv4 = bb.emit_te(topi.nn.conv2d, lv3, w2, strides=1, padding=0, dilation=1)
        lv5 = bb.emit_te(topi.nn.conv2d, lv3, w3, strides=1, padding=1, dilation=1)
        return bb.call_te(topi.add, lv4, lv5)

    return _bb_main([_t((1, 8, 16, 16)), _t((8, 8, 3, 3), name="w1"),
                     _t((8, 8, 1, 1), name="w2"), _t((8, 8, 3, 3), name="w3")], body)


def _pool(bb, x):
    return bb.emit_te(topi.nn.pool2d, x, kernel=(2, 2), stride=(2, 2), dilation=(1, 1),
                      padding=(0, 0, 0, 0), pool_type="max")


def concatenate():
    def body(bb, x):
        lv1 = bb.emit_te(topi.nn.upsampling, _pool(bb, x), scale_h=2.0, scale_w=2.0)
        lv2 = bb.emit_te(topi.concatenate, (lv1, x), axis=1)
        return bb.call_te(topi.add, lv2, _c(1))

    return _bb_main([_t((1, 8, 16, 16))], body)


def tuple_root():
    def body(bb, x):
        lv1 = bb.emit_te(topi.nn.upsampling, _pool(bb, x), scale_h=2.0, scale_w=2.0)
        return relax.Tuple([lv1, x])

    return _bb_main([_t((1, 8, 16, 16))], body)


def tuple_get_elemwise():
    dim = 10

    def body(bb, x, w):
        lv1 = bb.emit_te(topi.split, bb.emit_te(topi.nn.dense, x, w),
                         indices_or_sections=3, axis=1)
        lv3 = bb.emit_te(topi.sigmoid, bb.emit(relax.TupleGetItem(lv1, 0)))
        lv5 = bb.emit_te(topi.tanh, bb.emit(relax.TupleGetItem(lv1, 1)))
        lv7 = bb.emit_te(topi.exp, bb.emit(relax.TupleGetItem(lv1, 2)))
        return bb.call_te(topi.add, lv3, bb.emit_te(topi.multiply, lv5, lv7))

    return _bb_main([_t((1, dim)), _t((3 * dim, dim), name="w")], body)


def tuple_get_root():
    dim = 10

    def body(bb, x, w):
        lv0 = bb.emit_te(topi.split, x, indices_or_sections=3, axis=1)
        return bb.call_te(topi.nn.dense, bb.emit(relax.TupleGetItem(lv0, 0)), w)

    return _bb_main([_t((1, 3 * dim)), _t((dim, dim), name="w")], body)


def tuple_intermediate():
    def body(bb, x):
        lv0 = bb.emit_te(topi.squeeze, x)
        lv1 = bb.emit_te(topi.add, lv0, _c(1))
        lv3 = bb.emit_te(topi.add, bb.emit_te(topi.squeeze, lv0), _c(1))
        lv4 = bb.emit_te(topi.add, lv3, _c(1))
        lv5 = bb.emit_te(topi.add, lv0, _c(1))
        lv7 = bb.emit_te(topi.squeeze, bb.emit_te(topi.concatenate, (lv1, lv4, lv5), axis=1))
        return bb.call_te(topi.add, lv7, _c(1))

    return _bb_main([_t((1, 8, 16, 16))], body)


def tuple_consecutive():
    def body(bb, x):
        parts = []
        for _ in range(3):
            adds = [bb.emit_te(topi.add, x, _c(1)) for _ in range(3)]
            cat = bb.emit_te(topi.concatenate, adds, axis=1)
            parts.append(bb.emit_te(topi.add, cat, _c(1)))
        lv15 = bb.emit_te(topi.concatenate, parts, axis=1)
        lv17 = bb.emit_te(topi.add, _pool(bb, lv15), _c(1))
        return relax.Tuple([lv17, bb.emit_te(topi.add, lv17, _c(1))])

    return _bb_main([_t((1, 4, 8, 8))], body)


def inception_like():
    def body(bb, x, w0, w1, w2, w3):
        def conv_relu(a, w):
            c = bb.emit_te(topi.nn.conv2d, a, w, strides=1, padding=1, dilation=1)
            return bb.emit_te(topi.nn.relu, c)

        lv4 = bb.emit_te(topi.concatenate, (conv_relu(x, w0), conv_relu(x, w1)), axis=1)
        return bb.call_te(topi.concatenate, (conv_relu(lv4, w2), conv_relu(lv4, w3)), axis=1)

    ws = [_t((8, 8, 3, 3), name="w0"), _t((8, 8, 3, 3), name="w1"),
          _t((8, 16, 3, 3), name="w2"), _t((8, 16, 3, 3), name="w3")]
    return _bb_main([_t((1, 8, 16, 16)), *ws], body)


def parallel_injective():
    def body(bb, x):
        lv0 = bb.emit_te(topi.add, x, _c(1, "int32"))
        lv1 = bb.emit_te(topi.squeeze, lv0)
        lv3 = bb.emit_te(topi.transpose, bb.emit_te(topi.transpose, lv0, axes=[1, 0]),
                         axes=[1, 0])
        return bb.call_te(topi.left_shift, lv1, lv3)

    return _bb_main([_t((10, 20), "int32")], body)


def softmax():
    return _bb_main([_t((16, 16))], lambda bb, x: bb.call_te(
        topi.cast, bb.emit_te(topi.nn.softmax, x), dtype="float16"))


def multiple_relax_functions():
    bb = relax.BlockBuilder()
    for name, shape in (("func1", (10, 20)), ("func2", (20, 10))):
        x = _t(shape)
        with bb.function(name, [x]):
            with bb.dataflow():
                lv1 = bb.emit_te(topi.exp, bb.emit_te(topi.add, x, _c(1)))
                gv = bb.emit_output(bb.call_te(topi.squeeze, lv1))
            bb.emit_func_output(gv)
    return bb.get()


def symbolic_shape_aware_fuse():
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    return _bb_main([_t((n, m))], lambda bb, x: bb.call_te(
        topi.squeeze, bb.emit_te(topi.exp, bb.emit_te(topi.add, x, _c(1)))))


def partially_used_tuple_param():
    x = relax.Var("x", R.Tuple(*[R.Tensor((2,), F32) for _ in range(6)]))

    def body(bb, x):
        y0 = bb.emit_te(topi.add, bb.emit(relax.TupleGetItem(x, 0)), _c(1))
        return bb.call_te(topi.divide, y0, _c(1))

    return _bb_main([x], body)


# fmt: off
@I.ir_module
class MultiplePaths:
    """test_transform_fuse_ops.py::test_multiple_paths (320 channels -> 8, 64x64 -> 8x8)."""

    @R.function
    def main(inp_0: R.Tensor((2, 8, 8, 8), "float32"), inp_1: R.Tensor((2, 16), "float32"),
             w1: R.Tensor((8, 8, 3, 3), "float32"), b1: R.Tensor((8,), "float32"),
             w2: R.Tensor((8, 16), "float32"), b2: R.Tensor((8,), "float32")):
        R.func_attr({"num_input": 2})
        with R.dataflow():
            lv27 = R.nn.conv2d(inp_0, w1, strides=[1, 1], padding=[1, 1, 1, 1])
            lv28 = R.reshape(b1, R.shape([1, 8, 1, 1]))
            lv29 = R.add(lv27, lv28)
            lv31 = R.permute_dims(w2, axes=None)
            lv32 = R.matmul(inp_1, lv31, out_dtype="float32")
            lv33 = R.add(lv32, b2)
            lv35 = R.reshape(lv33, R.shape([2, 8, 1, 1]))
            gv = R.add(lv29, lv35)
            R.output(gv)
        return gv


@I.ir_module
class LayerNormSilu:
    """test_transform_fuse_ops.py::test_layer_norm_silu, as Relax ops (512x64x64 -> 8x8x8)."""

    @R.function
    def main(x: R.Tensor((1, 8, 8, 8), "float32"), gamma: R.Tensor((8, 8), "float32"),
             beta: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            gv0 = R.nn.layer_norm(x, gamma, beta, axes=[2, 3])
            gv1 = R.nn.silu(gv0)
            R.output(gv1)
        return gv1


@I.ir_module
class MatchCastChain:
    """test_transform_fuse_ops.py::test_skipping_match_cast, with work on both sides."""

    @R.function
    def main(A: R.Tensor((10, 20), "float32")) -> R.Tensor(dtype="float32", ndim=2):
        m = T.int64()
        n = T.int64()
        with R.dataflow():
            a = R.exp(A)
            lv = R.match_cast(a, R.Tensor((m, n), "float32"))
            b = R.add(lv, lv)
            gv = R.nn.relu(b)
            R.output(gv)
        return gv


@I.ir_module
class DynamicMatmulGelu:
    """test_vm_build.py-style dynamic batch: matmul + bias + GELU + residual."""

    @R.function
    def main(x: R.Tensor(("b", 16), "float32"), w: R.Tensor((16, 16), "float32"),
             bias: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, bias)
            g = R.nn.gelu(z)
            gv = R.add(g, x)
            R.output(gv)
        return gv


@I.ir_module
class SoftmaxReduction:
    """test_transform_fuse_tir.py-style reduction chain: softmax, sum, divide."""

    @R.function
    def main(x: R.Tensor((4, 32), "float32")):
        with R.dataflow():
            s = R.nn.softmax(x, axis=-1)
            t = R.sum(s, axis=[1], keepdims=True)
            u = R.divide(s, t)
            gv = R.multiply(u, R.const(2.0, "float32"))
            R.output(gv)
        return gv


@I.ir_module
class TwoBlocks:
    """Two dataflow blocks with a non-dataflow binding between (test_vm_build.py shape)."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, a)
            R.output(b)
        c = R.add(b, x)
        with R.dataflow():
            d = R.nn.relu(c)
            e = R.multiply(d, d)
            R.output(e)
        return e


@I.ir_module
class IntArith:
    """Integer chain (exact comparison): test_fuse_parallel_injective's dtype with a sum."""

    @R.function
    def main(x: R.Tensor((8, 12), "int32"), y: R.Tensor((12,), "int32")):
        with R.dataflow():
            a = R.add(x, y)
            b = R.multiply(a, R.const(3, "int32"))
            c = R.sum(b, axis=[1])
            gv = R.subtract(c, R.const(7, "int32"))
            R.output(gv)
        return gv
@I.ir_module(s_tir=True)
class InplaceOnParam:
    """test_transform_fuse_ops.py::test_call_tir_inplace's kernel in place on a parameter."""

    @T.prim_func(private=True, s_tir=True)
    def exp_inplace(A: T.Buffer((T.int64(10), T.int64(20)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1 in T.grid(T.int64(10), T.int64(20)):
            with T.sblock("compute"):
                v0, v1 = T.axis.remap("SS", [i0, i1])
                A[v0, v1] = T.exp(A[v0, v1])

    @T.prim_func(private=True, s_tir=True)
    def add(A: T.Buffer((T.int64(10), T.int64(20)), "float32"),
            B: T.Buffer((T.int64(10), T.int64(20)), "float32"),
            Out: T.Buffer((T.int64(10), T.int64(20)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for ax0, ax1 in T.grid(T.int64(10), T.int64(20)):
            with T.sblock("T_add"):
                v0, v1 = T.axis.remap("SS", [ax0, ax1])
                Out[v0, v1] = A[v0, v1] + B[v0, v1]

    @R.function
    def main(x: R.Tensor((10, 20), "float32"), y: R.Tensor((10, 20), "float32")):
        cls = InplaceOnParam
        with R.dataflow():
            lv1 = R.call_tir_inplace(cls.exp_inplace, (x,), inplace_indices=[0],
                                     out_ty=R.Tensor((10, 20), "float32"))
            gv = R.call_tir(cls.add, (lv1, y), out_ty=R.Tensor((10, 20), "float32"))
            R.output(gv)
        return gv
# fmt: on


def _scripted(mod):
    return lambda: mod


CASES = [
    Case("fuse_simple", UPSTREAM + "test_transform_fuse_ops.py::test_fuse_simple", fuse_simple),
    Case("conv2d_fuse", UPSTREAM + "test_transform_fuse_ops.py::test_conv2d_fuse", conv2d_fuse),
    Case("concatenate", UPSTREAM + "test_transform_fuse_ops.py::test_concatenate", concatenate),
    Case("tuple_root", UPSTREAM + "test_transform_fuse_ops.py::test_tuple_root", tuple_root),
    Case("tuple_get_elemwise", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_fuse_tuple_get_elemwise", tuple_get_elemwise,
         more_kernels_reason="split returns a tuple: the fusion graph keeps a PrimFunc with "
         "several outputs apart (FuseOps puts it in the dense's kernel)"),
    Case("tuple_get_root", UPSTREAM + "test_transform_fuse_ops.py::test_tuple_get_root",
         tuple_get_root),
    Case("tuple_intermediate", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_tuple_intermediate", tuple_intermediate),
    Case("tuple_consecutive", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_tuple_consecutive", tuple_consecutive),
    Case("inception_like", UPSTREAM + "test_transform_fuse_ops.py::test_inception_like",
         inception_like),
    Case("parallel_injective", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_fuse_parallel_injective", parallel_injective),
    Case("softmax_cast", UPSTREAM + "test_transform_fuse_ops.py::test_softmax", softmax),
    Case("multiple_relax_functions", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_multiple_relax_functions", multiple_relax_functions),
    Case("layer_norm_silu", UPSTREAM + "test_transform_fuse_ops.py::test_layer_norm_silu",
         _scripted(LayerNormSilu)),
    Case("multiple_paths", UPSTREAM + "test_transform_fuse_ops.py::test_multiple_paths",
         _scripted(MultiplePaths)),
    Case("dead_group", UPSTREAM + "test_transform_fuse_ops.py::test_dead_group",
         _scripted(DeadGroup)),
    Case("symbolic_shape", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_symbolic_shape_aware_fuse", symbolic_shape_aware_fuse, {"n": 3, "m": 5}),
    Case("match_cast_chain", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_skipping_match_cast", _scripted(MatchCastChain)),
    Case("partially_used_tuple_param", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_partially_used_tuple_param", partially_used_tuple_param),
    Case("call_tir_inplace", UPSTREAM + "test_transform_fuse_ops.py::test_call_tir_inplace",
         _scripted(Inplace)),
    Case("call_tir_inplace_on_param", UPSTREAM + "test_transform_fuse_ops.py::"
         "test_call_tir_inplace (in place on a parameter)", _scripted(InplaceOnParam)),
    Case("mixed_index_dtypes", "issue 24 (int32 PrimFunc next to a legalized conv2d)",
         _scripted(MixedIndexDtypes),
         fuseops_fails="FuseTIR: inconsistent buffers mapped to the same relax var"),
    Case("dynamic_matmul_gelu", UPSTREAM + "test_vm_build.py (dynamic shapes)",
         _scripted(DynamicMatmulGelu), {"b": 3},
         more_kernels_reason="legality: the GELU reads its input more than once per "
         "element, so it cannot run on the matmul's output tiles (our matmul template's "
         "epilogue rule); FuseOps makes one unscheduled kernel"),
    Case("softmax_reduction", UPSTREAM + "test_transform_fuse_tir.py (reductions)",
         _scripted(SoftmaxReduction)),
    Case("two_blocks", UPSTREAM + "test_vm_build.py (several binding blocks)",
         _scripted(TwoBlocks)),
    Case("int_arith", UPSTREAM + "test_transform_fuse_ops.py (int32 ops)", _scripted(IntArith)),
]

#: case -> (kernels ours, kernels FuseOps or None, unfused kernels)
KERNELS: dict[str, tuple[int, int | None, int]] = {}


# --------------------------------------------------------------------------- harness
def _checked(passes, mod: tvm.IRModule) -> tvm.IRModule:
    for p in passes:
        mod = p(mod)
        relax.analysis.well_formed(mod)  # raises on the first violation
        assert relax.analysis.check_well_formed(mod), p
    return mod


def _prepare(mod: tvm.IRModule) -> tvm.IRModule:
    return _checked([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()],
                    mod)


def _random(ty, dims: dict[str, int], rng):
    if isinstance(ty, relax.TupleType):
        return [_random(f, dims, rng) for f in ty.fields]
    shape = []
    for d in ty.shape.values:
        shape.append(int(d) if isinstance(d, tvm.tirx.IntImm) else dims[str(d)])
    dtype = str(ty.dtype)
    if dtype.startswith("int"):
        return rng.integers(-8, 8, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _to_device(value):
    if isinstance(value, list):
        return [_to_device(v) for v in value]
    return tvm.runtime.tensor(value)


def _numpy(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in _numpy(v)]


def _run_all(mod: tvm.IRModule, feeds: dict[str, list]) -> dict[str, list[np.ndarray]]:
    lower = tvm.transform.Sequential(lower_passes())
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm", relax_pipeline=lower), tvm.cpu())
    return {name: _numpy(vm[name](*_to_device(args))) for name, args in feeds.items()}


def _entry_points(mod: tvm.IRModule) -> list[str]:
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, relax.Function) and f.attrs is not None
                  and "global_symbol" in f.attrs and "Primitive" not in f.attrs)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_matches_unfused_tvm(case: Case):
    prepared = _prepare(case.build())
    ours = _checked([FuseByCostModel("roofline", hw="ci-x86-avx2"), relax.transform.FuseTIR(),
                     relax.transform.DeadCodeElimination()], prepared)
    fuseops = None
    if case.fuseops_fails is None:
        fuseops = count_kernels(_checked(
            [relax.transform.FuseOps(), relax.transform.FuseTIR()], prepared))
    else:
        with pytest.raises(Exception):  # noqa: B017 - recorded: TVM's own fusion fails here
            relax.transform.FuseTIR()(relax.transform.FuseOps()(prepared))
    KERNELS[case.name] = (count_kernels(ours), fuseops, count_kernels(prepared))
    if fuseops is not None and case.more_kernels_reason is None:
        assert count_kernels(ours) <= fuseops, KERNELS[case.name]
    rng = np.random.default_rng(0)
    feeds = {name: [_random(p.ty, case.dims, rng) for p in prepared[name].params]
             for name in _entry_points(prepared)}
    want, got = _run_all(prepared, feeds), _run_all(ours, feeds)
    for name in feeds:
        assert len(want[name]) == len(got[name])
        for w, g in zip(want[name], got[name], strict=True):
            assert w.shape == g.shape and w.dtype == g.dtype
            if np.issubdtype(w.dtype, np.integer):
                np.testing.assert_array_equal(g, w)
            else:
                w64, g64 = w.astype("float64"), g.astype("float64")
                scale = max(1.0, float(np.abs(w64).max(initial=0.0)))
                tol = (1e-2 if w.dtype == np.float16 else 1e-4) * scale
                np.testing.assert_allclose(g64, w64, rtol=0, atol=tol)


def test_zz_kernel_table():
    """The kernel counts of the cases that ran (``-s`` shows the table)."""
    print(f"\n{'case':30s} {'ours':>5s} {'FuseOps':>8s} {'unfused':>8s}")
    for name, (ours, fo, unfused) in KERNELS.items():
        print(f"{name:30s} {ours:5d} {str(fo) if fo is not None else 'fails':>8s} "
              f"{unfused:8d}")
    excused = {c.name for c in CASES if c.more_kernels_reason}
    assert all(fo is None or ours <= fo or name in excused
               for name, (ours, fo, _) in KERNELS.items())
