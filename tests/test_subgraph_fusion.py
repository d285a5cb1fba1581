"""Subgraph-level fusion kinds, one small model each: the kernel count the kind gives, the
count without it, and numerical equality with the unfused build.

Also TVM's regression cases (#20342: exp chain + broadcast add; #20401: MaxPool + Add): the
plan must not fuse what makes the kernel slower, and the result must equal the unfused one.
"""

import numpy as np
import pytest
from onnx import TensorProto

import fusion_tvm
from benchmarks.ablation import CASES, inputs
from benchmarks.zoo import example_inputs
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.legality import FusionKinds
from fusion_tvm.search import SearchConfig
from fusion_tvm.targets.schedule import applied_rules

HW = "ci-x86-avx2"


def _layernorm_rows():
    """A layer norm as torch<=1.x exports it: two means and the arithmetic around them."""
    g = GraphBuilder("layernorm_rows")
    x = g.add_input("x", [16, 32])
    g.add_output(g.layernorm(x, 32, decomposed=True))
    return g.build()


def _two_outputs():
    """2 x + 1 is an output and feeds a row sum: one kernel publishing both."""
    g = GraphBuilder("two_outputs")
    x = g.add_input("x", [16, 32])
    e = g.op("Add", [g.op("Mul", [x, g.const(2.0)]), g.const(1.0)])
    g.add_output(e)
    g.add_output(g.op("ReduceSum", [e, g.ints([-1])], keepdims=1))
    return g.build()


def _siblings(bias_first: bool):
    """Q/K/V-like projections of one input, bias added in the exporter's order."""
    g = GraphBuilder("siblings")
    x = g.add_input("x", [32, 64])
    bias = g.normal((64,), 0.1, "shared_bias")  # one constant for all three, as HF exports
    for k in range(3):
        y = g.op("MatMul", [x, g.normal((64, 64), 0.1, f"w{k}")])
        g.add_output(g.op("Add", [bias, y] if bias_first else [y, bias]))
    return g.build()


def _mlp(rows=16, sizes=(64, 128, 32)):
    """x W1 + b1 -> ReLU -> W2 + b2: a chain of two weight matmuls."""
    g = GraphBuilder("mlp_chain")
    x = g.add_input("x", [rows, sizes[0]])
    for k, (din, dout) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        x = g.op("Add", [g.op("MatMul", [x, g.normal((din, dout), 0.1, f"w{k}")]),
                         g.normal((dout,), 0.1, f"b{k}")])
        if k < len(sizes) - 2:
            x = g.relu(x)
    g.add_output(x)
    return g.build()


def _prologue():
    g = GraphBuilder("prologue")
    x = g.add_input("x", [64, 32])
    t = g.op("Transpose", [g.op("Mul", [x, g.const(0.5)])], perm=[1, 0])
    g.add_output(g.op("MatMul", [t, g.normal((64, 48), 0.1, "w")]))
    return g.build()


def _conv_bn():
    g = GraphBuilder("conv_bn")
    x = g.add_input("x", [1, 8, 16, 16])
    g.add_output(g.relu(g.batchnorm(g.conv(x, 8, 16, 3, bias=False), 16, gamma=0.8)))
    return g.build()


#: kind -> (model, kernels with the kind, kernels without it)
KINDS = {
    "reduction_chains": (_layernorm_rows, 1, 3),
    "multi_output": (_two_outputs, 1, 2),
    "siblings": (lambda: _siblings(bias_first=True), 1, 3),
    "attention": (lambda: CASES["attention"](True), 1, 3),
    "prologue": (_prologue, 1, 2),
    "row_stages": (lambda: _norm_projection(64, decomposed=False, residual=False), 1, 2),
    "mlp_chains": (_mlp, 1, 2),
}


def _build(model, **kw):
    return fusion_tvm.compile(model, hw=HW, **kw)


