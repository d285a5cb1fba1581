"""FusionGraph analysis: FLOPs, bytes, op classes, symbolic dims, barriers, match_cast."""

import pytest
import tvm
from tvm import relax, tirx, topi

from fusion_tvm.graph import build_fusion_graph, default_dims
from fusion_tvm.grouping import vars_used_after
from fusion_tvm.ops import OpClass, PatternKind
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.testing.synthetic import ConstantCostModel


def _graph(mod, dims=None):
    func = mod["main"]
    return build_fusion_graph(mod, func.body.blocks[0], vars_used_after(func, 0), dims or {})


def _matmul_module(m="M"):
    n = tirx.Var(m, "int64") if isinstance(m, str) else m
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 32), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_te(topi.nn.matmul, x, w, primfunc_name_hint="matmul")
            z = bb.emit_te(topi.tanh, y, primfunc_name_hint="tanh")
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(bb.get())


def test_matmul_flops_and_bytes_with_symbolic_dim():
    mod = _matmul_module()
    g = _graph(mod, {"M": 16})
    mm, th = g.nodes[0], g.nodes[1]
    assert mm.op_class is OpClass.MATMUL and mm.is_contraction
    assert mm.flops({"M": 16})[OpClass.MATMUL] == pytest.approx(2 * 16 * 64 * 32)
    assert mm.flops({"M": 3})[OpClass.MATMUL] == pytest.approx(2 * 3 * 64 * 32)
    assert th.op_class is OpClass.TRANSCENDENTAL
    assert th.pattern is PatternKind.ELEMWISE
    out = g.tensors[mm.outputs[0]]
    assert isinstance(out.shape[0], tirx.Var) and out.shape[0].name == "M"  # kept symbolic
    assert out.nbytes({"M": 16}) == 16 * 32 * 4
    # x is read 32 times per element by the matmul (once per output column)
    assert mm.reuse(0, {"M": 16}) == pytest.approx(32)
    assert g.succs[0] == {1} and g.preds[1] == {0}


def test_default_dims_batch_is_one_other_dims_128():
    mod = _matmul_module()
    assert default_dims(mod) == {"M": 1}
    assert default_dims(mod, {"M": 7}) == {"M": 7}


def test_non_call_tir_bindings_are_barriers():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="exp")
            t = bb.emit(relax.Tuple([a, x]))
            b = bb.emit(relax.TupleGetItem(t, 0))
            c = bb.emit_te(topi.nn.relu, b, primfunc_name_hint="relu")
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(bb.get())
    g = _graph(mod)
    assert [n.fusible for n in g.nodes] == [True, False, False, True, False][: len(g.nodes)]
    # exp -> tuple -> getitem -> relu: fusing exp with relu would swallow the barriers
    after = FuseByCostModel(ConstantCostModel(fuse=True), compare_fuseops=False)(mod)
    tvm.ir.assert_structural_equal(after["main"], mod["main"])


def test_match_cast_defined_dims_stay_before_uses():
    """TVM #20195: fusion must not hoist a binding above the match_cast defining its dim."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="exp")
            flat = bb.emit(relax.op.reshape(a, (32,)))
            d = bb.match_cast(flat, relax.TensorType((n,), "float32"))
            e = bb.emit_te(topi.nn.relu, d, primfunc_name_hint="relu")
            f = bb.emit_te(topi.exp, e, primfunc_name_hint="exp2")
            out = bb.emit_output(f)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    after = FuseByCostModel(ConstantCostModel(fuse=True), compare_fuseops=False)(mod)
    assert relax.analysis.check_well_formed(after)
    assert relax.analysis.check_well_formed(relax.transform.FuseTIR()(after))
    bindings = after["main"].body.blocks[0].bindings
    mc = next(i for i, b in enumerate(bindings) if isinstance(b, relax.MatchCast))
    users = [i for i, b in enumerate(bindings)
             if any(v.same_as(bindings[mc].var) for v in relax.analysis.free_vars(b.value))]
    assert users and all(i > mc for i in users)
