"""What the roofline model charges for work the compiler does once: repeated subexpressions
(CSE) and broadcast values hoisted out of the loops they do not vary along (LICM)."""

from __future__ import annotations

from tvm import te, tirx, topi

import fusion_tvm
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.cost_models.roofline import RooflineCostModel
from fusion_tvm.ops import OpClass
from fusion_tvm.tir_analysis import analyze_primfunc, count_ops

HW = "ci-x86-avx2"  # frozen spec


def test_a_repeated_subexpression_is_counted_once():
    v = tirx.Var("v", "float32")
    assert count_ops((v + 1.0) * (v + 1.0)) == {OpClass.ELEMENTWISE: 2}
    assert count_ops((v + 1.0) * (v + 2.0)) == {OpClass.ELEMENTWISE: 3}


def test_fast_exp_costs_its_polynomial_not_its_printed_tree():
    """Legalized fast_exp repeats its clamped argument in every term of the polynomial:
    88 ops as printed, 23 after CSE (what LLVM runs)."""
    x = te.placeholder((64,), name="x")
    (block,) = analyze_primfunc(te.create_prim_func([x, topi.fast_exp(x)])).blocks
    assert block.ops == {OpClass.ELEMENTWISE: 23}


def _squeeze_excitation():
    """x * sigmoid(conv1x1(mean(x))): the excitation is 1x1 spatial, broadcast over 28x28."""
    b = GraphBuilder("se")
    x = b.add_input("x", [1, 32, 28, 28])
    pooled = b.op("GlobalAveragePool", [x])
    scale = b.op("Sigmoid", [b.conv(pooled, 32, 32, 1, pad=0)])
    y = b.op("Mul", [x, scale])
    b.add_output(y)
    return b.build()


def _se_graph(target_backend: bool):
    from fusion_tvm.pipeline import make_pipeline

    parts = make_pipeline(hw=HW)
    with parts.target:
        parts.fuse(parts.prepare(fusion_tvm.frontend.load_model(_squeeze_excitation()).mod))
    (block,) = parts.fuse_pass.plan.blocks
    model = RooflineCostModel(parts.hw, parts.backend if target_backend else None)
    return block.graph, model


def test_a_broadcast_epilogue_of_a_cpu_conv_is_priced_once_per_channel():
    """FuseOps's squeeze-excitation kernel (the 1x1 conv, its bias and sigmoid, and the
    multiply broadcasting them over the pixels): the CPU conv rule's epilogue nest keeps
    its loops, so LLVM evaluates the sigmoid once per channel (measured 38 us on
    EfficientNet-B0's 56x56 block, where per-pixel recompute priced 800 us). A target
    whose kernels do not hoist (no backend: the generic model) pays per pixel."""
    graph, cpu = _se_graph(True)
    _, generic = _se_graph(False)
    names = {graph.nodes[i].func_name: i for i in graph.fusible_nodes}
    conv = next(i for n, i in names.items() if n.startswith("conv2d"))
    mul = next(i for n, i in names.items() if n.startswith("multiply"))
    group = frozenset(i for i in graph.fusible_nodes if conv <= i <= mul)
    assert len(group) >= 3, [graph.nodes[i].func_name for i in group]
    hoisted = cpu.estimate(graph, group)
    assert hoisted.detail["rule"] == "conv2d"
    assert hoisted.detail["recompute"] == {}
    per_pixel = generic.estimate(graph, group)
    assert max(per_pixel.detail["recompute"].values()) >= 28 * 28
    assert per_pixel.flops > 20 * hoisted.flops