def _assert_same(a, b, feeds):
    for x, y in zip(a.run(feeds), b.run(feeds), strict=True):
        np.testing.assert_allclose(x.astype("float32"), y.astype("float32"),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kind_gives_its_kernel_count_and_equal_results(kind):
    make, with_kind, without_kind = KINDS[kind]
    model = make()
    feeds = inputs(model, seed=1)
    unfused = _build(model, fusion="none")
    ours = _build(model)
    off = _build(model, search=SearchConfig(kinds=FusionKinds(**{kind: False})))
    assert ours.num_kernels == with_kind
    assert off.num_kernels == without_kind
    _assert_same(ours, unfused, feeds)
    _assert_same(off, unfused, feeds)


def test_siblings_either_bias_order():
    for bias_first in (True, False):
        model = _siblings(bias_first)
        ours = _build(model)
        assert ours.num_kernels == 1, f"bias_first={bias_first}"
        _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=2))


def test_weight_folding_removes_batchnorm_ops():
    model = _conv_bn()
    feeds = inputs(model, seed=1)
    ours = _build(model)
    off = _build(model, search=SearchConfig(kinds=FusionKinds(weight_folding=False)))
    ops = lambda cm: sum(len(g.ops) for g in cm.plan.groups)  # noqa: E731
    assert ours.num_kernels <= off.num_kernels
    assert ops(ours) < ops(off)  # the BN arithmetic folded into the weights at compile time
    _assert_same(ours, _build(model, fusion="none"), feeds)
    _assert_same(off, ours, feeds)


@pytest.mark.parametrize("form,rule", [("online", "flash_attention"), ("rowwise", "attention")])
def test_attention_is_one_kernel_scheduled_by_the_attention_rule(form, rule):

    from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

    for name in ("attention", "attention_causal"):
        model = CASES[name](True)
        ours = _build(model, target=LLVMCPUBackend(softmax=form))
        rules = list(applied_rules(ours.fused_mod).values())
        assert rules == [rule], name
        _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=3))


def test_attention_needs_a_backend_template():
    """Without ``TemplateLimits.attention`` the chain is never one group."""
    from fusion_tvm.legality import TemplateLimits, attention_chain, check_templates

    graph = _graph_of(CASES["attention"](True))
    group = frozenset(g for g in graph.fusible_nodes)
    assert attention_chain(graph, group)
    assert check_templates(graph, group, TemplateLimits(attention=True))
    assert not check_templates(graph, group, TemplateLimits())


def test_tvm20342_exp_chain_not_recomputed_per_broadcast_element():
    model = CASES["tvm20342"](True)
    ours = _build(model)
    (group,) = [g for g in ours.plan.groups if any("add" in f for f in g.prim_funcs)]
    assert not any("exp" in f for f in group.prim_funcs), "exp chain fused into the broadcast add"
    _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=4))


def test_tvm20401_maxpool_add():
    model = CASES["tvm20401"](True)
    ours = _build(model)
    assert ours.num_kernels <= 2
    _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=5))


def test_fp16_feeds_are_built():
    model = CASES["tvm20342"](True)
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


# ------------------------------------------------------------------ reduction chains (#8, #11)
def _layernorm_residual(rows: int = 128, dim: int = 768):
    """BERT's post-attention block tail: residual add, then a layer norm exported with
    ReduceMean / Pow(x, 2) / Sqrt / Div."""
    g = GraphBuilder("layernorm_residual")
    x, r = g.add_input("x", [1, rows, dim]), g.add_input("r", [1, rows, dim])
    g.add_output(g.layernorm(g.op("Add", [x, r]), dim, decomposed=True))
    return g.build()


def _softmax_exp(rows: int = 64, dim: int = 128):
    """A softmax written out: exp feeds both the row sum and the division."""
    g = GraphBuilder("softmax_exp")
    x = g.add_input("x", [rows, dim])
    e = g.op("Exp", [g.op("Sub", [x, g.op("ReduceMax", [x], axes=[-1], keepdims=1)])])
    g.add_output(g.op("Div", [e, g.op("ReduceSum", [e, g.ints([-1])], keepdims=1)]))
    return g.build()


