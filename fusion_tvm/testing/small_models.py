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
    return _model(graph, domains)


def _model(graph, domains=()):
    """``graph`` as an opset-17, IR-8 model; ``domains`` adds version-1 custom opsets."""
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


def embedding_model(rows: int = 10, dim: int = 4):
    """y = relu(table[ids]) with int64 ids [N, S] and a ``rows x dim`` table (ONNX Gather)."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [rows, dim],
                               np.linspace(-1, 1, rows * dim).tolist())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="lookup"),
         helper.make_node("Relu", ["e"], ["y"], name="relu")],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", dim])],
        [table],
    )
    return _model(graph)
