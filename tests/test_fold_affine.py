"""FoldAffineIntoWeights (kind ``weight_folding``): per-channel scale / shift chains after a
constant-weight matmul or conv folded into its weights and one bias add.

Each case: the ops the fold removes from the prepared Relax graph, outputs equal to the
build without the kind and to onnxruntime, and the chains that must stay (a scale varying
along rows, an intermediate with another use, a weight computed at run time).
"""

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

import fusion_tvm
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.legality import FusionKinds
from fusion_tvm.passes.fold_affine import FoldAffineIntoWeights
from fusion_tvm.search import SearchConfig

HW = "ci-x86-avx2"


def _linear_bn():
    """Linear -> BatchNorm1d -> ReLU, then a LayerScale-style multiply and a divide."""
    g = GraphBuilder("linear_bn")
    x = g.add_input("x", [8, 16])
    y = g.op("MatMul", [x, g.normal((16, 12), 0.3, "w")])
    y = g.op("Add", [y, g.normal((12,), 0.1, "b")])
    y = g.op("Relu", [g.batchnorm(y, 12)])
    y = g.op("MatMul", [y, g.normal((12, 10), 0.3, "w2")])
    y = g.op("Div", [g.op("Mul", [y, g.uniform((10,), 0.5, 1.5, "gamma")]), g.const(4.0)])
    g.add_output(g.op("Sigmoid", [y]))
    return g.build()


def _conv_scale():
    """Conv + bias, then (c - y) * s per channel (ConvNeXt's LayerScale after a negation)."""
    g = GraphBuilder("conv_scale")
    x = g.add_input("x", [1, 4, 9, 9])
    y = g.conv(x, 4, 6, 3, bias=True)
    y = g.op("Sub", [g.normal((6, 1, 1), 0.1, "c"), y])
    y = g.op("Mul", [y, g.uniform((1, 6, 1, 1), 0.5, 1.5, "s")])
    g.add_output(g.op("Relu", [y]))
    return g.build()


def _kept():
    """Chains that must stay: a per-row scale, and a product that is also an output."""
    g = GraphBuilder("kept")
    x = g.add_input("x", [8, 16])
    y = g.op("MatMul", [x, g.normal((16, 12), 0.3, "w")])
    g.add_output(g.op("Mul", [y, g.uniform((8, 1), 0.5, 1.5, "rows")]))  # varies by row
    y2 = g.op("MatMul", [x, g.normal((16, 12), 0.3, "w2")])
    g.add_output(y2)  # the unscaled product is needed too
    g.add_output(g.op("Mul", [y2, g.const(2.0)]))
    return g.build()


def _prepared(model, fold: bool) -> tvm.IRModule:
    from fusion_tvm.pipeline import make_pipeline

    kinds = FusionKinds(weight_folding=fold)
    parts = make_pipeline(hw=HW, config=SearchConfig(kinds=kinds))
    with parts.target:
        return parts.prepare(fusion_tvm.frontend.load_model(model).mod)


def _ops(mod: tvm.IRModule, names) -> int:
    count = 0

    def visit(e):
        nonlocal count
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in names:
            count += 1

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return count


def _funcs(mod: tvm.IRModule, fragment: str) -> int:
    return sum(1 for gv, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and fragment in gv.name_hint)


def _assert_equal_to_references(model, seed: int) -> None:
    """Our build equals onnxruntime and the build without ``weight_folding``."""
    feeds = {"x": np.random.default_rng(seed).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype("f4")}
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    ours = fusion_tvm.compile(model, hw=HW).run(feeds)[0]
    off = fusion_tvm.compile(model, hw=HW, search=SearchConfig(
        kinds=FusionKinds(weight_folding=False))).run(feeds)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, off, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build, removed", [(_linear_bn, 6), (_conv_scale, 2)],
                         ids=["linear_bn", "conv_scale"])
def test_affine_chain_folded_into_weights(build, removed):
    model = build()
    folded, plain = _prepared(model, True), _prepared(model, False)
    affine = ("multiply", "divide", "subtract", "add")
    count = sum(_funcs(plain, op) for op in affine) - sum(_funcs(folded, op) for op in affine)
    assert count == removed, (folded.script(), plain.script())
    assert relax.analysis.check_well_formed(folded)
    _assert_equal_to_references(model, seed=1)


def test_chains_that_are_not_per_channel_or_shared_stay():
    model = _kept()
    mod = fusion_tvm.frontend.load_model(model).mod
    mod = relax.transform.DecomposeOpsForInference()(mod)
    tvm.ir.assert_structural_equal(FoldAffineIntoWeights()(mod),
                                   relax.transform.DeadCodeElimination()(mod))


def test_run_time_weight_not_folded():
    """``x @ w`` with ``w`` an input: nothing constant to fold into."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 6), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            y = bb.emit(relax.op.multiply(y, relax.const(np.full((6,), 2.0, "float32"))))
            out = bb.emit_output(relax.op.add(y, relax.const(1.0, "float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FoldAffineIntoWeights()(mod), mod)


def test_integer_product_not_folded():
    """An int32 matmul (a quantised layer) keeps its exact weights and its scale."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "int32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(np.ones((8, 6), "int32"))))
            y = bb.emit(relax.op.multiply(y, relax.const(np.full((6,), 3, "int32"))))
            out = bb.emit_output(relax.op.add(y, relax.const(1, "int32")))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FoldAffineIntoWeights()(mod), mod)


def _concat_bn():
    """Two convs concatenated, BatchNorm, ReLU, a 3 x 3 depthwise conv (a DenseNet / MixNet
    block): the BatchNorm has no weight before it to fold into."""
    g = GraphBuilder("concat_bn")
    x = g.add_input("x", [1, 8, 12, 12])
    y = g.op("Concat", [g.conv(x, 8, 16, 1), g.conv(x, 8, 16, 3)], axis=1)
    y = g.op("Relu", [g.batchnorm(y, 32)])
    g.add_output(g.conv(y, 32, 32, 3, group=32))
    return g.build()


def test_affine_chain_without_weight_collapses_to_multiply_add():
    """``(z - mean) / std * gamma + beta`` on a concat (4 ops, one a division) becomes
    ``z * a + s``: no divide or subtract left, outputs equal to onnxruntime and to the build
    without the kind."""
    model = _concat_bn()
    folded, plain = _prepared(model, True), _prepared(model, False)
    assert _funcs(plain, "divide") and _funcs(plain, "subtract")
    assert not _funcs(folded, "divide") and not _funcs(folded, "subtract")
    assert _funcs(folded, "multiply") == 1 and _funcs(folded, "add") >= 1
    assert relax.analysis.check_well_formed(folded)
    _assert_equal_to_references(model, seed=2)
