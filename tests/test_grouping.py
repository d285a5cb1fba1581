"""Grouping rewrites: Before / Expected structural tests with fake cost models."""

import tvm
from tvm import relax, topi

from fusion_tvm.graph import build_fusion_graph
from fusion_tvm.grouping import rewrite_block, vars_used_after
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.testing.synthetic import ConstantCostModel

SHAPE = (4, 8)


def _before():
    """x -> exp -> add(., y) -> relu ; the add is also returned (multi-output)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    y = relax.Var("y", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="exp")
            b = bb.emit_te(topi.add, a, y, primfunc_name_hint="add")
            c = bb.emit_te(topi.nn.relu, b, primfunc_name_hint="relu")
            out = bb.emit_output(relax.Tuple([b, c]))
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(bb.get())


def _expected_always_fuse():
    bb = relax.BlockBuilder()
    # the primitive function: exp, add, relu in one group publishing add and relu
    p0 = relax.Var("p0", relax.TensorType(SHAPE, "float32"))
    p1 = relax.Var("p1", relax.TensorType(SHAPE, "float32"))
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    y = relax.Var("y", relax.TensorType(SHAPE, "float32"))
    with bb.function("fused_exp_add_relu", [p0, p1], attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, p0, primfunc_name_hint="exp")
            b = bb.emit_te(topi.add, a, p1, primfunc_name_hint="add")
            c = bb.emit_te(topi.nn.relu, b, primfunc_name_hint="relu")
            gv = bb.emit_output(relax.Tuple([b, c]))
        bb.emit_func_output(gv)
    fused = bb.get().get_global_var("fused_exp_add_relu")
    with bb.function("main", [x, y]):
        with bb.dataflow():
            t = bb.emit(relax.Call(fused, [x, y]))
            b = bb.emit(relax.TupleGetItem(t, 0))
            c = bb.emit(relax.TupleGetItem(t, 1))
            out = bb.emit_output(relax.Tuple([b, c]))
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(bb.get())


def test_always_fuse_makes_one_multi_output_group():
    after = FuseByCostModel(ConstantCostModel(fuse=True), compare_fuseops=False)(_before())
    expected = _expected_always_fuse()
    tvm.ir.assert_structural_equal(after["main"], expected["main"], map_free_vars=True)
    tvm.ir.assert_structural_equal(
        after["fused_exp_add_relu"], expected["fused_exp_add_relu"], map_free_vars=True
    )
    assert relax.analysis.check_well_formed(after)
    fused_tir = relax.transform.FuseTIR()(after)
    assert relax.analysis.check_well_formed(fused_tir)


def test_never_fuse_leaves_module_unchanged():
    before = _before()
    after = FuseByCostModel(ConstantCostModel(fuse=False), compare_fuseops=False)(before)
    tvm.ir.assert_structural_equal(after, before)


def test_rewrite_orders_groups_topologically():
    """Group {exp, add} with relu(exp) bound between them: relu must follow the group."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="exp")
            b = bb.emit_te(topi.nn.relu, a, primfunc_name_hint="relu")
            c = bb.emit_te(topi.add, a, x, primfunc_name_hint="add")
            out = bb.emit_output(relax.Tuple([b, c]))
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(bb.get())
    func = mod["main"]
    block = func.body.blocks[0]
    used = vars_used_after(func, 0)
    graph = build_fusion_graph(mod, block, used)
    rb = relax.BlockBuilder(mod)
    new_block = rewrite_block(rb, graph, block, [frozenset({0, 2}), frozenset({1})], used)
    values = [b.value for b in new_block.bindings]
    # group call (tuple of exp and add), two projections, relu, output tuple
    assert isinstance(values[0], relax.Call) and isinstance(values[0].op, tvm.ir.GlobalVar)
    relu_pos = next(i for i, v in enumerate(values)
                    if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op))
    assert relu_pos > 0
    assert isinstance(values[-1], relax.Tuple)


def _exp_add_relu() -> tvm.IRModule:
    """exp(x) + x, then ReLU: one group when the templates take it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="exp")
            b = bb.emit_te(topi.add, a, x, primfunc_name_hint="add")
            c = bb.emit_te(topi.nn.relu, b, primfunc_name_hint="relu")
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    return bb.get()


def test_fallback_feedback_splits_groups_templates_cannot_schedule(monkeypatch):
    """A fused group that only the fallback rule can schedule is split and searched again."""
    import numpy as np

    import fusion_tvm
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend
    from fusion_tvm.targets.llvm_cpu.fallback import Fallback

    mod = _exp_add_relu()
    fused = fusion_tvm.compile(mod, hw="ci-x86-avx2")
    assert fused.num_kernels == 1
    monkeypatch.setattr(LLVMCPUBackend, "schedule_rules", lambda self, hw: (Fallback(),))
    split = fusion_tvm.compile(mod, hw="ci-x86-avx2")
    assert split.num_kernels > 1
    assert not any(set(g.node_ids) >= {0, 1, 2} for g in split.plan.groups)
    data = np.random.default_rng(0).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(split.run([data])[0], fused.run([data])[0], rtol=1e-5)


def test_plan_command_shows_the_partition_that_is_built(monkeypatch):
    """``fusion-tvm plan`` / ``explain`` / the HTML report (``cli.search_plan``) run the
    scheduling feedback too: where it splits a group, the plan's kernel count is the built
    one (the plan stopped at the search used to report 1 kernel for a build of 3)."""
    import fusion_tvm
    from fusion_tvm.cli import Progress, search_plan
    from fusion_tvm.frontend import load_model
    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend
    from fusion_tvm.targets.llvm_cpu.fallback import Fallback

    mod = _exp_add_relu()
    monkeypatch.setattr(LLVMCPUBackend, "schedule_rules", lambda self, hw: (Fallback(),))
    built = fusion_tvm.compile(mod, hw="ci-x86-avx2")
    plan = search_plan(load_model(mod), "llvm", "ci-x86-avx2", {}, Progress(quiet=True))
    assert built.num_kernels > 1
    assert plan.num_kernels == built.plan.num_kernels == built.num_kernels
    assert [g.node_ids for g in plan.groups] == [g.node_ids for g in built.plan.groups]
