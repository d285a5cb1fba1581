"""Small hand-built ONNX models shared by the bad-input tests and ``benchmarks/bad_inputs.py``."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper


def float_model(nodes, inputs, outputs, inits=(), domains=(), name="bad"):
    """An fp32 ONNX model (opset 17, IR 8) from nodes and ``(name, shape)`` inputs/outputs;
    ``domains`` adds version-1 opsets of custom domains."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        list(inits),
    )
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def two_input_model():
    """y = relu(a @ w) + b with a: [N, 4], b: [N, 3] (the batch dim N shared)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.linspace(-1, 1, 12).tolist())
    return float_model(
        [helper.make_node("MatMul", ["a", "w"], ["m"], name="mm"),
         helper.make_node("Relu", ["m"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "b"], ["y"], name="add")],
        [("a", ["N", 4]), ("b", ["N", 3])], [("y", ["N", 3])], [w],
    )
