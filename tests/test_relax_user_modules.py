"""Relax modules as TVM users write them (issue 24): dead code, ``call_tir_inplace``,
hand-written PrimFuncs, weights as parameters, plain string targets."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from fusion_tvm.api import count_kernels
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.testing.synthetic import ConstantCostModel

# fmt: off


@I.ir_module
class DeadGroup:
    """TVM's test_transform_fuse_ops.py::test_dead_group: lv..lv3 are never used."""

    @R.function
    def main(inp_0: R.Tensor((1, 784), "float32"), inp_1: R.Tensor((1, 128), "float32"),
             linear1_bias: R.Tensor((128,), "float32"),
             linear1_weight: R.Tensor((128, 784), "float32"),
             linear2_bias: R.Tensor((10,), "float32"),
             linear2_weight: R.Tensor((10, 128), "float32")) -> R.Tensor((1, 10), "float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            lv = R.permute_dims(linear1_weight, axes=None)
            lv1 = R.matmul(inp_0, lv, out_dtype="float32")
            lv2 = R.add(lv1, linear1_bias)
            lv3 = R.nn.relu(lv2)  # noqa: F841 - the dead group
            lv4 = R.permute_dims(linear2_weight, axes=None)
            lv5 = R.matmul(inp_1, lv4, out_dtype="float32")
            lv6 = R.add(lv5, linear2_bias)
            gv = lv6
            R.output(gv)
        return gv


@I.ir_module(s_tir=True)
class Inplace:
    """TVM's test_transform_fuse_ops.py::test_call_tir_inplace."""

    @T.prim_func(private=True, s_tir=True)
    def add(A: T.Buffer((T.int64(10), T.int64(20)), "float32"), B: T.Buffer((), "float32"),
            Out: T.Buffer((T.int64(10), T.int64(20)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for ax0, ax1 in T.grid(T.int64(10), T.int64(20)):
            with T.sblock("T_add"):
                v0, v1 = T.axis.remap("SS", [ax0, ax1])
                Out[v0, v1] = A[v0, v1] + B[()]

    @T.prim_func(private=True, s_tir=True)
    def exp_inplace(A: T.Buffer((T.int64(10), T.int64(20)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1 in T.grid(T.int64(10), T.int64(20)):
            with T.sblock("compute"):
                v0, v1 = T.axis.remap("SS", [i0, i1])
                A[v0, v1] = T.exp(A[v0, v1])

    @T.prim_func(private=True, s_tir=True)
    def squeeze_inplace(A: T.Buffer((T.int64(10), T.int64(20)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for ax0, ax1 in T.grid(T.int64(10), T.int64(20)):
            with T.sblock("T_squeeze"):
                v0, v1 = T.axis.remap("SS", [ax0, ax1])
                A[v0, v1] = A[v0, v1]

    @R.function
    def main(x: R.Tensor((10, 20), "float32"),
             p0: R.Tensor((), "float32")) -> R.Tensor((10, 20), "float32"):
        cls = Inplace
        with R.dataflow():
            lv = R.call_tir(cls.add, (x, p0), out_ty=R.Tensor((10, 20), "float32"))
            lv1 = R.call_tir_inplace(cls.exp_inplace, (lv,), inplace_indices=[0],
                                     out_ty=R.Tensor((10, 20), "float32"))
            gv = R.call_tir_inplace(cls.squeeze_inplace, (lv1,), inplace_indices=[0],
                                    out_ty=R.Tensor((10, 20), "float32"))
            R.output(gv)
        return gv


@I.ir_module(s_tir=True)
class MixedIndexDtypes:
    """Hand-written PrimFuncs with int32 buffer shapes around a legalized conv2d (int64)."""

    @T.prim_func(private=True, s_tir=True)
    def to_nchw(A: T.Buffer((1, 8, 8, 4), "float32"), B: T.Buffer((1, 4, 8, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, c, h, w in T.grid(1, 4, 8, 8):
            with T.sblock("B"):
                vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
                B[vn, vc, vh, vw] = A[vn, vh, vw, vc]

    @T.prim_func(private=True, s_tir=True)
    def relu32(A: T.Buffer((1, 8, 8, 8), "float32"), B: T.Buffer((1, 8, 8, 8), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, c, h, w in T.grid(1, 8, 8, 8):
            with T.sblock("B"):
                vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
                B[vn, vc, vh, vw] = T.max(A[vn, vc, vh, vw], T.float32(0))

    @R.function
    def main(x: R.Tensor((1, 8, 8, 4), "float32"), w: R.Tensor((8, 4, 3, 3), "float32")):
        cls = MixedIndexDtypes
        with R.dataflow():
            lv = R.call_tir(cls.to_nchw, (x,), out_ty=R.Tensor((1, 4, 8, 8), "float32"))
            lv1 = R.nn.conv2d(lv, w, padding=1)
            lv2 = R.call_tir(cls.relu32, (lv1,), out_ty=R.Tensor((1, 8, 8, 8), "float32"))
            gv = R.add(lv2, lv2)
            R.output(gv)
        return gv


# fmt: on


def _prepared(mod: tvm.IRModule) -> tvm.IRModule:
    mod = relax.transform.LegalizeOps()(mod)
    return relax.transform.AnnotateTIROpPattern()(mod)


def test_dead_group_is_dropped_as_fuseops_drops_it():
    mod = _prepared(DeadGroup)
    fused = FuseByCostModel(ConstantCostModel(fuse=True))(mod)  # used to raise InternalError
    assert relax.analysis.check_well_formed(fused)
    names = {b.var.name for b in fused["main"].body.blocks[0].bindings}
    assert not names & {"lv1", "lv2", "lv3"}
    lowered = relax.transform.FuseTIR()(fused)
    fuseops = relax.transform.FuseTIR()(relax.transform.FuseOps()(mod))
    assert count_kernels(lowered) <= count_kernels(fuseops)


def test_call_tir_inplace_is_fused_and_counted():
    mod = relax.transform.AnnotateTIROpPattern()(Inplace)
    assert count_kernels(mod) == 3  # call_tir_inplace counts as a kernel
    fused = relax.transform.FuseTIR()(FuseByCostModel("roofline", hw="ci-x86-avx2")(mod))
    assert relax.analysis.check_well_formed(fused)
    assert count_kernels(fused) == 1  # as FuseOps: one kernel
    x = np.random.default_rng(0).standard_normal((10, 20)).astype("float32")
    p0 = np.array(0.5, "float32")
    vm = relax.VirtualMachine(tvm.compile(fused, "llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(p0)).numpy()
    np.testing.assert_allclose(out, np.exp(x + p0), rtol=1e-5)


def _run(mod: tvm.IRModule, *arrays: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()


def test_int32_primfunc_next_to_int64_op_is_not_grouped_across():
    mod = _prepared(MixedIndexDtypes)
    with pytest.raises(Exception, match="Inconsistent buffers"):  # TVM's own fusion
        relax.transform.FuseTIR()(relax.transform.FuseOps()(mod))
    fused = relax.transform.FuseTIR()(FuseByCostModel(ConstantCostModel(fuse=True))(mod))
    assert relax.analysis.check_well_formed(fused)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 8, 4)).astype("float32")
    w = rng.standard_normal((8, 4, 3, 3)).astype("float32")
    np.testing.assert_allclose(_run(fused, x, w), _run(mod, x, w), rtol=1e-5, atol=1e-5)


def test_weights_as_parameters_run_or_bind():
    """A module whose main takes its weights (num_input): feed them at run time, or bind
    them at compile time with params=."""
    import fusion_tvm

    rng = np.random.default_rng(0)
    inp_0 = rng.standard_normal((1, 784)).astype("float32")
    inp_1 = rng.standard_normal((1, 128)).astype("float32")
    weights = {
        "linear1_bias": rng.standard_normal(128).astype("float32"),
        "linear1_weight": rng.standard_normal((128, 784)).astype("float32"),
        "linear2_bias": rng.standard_normal(10).astype("float32"),
        "linear2_weight": rng.standard_normal((10, 128)).astype("float32"),
    }
    expected = inp_1 @ weights["linear2_weight"].T + weights["linear2_bias"]
    cm = fusion_tvm.compile(DeadGroup, hw="ci-x86-avx2")
    assert cm.input_names[:2] == ("inp_0", "inp_1") and len(cm.input_names) == 6
    out = cm.run({"inp_0": inp_0, "inp_1": inp_1, **weights})
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-4)
    bound = fusion_tvm.compile(DeadGroup, hw="ci-x86-avx2", params=weights)
    assert bound.input_names == ("inp_0", "inp_1")
    np.testing.assert_allclose(bound.run([inp_0, inp_1])[0], expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(fusion_tvm.errors.UserInputError, match="not parameters"):
        fusion_tvm.compile(DeadGroup, params={"nope": inp_0})


def test_targets_as_tvm_targets_and_json_dicts():
    from fusion_tvm.errors import InvalidTargetError, UnknownNameError
    from fusion_tvm.pipeline import resolve
    from fusion_tvm.presets import host_cpu_name

    haswell = resolve({"kind": "llvm", "mcpu": "haswell"})
    assert haswell.hw.name == "ci-x86-avx2" and haswell.target.attrs["mcpu"] == "haswell"
    assert resolve('{"kind": "llvm", "mcpu": "haswell"}').hw.name == "ci-x86-avx2"  # CLI
    host = resolve(tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name()}))
    assert host.hw.name == "host"
    for plain in ("llvm", tvm.target.Target("llvm"), None):  # no CPU named: the host's
        assert resolve(plain).target.attrs["mcpu"] == host_cpu_name()
    for bad in ({"kind": "no-such-kind"}, '{"kind": ', {"kind": "vulkan"}):
        with pytest.raises(InvalidTargetError):
            resolve(bad)
    with pytest.raises(UnknownNameError):
        resolve("no-such-target")


def test_compile_takes_a_json_target():
    import fusion_tvm

    cm = fusion_tvm.compile(Inplace, target={"kind": "llvm", "mcpu": "haswell"})
    assert cm.target.attrs["mcpu"] == "haswell" and cm.hw.name == "ci-x86-avx2"
    x = np.ones((10, 20), "float32")
    np.testing.assert_allclose(cm.run([x, np.array(1.0, "float32")])[0], np.exp(x + 1),
                               rtol=1e-5)
    with pytest.raises(fusion_tvm.errors.InvalidTargetError):
        fusion_tvm.compile(Inplace, target={"kind": "no-such-kind"})


def test_cli_takes_a_json_target(tmp_path):
    from pathlib import Path

    from fusion_tvm.cli import main

    model = Path(__file__).parent / "data" / "cnn_bn.onnx"
    target = '{"kind": "llvm", "mcpu": "haswell"}'
    assert main(["plan", str(model), "--target", target, "--json", "-q"]) == 0
    assert main(["plan", str(model), "--target", '{"kind": "nope"}', "-q"]) != 0


_PACKED_CALLS: list[float] = []


@tvm.register_global_func("fusion_tvm_test.record", override=True)
def _record(x):
    _PACKED_CALLS.append(float(x.numpy().sum()))
    return x


# fmt: off
@I.ir_module
class SideEffect:
    """A packed call run for its side effect, its result unused: R.call_packed (impure)."""

    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        _ = R.call_packed("fusion_tvm_test.record", a, ty_args=R.Tensor((4,), "float32"))
        b = R.add(a, a)
        return b
# fmt: on


def test_impure_packed_call_with_unused_result_is_kept():
    """R.call_packed is kept by the fusion_tvm pipeline; R.call_pure_packed declares the call
    pure, and an unused pure call is dropped (by DeadCodeElimination here and by TVM's
    FuseTIR): the README says to use R.call_packed for side effects."""
    import fusion_tvm

    _PACKED_CALLS.clear()
    ex = tvm.compile(SideEffect, fusion_tvm.host_target(), relax_pipeline="fusion_tvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(np.zeros(4, "float32")))
    np.testing.assert_allclose(out.numpy(), 2.0)
    assert _PACKED_CALLS == [4.0]


def _asm(ex_or_target) -> str:
    """The assembly of the kernels of an executable (or of Inplace built for a target)."""
    ex = ex_or_target
    if isinstance(ex_or_target, tvm.target.Target):
        ex = tvm.compile(Inplace, ex_or_target, relax_pipeline="fusion_tvm")
    return "".join(m.inspect_source("asm") for m in ex.mod.imports if m.kind == "llvm")


def test_registered_pipeline_builds_host_code_for_a_target_naming_no_cpu(tmp_path):
    """tvm.compile(mod, "llvm", relax_pipeline="fusion_tvm") generated generic x86-64 code
    (fp16 matmul 17.7 s vs 0.09 s): the kernels are now built for the host's CPU."""
    import fusion_tvm

    with pytest.warns(UserWarning, match="names no CPU: kernels are built for the host"):
        ex = tvm.compile(Inplace, "llvm", relax_pipeline="fusion_tvm")
    if "ymm" in _asm(fusion_tvm.host_target()):  # a host with 256-bit vectors
        assert "ymm" in _asm(ex)  # generic x86-64 code has none
    x = np.random.default_rng(0).standard_normal((10, 20)).astype("float32")
    p0 = np.array(0.25, "float32")
    args = (tvm.runtime.tensor(x), tvm.runtime.tensor(p0))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    np.testing.assert_allclose(out, np.exp(x + p0), rtol=1e-5)
    host = tvm.compile(Inplace, fusion_tvm.host_target(), relax_pipeline="fusion_tvm")
    same = relax.VirtualMachine(host, tvm.cpu())["main"](*args).numpy()
    np.testing.assert_array_equal(out, same)
    path = str(tmp_path / "m.so")
    ex.export_library(path)  # the prebuilt kernels travel with the library
    loaded = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    np.testing.assert_array_equal(loaded["main"](*args).numpy(), out)
