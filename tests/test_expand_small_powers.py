"""ExpandSmallPowers: ``R.power(x, c)`` with a small integer constant ``c`` as multiplies.

Structural (TVMScript Before / Expected), then end to end against onnxruntime on GPT-2's
GELU-tanh and a layer norm exported with ``Pow(x, 2)``, and special values (NaN, +-Inf, -0,
overflow) against the build without the pass.
"""

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import fusion_tvm
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.passes import expand_small_powers
from fusion_tvm.passes.expand_small_powers import ExpandSmallPowers

HW = "ci-x86-avx2"


def test_small_integer_exponents_become_multiplies():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), h: R.Tensor((2,), "float16")):
            with R.dataflow():
                a = R.power(x, R.const(2.0, "float32"))
                b = R.power(a, R.const(3.0, "float32"))
                c = R.power(b, R.const(4.0, "float32"))
                d = R.power(c, R.const(1.0, "float32"))
                e = R.power(d, R.const(0.0, "float32"))
                f = R.power(h, R.const(3.0, "float16"))
                R.output(e, f)
            return (e, f)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), h: R.Tensor((2,), "float16")):
            with R.dataflow():
                a = R.multiply(x, x)
                lv = R.multiply(a, a)
                b = R.multiply(lv, a)
                lv1 = R.multiply(b, b)
                c = R.multiply(lv1, lv1)
                d = c
                e = R.ones_like(d)
                lv2 = R.multiply(h, h)
                f = R.multiply(lv2, h)
                R.output(e, f)
            return (e, f)

    tvm.ir.assert_structural_equal(ExpandSmallPowers()(Before), Expected)


def test_other_exponents_are_left_alone():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32"),
                 s: R.Tensor((), "float32")):
            with R.dataflow():
                a = R.power(x, R.const(0.5, "float32"))  # sqrt differs at -0 and -inf
                b = R.power(a, R.const(5.0, "float32"))
                c = R.power(b, R.const(-1.0, "float32"))
                d = R.power(c, y)  # not a constant
                e = R.power(d, R.const(np.full((4, 8), 2.0, "float32")))  # not a scalar
                f = R.power(s, R.const(np.array([2.0], "float32")))  # would add an axis
                R.output(e, f)
            return (e, f)

    tvm.ir.assert_structural_equal(ExpandSmallPowers()(Before), Before)


def _gelu_tanh_model(shape):
    g = GraphBuilder("gelu_tanh")
    x = g.add_input("x", shape)
    g.add_output(g.gelu_tanh(x))
    return g.build()


def _layernorm_pow_model(shape):
    g = GraphBuilder("layernorm_pow")
    x = g.add_input("x", shape)
    g.add_output(g.layernorm(x, shape[-1], decomposed=True))
    return g.build()


def _powers_model(shape):
    """Pow(x, c) for every rewritten exponent, each an output."""
    g = GraphBuilder("powers")
    x = g.add_input("x", shape)
    for c in (0.0, 1.0, 2.0, 3.0, 4.0):
        g.add_output(g.op("Pow", [x, g.const(c)]))
    return g.build()


def _calls_pow(cm) -> bool:
    """Whether a built kernel calls ``pow`` (the scalar libm call)."""
    return any("T.pow(" in func.script() for func in cm.fused_mod.functions.values()
               if isinstance(func, tirx.PrimFunc))


@pytest.mark.parametrize("make", [_gelu_tanh_model, _layernorm_pow_model])
def test_equal_to_onnxruntime_without_pow(make):
    model = make([4, 96])
    x = np.random.default_rng(0).standard_normal((4, 96)).astype("float32") * 3
    (ref,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    cm = fusion_tvm.compile(model, hw=HW)
    assert not _calls_pow(cm)
    np.testing.assert_allclose(cm.run({"x": x})[0], ref, rtol=1e-5, atol=1e-5)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e20, -1e20, 1e-30, -1.5, 2.5,
                    3.0, -7.0], "float32")


def test_special_values_as_without_the_pass(monkeypatch):
    model = _powers_model([SPECIAL.size])
    feeds = {"x": SPECIAL}
    ours = fusion_tvm.compile(model, hw=HW).run(feeds)
    monkeypatch.setattr(expand_small_powers, "_small_exponent", lambda c, x: None)
    stock = fusion_tvm.compile(model, hw=HW, fusion="none")
    assert _calls_pow(stock)  # the reference really calls powf
    ref = stock.run(feeds)
    (ort_ref) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for c, a, b, o in zip((0, 1, 2, 3, 4), ours, ref, ort_ref, strict=True):
        # NaN where powf gives NaN, the same infinities (with signs) and signed zeros
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"x**{c}")
        np.testing.assert_array_equal(a[np.isinf(b)], b[np.isinf(b)], err_msg=f"x**{c}")
        np.testing.assert_array_equal(np.signbit(a), np.signbit(b), err_msg=f"x**{c}")
        np.testing.assert_allclose(a, b, rtol=2e-7, atol=0, err_msg=f"x**{c}")
        np.testing.assert_allclose(a, o, rtol=2e-7, atol=0, err_msg=f"x**{c} vs ort")


def test_pass_runs_in_the_pipeline_before_legalization():
    from fusion_tvm.pipeline import prepare_passes

    names = [p.info.name for p in prepare_passes()]
    assert names.index("ExpandSmallPowers") < names.index("LegalizeOps")
    mod = fusion_tvm.frontend.load_model(_gelu_tanh_model([2, 8])).mod
    assert not any(
        isinstance(n, relax.Call) and n.op.same_as(tvm.ir.Op.get("relax.power"))
        for f in ExpandSmallPowers()(mod).functions.values() if isinstance(f, relax.Function)
        for n in _calls(f))


def _calls(func):
    found = []
    relax.analysis.post_order_visit(func, lambda n: found.append(n) if isinstance(n, relax.Call)
                                    else None)
    return found


def test_a_pow_left_in_tir_is_priced_as_transcendental_unless_llvm_expands_it():
    """``pow(x, 2)`` becomes ``x * x`` in LLVM; ``pow(x, 3)`` stays a libm call."""
    from fusion_tvm.hardware import OpClass
    from fusion_tvm.tir_analysis import analyze_primfunc

    def power(c):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((64,), "float32"))
        with bb.function("main", [x]):
            bb.emit_func_output(bb.emit(relax.op.power(x, relax.const(c, "float32"))))
        mod = relax.transform.LegalizeOps()(bb.get())
        (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        return analyze_primfunc(func)

    assert power(2.0).op_class is OpClass.ELEMENTWISE
    assert power(3.0).op_class is OpClass.TRANSCENDENTAL