def _plan_graph(model):
    from fusion_tvm.pipeline import make_pipeline

    parts = make_pipeline(hw=HW)
    with parts.target:
        parts.fuse(parts.prepare(fusion_tvm.frontend.load_model(model).mod))
    plan = parts.fuse_pass.plan
    (block,) = plan.blocks
    return plan, block.graph


def test_layernorm_with_residual_is_one_reduction_kernel():
    """Measured (1x128x768, one thread): one kernel 0.135 ms, split in three 0.145 ms."""
    model = _layernorm_residual()
    ours = _build(model)
    off = _build(model, search=SearchConfig(kinds=FusionKinds(reduction_chains=False)))
    assert ours.num_kernels == 1
    assert [g.rule for g in ours.plan.groups] == ["reduction"]
    assert off.num_kernels > 1
    _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=6))


def test_roofline_prices_what_the_reduction_rule_runs():
    """A per-row value broadcast along the row (the std) is computed once per row, and the
    merged layer norm is predicted faster than its reductions and elementwise tail apart."""
    plan, graph = _plan_graph(_layernorm_residual())
    model = plan.cost_model_obj
    group = frozenset(graph.fusible_nodes)
    cost = model.estimate(graph, group)
    assert cost.detail["rule"] == "reduction"
    # x - mean feeds (x - mean)^2 (as x * x) and the division: at most 3 evaluations
    assert all(m <= 3.0 for m in cost.detail["recompute"].values()), cost.detail["recompute"]
    last = max(n for n in group if graph.nodes[n].is_reduction)
    tail = frozenset(n for n in group if n > last)
    head = group - tail
    assert tail and head
    apart = model.estimate(graph, head).time_s + model.estimate(graph, tail).time_s
    assert cost.time_s < apart


def test_roofline_runs_a_producer_of_a_reduction_once():
    """exp feeds the row sum and the division: the reduction rule keeps it as a per-row
    block (not inlined), so it is not charged once per consumer."""
    plan, graph = _plan_graph(_softmax_exp())
    group = frozenset(graph.fusible_nodes)
    cost = plan.cost_model_obj.estimate(graph, group)
    assert cost.detail["rule"] == "reduction"
    assert cost.detail["recompute"] == {}
    assert cost.onchip_bytes > 0  # the exp row stays in cache


# ------------------------------------------------------------ a norm feeding a matmul (#8)
def _norm_projection(rows, decomposed: bool, residual: bool, publish_norm: bool = False):
    """(residual add ->) layer norm -> x W + b: a pre-norm transformer's projection input.
    ``publish_norm`` also returns the norm (BERT's post-norm: it is the next residual)."""
    g = GraphBuilder("norm_projection")
    x = g.add_input("x", [1, rows, 64])
    h = g.op("Add", [x, g.add_input("r", [1, rows, 64])]) if residual else x
    if residual:
        g.add_output(h)
    n = g.layernorm(h, 64, decomposed=decomposed)
    if publish_norm:
        g.add_output(n)
    g.add_output(g.op("Add", [g.op("MatMul", [n, g.normal((64, 96), 0.1, "w")]),
                              g.normal((96,), 0.1, "b")]))
    return g.build()


