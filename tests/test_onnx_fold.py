"""Folding an ONNX graph's static shape computations before import (``onnx_fold``).

Exporters compute paddings and reshape targets from ``Shape`` nodes even for static
shapes (Hugging Face's MobileNetV2 / EfficientNet TF-style padding, Swin's window
partition, GPT-NeoX's rotary slices); TVM's importer rejected those models ("Dynamic pads
are not supported yet", "Reshape expects the input tensor to have known shape").
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fusion_tvm
from fusion_tvm.frontend.onnx_fold import fold_constants

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def same_padding_conv(batch="N"):
    """TF-style 'same' padding computed from the input's shape, then a 3 x 3 stride-2 conv."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=2),          # [9, 9]
        helper.make_node("Mod", ["s", "two"], ["r"]),              # [1, 1]
        helper.make_node("Sub", ["three", "r"], ["need"]),         # pad total = 2
        helper.make_node("Div", ["need", "two"], ["lo"]),
        helper.make_node("Sub", ["need", "lo"], ["hi"]),
        helper.make_node("Concat", ["zeros", "lo", "zeros", "hi"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("Conv", ["xp", "w"], ["c"], strides=[2, 2]),
        # a reshape whose target is read off the conv output's shape (Swin's windows)
        helper.make_node("Shape", ["c"], ["cs"]),
        helper.make_node("Gather", ["cs", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["c", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    rng = np.random.default_rng(0)
    inits = [_const("two", [2, 2]), _const("three", [3, 3]), _const("zeros", [0, 0]),
             _const("zero", 0), _const("zero1", [0]), _const("minus1", [-1]),
             numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype("float32"), "w")]
    return _model(nodes, [x], [y], inits)


def test_static_shape_arithmetic_folds_and_matches_onnxruntime():
    model = same_padding_conv(batch=2)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_constants(folded) >= 10
    assert [n.op_type for n in folded.graph.node] == ["Pad", "Conv", "Reshape", "Relu"]
    x = np.random.default_rng(1).standard_normal((2, 4, 9, 9)).astype("float32")
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    cm = fusion_tvm.compile(model)
    np.testing.assert_allclose(cm.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_symbolic_dims_are_not_folded():
    """Only values every input shape fixes fold: with a symbolic batch the reshape target
    keeps its run-time Shape; the paddings (spatial dims only) still fold."""
    model = same_padding_conv(batch="N")
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    fold_constants(folded)
    ops = [n.op_type for n in folded.graph.node]
    assert "Pad" in ops and ops.count("Shape") == 1 and "Mod" not in ops, ops
    cm = fusion_tvm.compile(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 9, 9)).astype("float32")
        np.testing.assert_allclose(cm.run({"x": x})[0], sess.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


def test_outputs_inputs_and_random_ops_stay():
    """A graph output, a value computed from an input's data, and a random op are never
    folded; a model without shape arithmetic is left as it was."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("RandomNormal", [], ["r"], shape=[2])]
    model = _model(nodes, [x], [s, y, r])
    before = model.SerializeToString()
    assert fold_constants(model) == 0
    assert model.SerializeToString() == before


def test_static_entries_of_a_symbolic_shape_fold():
    """``x.shape[-1] // 2`` with a dynamic batch and sequence (rotary embeddings): the
    gathered entry is static, so the slice bound folds; the symbolic entries stay."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "last"], ["d"], axis=0),
        helper.make_node("Div", ["d", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "zero1"], ["end"]),
        helper.make_node("Slice", ["x", "zero1", "end", "two1"], ["y"]),
    ]
    inits = [_const("last", -1), _const("two", 2), _const("zero1", [0]), _const("two1", [2])]
    model = _model(nodes, [x], [y], inits)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_constants(folded) == 4
    (slice_node,) = folded.graph.node
    ends = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}[
        slice_node.input[2]]
    assert ends.tolist() == [4]
    cm = fusion_tvm.compile(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for shape in ((1, 3, 8), (2, 5, 8)):
        xv = np.random.default_rng(0).standard_normal(shape).astype("float32")
        np.testing.assert_array_equal(cm.run({"x": xv})[0], sess.run(None, {"x": xv})[0])


def test_values_read_only_inside_a_subgraph_stay_defined():
    """A folded value read only by an If branch becomes an initializer the branch sees."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [6])
    then_g = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["b"])],
                               "then", [], [branch_out])
    else_g = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["b"])],
                               "else", [], [branch_out])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
             helper.make_node("Identity", ["n"], ["target"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    cond = numpy_helper.from_array(np.array(True), "cond")
    model = _model(nodes, [x], [y], [cond])
    assert fold_constants(model) == 3
    onnx.checker.check_model(model)
    xv = np.arange(6, dtype="float32").reshape(2, 3)
    (got,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": xv})
    np.testing.assert_array_equal(got, xv.reshape(6))


def test_expand_symbolic_data_to_a_constant_shape():
    """Expand of data with a symbolic dim to a constant shape (Bloom's ALiBi with dynamic
    axes): TVM's converter read every data dim as an integer."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _model([helper.make_node("Expand", ["x", "shape"], ["y"])], [x], [y],
                   [_const("shape", [1, 3, 4])])
    cm = fusion_tvm.compile(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for batch in (1, 2):
        xv = np.random.default_rng(batch).standard_normal((batch, 1, 4)).astype("float32")
        np.testing.assert_array_equal(cm.run({"x": xv})[0], sess.run(None, {"x": xv})[0])
