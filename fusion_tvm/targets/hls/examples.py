"""Small ONNX models used to exercise the HLS backend (tests, benchmarks/hls_report.py).

Built with ``onnx.helper`` at sizes a C simulation runs in well under a second.
"""

from __future__ import annotations

import numpy as np


def _const(rng, shape, scale=0.3, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def _model(nodes, name, inputs, outputs, inits):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mlp(batch: int = 2, d_in: int = 16, hidden: int = 32, d_out: int = 10, seed: int = 0):
    """MatMul + Add + Relu, then Gemm (with bias) + Sigmoid."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {
        "W1": _const(rng, (d_in, hidden)), "b1": _const(rng, (hidden,), 0.1),
        "W2": _const(rng, (d_out, hidden)), "b2": _const(rng, (d_out,), 0.1),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("Gemm", ["h3", "W2", "b2"], ["h4"], transB=1),
        helper.make_node("Sigmoid", ["h4"], ["y"]),
    ]
    return _model(nodes, "mlp", [("x", [batch, d_in])], [("y", [batch, d_out])], inits)


def small_cnn(channels: int = 4, size: int = 8, classes: int = 5, seed: int = 0):
    """Two Conv + BatchNormalization + Relu blocks, MaxPool, Flatten, Gemm."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    c1, c2 = channels, 2 * channels
    half = size // 2
    inits = {
        "k1": _const(rng, (c1, 3, 3, 3)), "cb1": _const(rng, (c1,), 0.1),
        "g1": _const(rng, (c1,), 0.1, 1.0), "be1": _const(rng, (c1,), 0.1),
        "m1": _const(rng, (c1,), 0.1), "v1": np.abs(_const(rng, (c1,), 0.1, 1.0)),
        "k2": _const(rng, (c2, c1, 3, 3)),
        "g2": _const(rng, (c2,), 0.1, 1.0), "be2": _const(rng, (c2,), 0.1),
        "m2": _const(rng, (c2,), 0.1), "v2": np.abs(_const(rng, (c2,), 0.1, 1.0)),
        "fw": _const(rng, (classes, c2 * half * half), 0.1), "fb": _const(rng, (classes,), 0.1),
        "shape": np.array([1, -1], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "k1", "cb1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "k2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"]),
        helper.make_node("Relu", ["n2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    model = _model(nodes, "cnn", [("x", [1, 3, size, size])], [("y", [1, classes])], inits)
    return model


def transformer_block(seq: int = 8, dim: int = 16, seed: int = 0):
    """Single-head attention (MatMul, Softmax) + residual + LayerNormalization + MLP."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {
        "wq": _const(rng, (dim, dim)), "wk": _const(rng, (dim, dim)),
        "wv": _const(rng, (dim, dim)), "wo": _const(rng, (dim, dim)),
        "scale": np.array(1.0 / np.sqrt(dim), dtype=np.float32),
        "ln_g": _const(rng, (dim,), 0.1, 1.0), "ln_b": _const(rng, (dim,), 0.1),
        "w1": _const(rng, (dim, 2 * dim)), "w2": _const(rng, (2 * dim, dim)),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v"], ["o"]),
        helper.make_node("MatMul", ["o", "wo"], ["o2"]),
        helper.make_node("Add", ["x", "o2"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "ln_g", "ln_b"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "w1"], ["f1"]),
        helper.make_node("Relu", ["f1"], ["f2"]),
        helper.make_node("MatMul", ["f2", "w2"], ["f3"]),
        helper.make_node("Add", ["ln", "f3"], ["y"]),
    ]
    return _model(nodes, "transformer", [("x", [seq, dim])], [("y", [seq, dim])], inits)


def reference(model, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs for ``feeds``."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