@pytest.mark.parametrize("decomposed,residual,publish,rows", [
    (False, True, False, 128),  # GPT-2: residual add + LayerNormalization + QKV
    (True, False, True, 128),  # BERT: decomposed LN published for the next residual
    (True, True, False, 197),  # ViT rows: the GEMM pads A to whole row tiles
    (False, False, False, "S"),  # symbolic rows
])
def test_norm_feeding_a_matmul_is_one_staged_matmul_kernel(decomposed, residual, publish, rows):
    """The norm runs as a row pass inside the matmul's kernel (one kernel, the matmul rule,
    no fallback); equal to the unfused build. Without reduction chains: the norm is apart."""
    from tvm import tirx

    model = _norm_projection(rows, decomposed, residual, publish)
    hints = {"S": (1, 256)} if rows == "S" else None
    ours = _build(model, shape_hints=hints)
    off = _build(model, shape_hints=hints,
                 search=SearchConfig(kinds=FusionKinds(reduction_chains=False)))
    assert ours.num_kernels == 1
    assert [g.rule for g in ours.plan.groups] == ["matmul"]
    (func,) = [f for f in ours.fused_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert str(func.attrs["fusion_tvm.rule"]) == "matmul"
    assert off.num_kernels >= 2
    unfused = _build(model, fusion="none", shape_hints=hints)
    for seq in ((5, 77) if rows == "S" else (None,)):
        feeds = example_inputs(model, seed=7, **({"S": seq} if seq else {}))
        _assert_same(ours, unfused, feeds)


def test_roofline_prices_a_staged_norm_as_its_row_pass_plus_the_gemm():
    """Merged = the norm's row kernel + the GEMM kernel - one launch (the normalised rows go
    through cache as between two kernels): not the norm's arithmetic inlined into the
    GEMM's A loads once per column panel."""
    plan, graph = _plan_graph(_norm_projection(128, decomposed=True, residual=False))
    model = plan.cost_model_obj
    group = frozenset(graph.fusible_nodes)
    matmul = next(n for n in group if graph.nodes[n].is_contraction)
    gemm = frozenset({matmul} | {n for n in group if n > matmul})
    norm = group - gemm
    merged = model.estimate(graph, group)
    apart = model.estimate(graph, norm).time_s + model.estimate(graph, gemm).time_s
    assert merged.detail["rule"] == "matmul"
    assert merged.time_s == pytest.approx(apart - plan.cost_model_obj.hw.launch_overhead_s)


def test_mlp_chain_is_one_kernel_of_stages_with_packed_weights():
    """Three weight matmuls (ReLU between) as one ``staged_chain`` kernel: every weight
    packed at compile time (no packing loop left in the kernel), equal to the unfused build
    and to the build without the kind; a matmul of two run-time tensors never chains."""
    from tvm import tirx

    model = _mlp(rows=24, sizes=(48, 96, 64, 16))
    ours = _build(model)
    (func,) = [f for f in ours.fused_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert str(func.attrs["fusion_tvm.rule"]) == "staged_chain"
    assert "fusion_tvm.prepack" not in func.script()
    assert sum("reindex" in p.name for p in func.params) == 3  # the three packed panels
    feeds = inputs(model, seed=5)
    _assert_same(ours, _build(model, fusion="none"), feeds)
    off = _build(model, search=SearchConfig(kinds=FusionKinds(mlp_chains=False)))
    assert off.num_kernels == 3
    _assert_same(ours, off, feeds)


@pytest.mark.parametrize("decomposed", [False, True])
def test_chain_through_a_layer_norm_is_staged_not_fallback(decomposed):
    """Projection, residual, layer norm, FFN with a tanh GELU (GPT-2's block tail): the
    norm's variance sum multiplies two run-time values and must not be taken for a matmul
    of the chain (it was: the rule declined and the fallback ran the kernel 100x slower)."""
    from tvm import tirx

    g = GraphBuilder("post_attention")
    x, r = g.add_input("x", [1, 8, 32]), g.add_input("r", [1, 8, 32])
    t = g.op("Add", [g.op("MatMul", [x, g.normal((32, 32), 0.1, "wo")]), r])
    t = g.layernorm(t, 32, decomposed=decomposed)
    h = g.gelu_tanh(g.op("MatMul", [t, g.normal((32, 64), 0.1, "w1")]))
    g.add_output(g.op("Add", [g.op("MatMul", [h, g.normal((64, 32), 0.1, "w2")]), t]))
    model = g.build()
    ours = _build(model)
    rules = [str(f.attrs["fusion_tvm.rule"]) for f in ours.fused_mod.functions.values()
             if isinstance(f, tirx.PrimFunc)]
    assert rules == ["staged_chain"] and ours.num_kernels == 1, rules
    _assert_same(ours, _build(model, fusion="none"), inputs(model, seed=6))


def test_roofline_prices_a_chain_as_its_stages_in_one_launch():
    """The chain's time is its stages' kernels with one launch: the stages' bodies, one
    launch, the stages' fork/joins counted in one kernel."""
    from fusion_tvm.chain_stages import chain_stages

    plan, graph = _plan_graph(_mlp(rows=64, sizes=(256, 512, 256)))
    model = plan.cost_model_obj
    group = frozenset(graph.fusible_nodes)
    stages = chain_stages(graph, group)
    assert stages is not None and len(stages) == 2
    assert all(sum(graph.nodes[n].is_contraction for n in st) == 1 for st in stages)
    parts = [model.estimate(graph, st) for st in stages]
    hw = model.hw
    regions = sum(p.detail["parallel_regions"] for p in parts)
    expect = sum(p.time_s - p.detail["launch_s"] for p in parts) + hw.launch_overhead_s + \
        hw.parallel_cost(regions)
    assert model.estimate(graph, group).time_s == pytest.approx(expect)
    assert model.estimate(graph, group).time_s < sum(p.time_s for p in parts)


def _projection_then_rows(rows, softmax: bool):
    """x W + b, then a layer norm of the result (post-norm), or Q K^T / 8 then a softmax
    (ViT's scores: 197 query rows do not fit the attention template's row blocks)."""
    g = GraphBuilder("projection_rows")
    if softmax:
        q, k = g.add_input("q", [1, 2, rows, 32]), g.add_input("k", [1, 2, rows, 32])
        s = g.op("Div", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                         g.const(8.0)])
        g.add_output(g.op("Softmax", [s], axis=-1))
    else:
        x = g.add_input("x", [1, rows, 64])
        y = g.op("Add", [g.op("MatMul", [x, g.normal((64, 96), 0.1, "w")]),
                         g.normal((96,), 0.1, "b")])
        g.add_output(g.layernorm(y, 96))
    return g.build()


@pytest.mark.parametrize("softmax,rows", [(True, 197), (False, 128), (False, "S")])
def test_reduction_after_a_matmul_is_one_staged_matmul_kernel(softmax, rows):
    """A softmax / norm of a matmul's rows runs as a row pass after the GEMM in its kernel
    (the matmul rule, not the attention rule one row at a time, not the reduction rule
    running a GEMM row by row); equal to the unfused build."""
    from tvm import tirx

    model = _projection_then_rows(rows, softmax)
    hints = {"S": (1, 256)} if rows == "S" else None
    ours = _build(model, shape_hints=hints)
    assert ours.num_kernels == 1
    rules = [str(f.attrs["fusion_tvm.rule"]) for f in ours.fused_mod.functions.values()
             if isinstance(f, tirx.PrimFunc)]
    assert rules == ["matmul"]
    off = _build(model, shape_hints=hints,
                 search=SearchConfig(kinds=FusionKinds(reduction_chains=False)))
    assert off.num_kernels >= 2
    unfused = _build(model, fusion="none", shape_hints=hints)
    for seq in ((3, 77) if rows == "S" else (None,)):
        _assert_same(ours, unfused, example_inputs(model, seed=8, **({"S": seq} if seq else {})))


def test_reduction_rule_declines_a_gemm_with_a_row_chain():
    """Given a matmul followed by a softmax in one function, the reduction rule declines
    (it would compute the GEMM one row at a time, re-reading B for every row: ViT's
    FC2 + layer norm took 2.6 ms that way, 10x the two kernels)."""
    import tvm
    from tvm import tirx

    from fusion_tvm.cost_models import get_hardware
    from fusion_tvm.targets.llvm_cpu.reduction import Reduction

    model = _projection_then_rows(16, softmax=True)
    fused = _build(model, schedule=False)
    (func,) = [f for f in fused.fused_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    hw = get_hardware(HW)
    assert Reduction().apply(func, tvm.target.Target(dict(hw.target)), hw) is None


def test_gpt2_block_kernels_all_on_templates():
    """GPT-2-2L at full size (seq 128, hidden 768): no kernel is left to the fallback rule
    (a staged chain once declined there and its fallback kernel took 1.08 s)."""
    from tvm import tirx

    from benchmarks.zoo import get_model

    cm = fusion_tvm.compile(get_model("gpt2_2l"), hw=HW)
    rules = {str(f.attrs["fusion_tvm.rule"]) for f in cm.fused_mod.functions.values()
             if isinstance(f, tirx.PrimFunc) and f.attrs and "fusion_tvm.rule" in f.attrs}
    assert "fallback" not in rules and {"flash_attention", "staged_chain"} <= rules, rules


def _window_partition():
    """Swin's block entry: a layer norm, then the windows cut out of its rows (reshape,
    transpose, reshape), then the projection of each window."""
    g = GraphBuilder("window_partition")
    x = g.add_input("x", [1, 8, 8, 16])
    y = g.layernorm(x, 16)
    y = g.op("Reshape", [y, g.ints([1, 2, 4, 2, 4, 16])])
    y = g.op("Transpose", [y], perm=[0, 1, 3, 2, 4, 5])
    y = g.op("Reshape", [y, g.ints([4, 16, 16])])
    g.add_output(g.op("MatMul", [y, g.normal((16, 16), 0.2, "w")]))
    return g.build()


def _graph_of(model):
    from fusion_tvm.pipeline import make_pipeline

    parts = make_pipeline(hw=HW)
    with parts.target:
        parts.fuse(parts.prepare(fusion_tvm.frontend.load_model(model).mod))
    (block,) = parts.fuse_pass.plan.blocks
    return block.graph


def test_layout_ops_that_move_a_reductions_rows_are_not_in_its_row_loop():
    """Window partition after a layer norm: no template runs it in the norm's row loop
    (the groups fell to the fallback, 50-100x slower, on Swin-T); the norm with a
    row-keeping epilogue stays legal, and the built model equals the unfused one."""
    from fusion_tvm.legality import TemplateLimits, check_templates

    model = _window_partition()
    graph = _graph_of(model)
    names = {graph.nodes[i].func_name: i for i in graph.fusible_nodes}
    norm = names["layer_norm"]
    moved = frozenset(i for n, i in names.items() if not n.startswith("matmul"))
    limits = TemplateLimits(row_stage=True, attention=True, staged_chains=True)
    decision = check_templates(graph, moved, limits)
    assert not decision and "moves the rows of" in decision.reason
    assert check_templates(graph, frozenset([norm]), limits)
    ours = _build(model)
    _assert_same(ours, _build(model, fusion="none"), example_inputs(model, seed=0))
    assert "fallback" not in {g.scheduled_rule for g in ours.plan.groups}


def test_attention_scores_reshaped_for_a_mask_are_not_one_attention_group():
    """Swin's shifted-window attention adds its mask to the scores viewed per window
    (reshape, add, reshape back) before the softmax: the attention templates decline the
    chain, so legality refuses it as one group."""
    from fusion_tvm.legality import TemplateLimits, attention_chain, check_templates

    g = GraphBuilder("masked_windows")
    q = g.add_input("q", [4, 2, 16, 8])
    k = g.add_input("k", [4, 2, 8, 16])
    v = g.add_input("v", [4, 2, 16, 8])
    s = g.op("MatMul", [q, k])
    s = g.op("Reshape", [s, g.ints([1, 4, 2, 16, 16])])
    s = g.op("Add", [s, g.normal((1, 4, 1, 16, 16), 1.0, "mask")])
    s = g.op("Reshape", [s, g.ints([4, 2, 16, 16])])
    g.add_output(g.op("MatMul", [g.op("Softmax", [s], axis=-1), v]))
    model = g.build()
    graph = _graph_of(model)
    group = frozenset(graph.fusible_nodes)
    assert attention_chain(graph, group)
    decision = check_templates(graph, group, TemplateLimits(attention=True, row_stage=True))
    assert not decision and "moves the rows of" in decision.reason
    ours = _build(model)
    _assert_same(ours, _build(model, fusion="none"), example_inputs(model, seed=0))
    assert "fallback" not in {g.scheduled_rule for g in ours.plan.groups}


def _cross_covariance_qkv():
    """EdgeNeXt's cross-covariance attention input: one projection to q, k, v, viewed as
    ``[3, heads, dims, tokens]`` (the tokens last), and q, k normalised over the tokens."""
    g = GraphBuilder("xca_qkv")
    x = g.add_input("x", [1, 64, 16])
    y = g.op("Add", [g.op("MatMul", [x, g.normal((16, 48), 0.2, "w")]),
                     g.normal((48,), 0.1, "b")])
    y = g.op("Transpose", [g.op("Reshape", [y, g.ints([1, 64, 3, 4, 4])])], perm=[2, 0, 3, 4, 1])
    q, k, v = (g.op("Squeeze", [g.op("Slice", [y, g.ints([i]), g.ints([i + 1]), g.ints([0])]),
                                g.ints([0])]) for i in range(3))
    for t in (q, k):
        norm = g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [t, t]), g.ints([-1])],
                                  keepdims=1)])
        g.add_output(g.op("Div", [t, g.op("Max", [norm, g.const(np.float32(1e-12))])]))
    g.add_output(v)
    return g.build()


def test_a_norm_across_a_gemms_rows_is_not_its_row_stage():
    """A sum over the tokens of a projection viewed tokens-last reduces across the GEMM's
    rows, not along them: no row pass after the GEMM computes it (EdgeNeXt's group of
    the projection, q, k, v and q's norm fell to a naive kernel, 1.8 ms against 0.07)."""
    from fusion_tvm.legality import TemplateLimits, check_templates

    model = _cross_covariance_qkv()
    graph = _graph_of(model)
    nodes = {graph.nodes[i].func_name: i for i in graph.fusible_nodes}
    first_sum = min(i for n, i in nodes.items() if n.startswith("sum"))
    group = frozenset(i for i in graph.fusible_nodes if i <= first_sum)
    limits = TemplateLimits(row_stage=True, attention=True, staged_chains=True)
    decision = check_templates(graph, group, limits)
    assert not decision and "not along the rows of" in decision.reason, decision.reason
    ours = _build(model)
    _assert_same(ours, _build(model, fusion="none"), example_inputs(model, seed=0))
    assert not {g.scheduled_rule for g in ours.plan.groups} & {"fallback"}


def _gemm_then(m: int, epilogue: bool):
    from tvm import te, topi

    a = te.placeholder((m, 16), "float32", name="A")
    b = te.placeholder((16, 48), "float32", name="B")
    c = topi.nn.matmul(a, b)
    out = topi.add(c, 1.0) if epilogue else c
    return te.create_prim_func([a, b, out])


def test_reduction_rule_declines_a_fused_gemm_but_takes_a_gemv():
    """A GEMM fused with what the matmul rule refused runs untiled, row by row, under
    the reduction rule: it declines (the catch-all takes it and the phase runner splits
    the group). A matrix-vector product (a 1 x 1 conv on a 1 x 1 image, one output row)
    stays its own, as does a GEMM alone."""
    import tvm

    from fusion_tvm.cost_models import get_hardware
    from fusion_tvm.targets.llvm_cpu.reduction import Reduction

    hw = get_hardware(HW)
    target = tvm.target.Target(dict(hw.target))
    assert Reduction().apply(_gemm_then(64, True), target, hw) is None
    assert Reduction().apply(_gemm_then(1, True), target, hw) is not None
    assert Reduction().apply(_gemm_then(64, False), target, hw) is not None
