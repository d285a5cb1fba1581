"""A small ONNX graph builder: seeded initializers and the op idioms exporters emit.

Everything here is plain ``onnx.helper``; no PyTorch needed. Weight scales follow the usual
initializations (He for convolutions and ReLU MLPs, N(0, 0.02) for transformers, BatchNorm
statistics near identity) so activations of the generated models stay O(1).
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # accepted by every onnxruntime that knows opset 17

# Symbolic dimension names used by dynamic variants.
BATCH_DIM = "N"
SEQ_DIM = "S"


class GraphBuilder:
    """Accumulates nodes and initializers; ``build`` returns a checked ``onnx.ModelProto``.

    Parameters
    ----------
    name : str
        Graph name (also used as a prefix of no tensor names).
    seed : int
        Seed of the generator used for every initializer, so a model is reproducible.
    """

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.input_kinds: dict[str, str] = {}
        self.default_dims: dict[str, int] = {}
        self._counter: dict[str, int] = {}

    # ------------------------------------------------------------------ names and tensors
    def fresh(self, prefix: str) -> str:
        n = self._counter.get(prefix, 0)
        self._counter[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, value, name: str | None = None, dtype=np.float32) -> str:
        """Add an initializer holding ``value`` and return its name."""
        arr = np.asarray(value, dtype=dtype)
        name = name or self.fresh("const")
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, values, name: str | None = None) -> str:
        return self.const(np.asarray(values, dtype=np.int64), name, dtype=np.int64)

    def normal(self, shape, std: float, name: str, mean: float = 0.0) -> str:
        arr = self.rng.normal(mean, std, size=shape).astype(np.float32)
        return self.const(arr, name)

    def uniform(self, shape, low: float, high: float, name: str) -> str:
        return self.const(self.rng.uniform(low, high, size=shape).astype(np.float32), name)

    def add_input(self, name: str, shape, dtype=TensorProto.FLOAT, kind: str = "float") -> str:
        """Declare a graph input; ``kind`` tells ``example_inputs`` how to fill it."""
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        self.input_kinds[name] = kind
        return name

    def add_output(self, name: str, shape=None, dtype=TensorProto.FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, dtype, shape))

    def op(self, op_type: str, inputs, num_outputs: int = 1, name: str | None = None, **attrs):
        """Emit one node; returns its output name (or a list when ``num_outputs > 1``)."""
        base = name or self.fresh(op_type.lower())
        outs = [base] if num_outputs == 1 else [f"{base}_{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs[0] if num_outputs == 1 else outs

    # ------------------------------------------------------------------ CNN idioms
    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             group: int = 1, bias: bool = False, gain: float = 2.0, prefix: str = "conv") -> str:
        """Conv with He-normal weights (``gain`` 2 for ReLU-like activations)."""
        pad = k // 2 if pad is None else pad
        name = self.fresh(prefix)
        fan_in = cin // group * k * k
        w = self.normal((cout, cin // group, k, k), math.sqrt(gain / fan_in), f"{name}.weight")
        ins = [x, w]
        if bias:
            ins.append(self.normal((cout,), 0.01, f"{name}.bias"))
        return self.op("Conv", ins, name=name, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=group, dilations=[1, 1])

    def batchnorm(self, x: str, c: int, gamma: float = 1.0) -> str:
        """Inference BatchNormalization with statistics near identity."""
        name = self.fresh("bn")
        scale = self.const(gamma * self.rng.uniform(0.9, 1.1, c).astype(np.float32),
                           f"{name}.weight")
        shift = self.normal((c,), 0.02, f"{name}.bias")
        mean = self.normal((c,), 0.02, f"{name}.running_mean")
        var = self.uniform((c,), 0.9, 1.1, f"{name}.running_var")
        return self.op("BatchNormalization", [x, scale, shift, mean, var], name=name,
                       epsilon=1e-5, momentum=0.9)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def relu6(self, x: str) -> str:
        if not hasattr(self, "_relu6_bounds"):
            self._relu6_bounds = (self.const(0.0, "clip_min"), self.const(6.0, "clip_max"))
        return self.op("Clip", [x, *self._relu6_bounds])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = "relu", gamma: float = 1.0) -> str:
        y = self.batchnorm(self.conv(x, cin, cout, k, stride, group=group), cout, gamma)
        if act is None:
            return y
        return {"relu": self.relu, "relu6": self.relu6, "silu": self.silu}[act](y)

    def gemm(self, x: str, din: int, dout: int, gain: float = 1.0, prefix: str = "fc") -> str:
        """``Gemm(transB=1)`` as torch exports ``nn.Linear`` on 2-D inputs."""
        name = self.fresh(prefix)
        w = self.normal((dout, din), math.sqrt(gain / din), f"{name}.weight")
        b = self.normal((dout,), 0.01, f"{name}.bias")
        return self.op("Gemm", [x, w, b], name=name, transB=1)

    # ------------------------------------------------------------------ transformer idioms
    def linear(self, x: str, din: int, dout: int, std: float = 0.02, prefix: str = "linear"):
        """``MatMul`` + ``Add`` as torch exports ``nn.Linear`` on 3-D inputs."""
        name = self.fresh(prefix)
        w = self.normal((din, dout), std, f"{name}.weight")
        b = self.normal((dout,), 0.01, f"{name}.bias")
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layernorm(self, x: str, dim: int, decomposed: bool = False, eps: float = 1e-5) -> str:
        """LayerNormalization over the last axis, fused (opset 17) or as torch<=1.x exports it."""
        name = self.fresh("ln")
        gamma = self.const(1.0 + self.rng.normal(0, 0.02, dim).astype(np.float32),
                           f"{name}.weight")
        beta = self.normal((dim,), 0.02, f"{name}.bias")
        if not decomposed:
            return self.op("LayerNormalization", [x, gamma, beta], name=name, axis=-1,
                           epsilon=eps)
        mean = self.op("ReduceMean", [x], axes=[-1], keepdims=1)
        centered = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Pow", [centered, self.const(2.0)])], axes=[-1],
                      keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])
        normed = self.op("Div", [centered, std])
        return self.op("Add", [self.op("Mul", [normed, gamma]), beta])

    def gelu_erf(self, x: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt(2))), node for node as torch exports ``F.gelu``."""
        erf = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, self.const(1.0)])]),
                               self.const(0.5)])

    def gelu_tanh(self, x: str) -> str:
        """GPT-2's ``gelu_new``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        cube = self.op("Pow", [x, self.const(3.0)])
        inner = self.op("Add", [x, self.op("Mul", [cube, self.const(0.044715)])])
        t = self.op("Tanh", [self.op("Mul", [inner, self.const(math.sqrt(2.0 / math.pi))])])
        return self.op("Mul", [self.op("Mul", [x, self.const(0.5)]),
                               self.op("Add", [t, self.const(1.0)])])

    def attention(self, x: str, hidden: int, heads: int, bias: str | None) -> str:
        """Multi-head self-attention on ``x`` [N, S, hidden]; ``bias`` is added to the scores."""
        dh = hidden // heads
        split = self.ints([0, 0, heads, dh])

        def heads_of(t: str, perm) -> str:
            return self.op("Transpose", [self.op("Reshape", [t, split])], perm=perm)

        q = heads_of(self.linear(x, hidden, hidden, prefix="q"), [0, 2, 1, 3])
        k = heads_of(self.linear(x, hidden, hidden, prefix="k"), [0, 2, 3, 1])
        v = heads_of(self.linear(x, hidden, hidden, prefix="v"), [0, 2, 1, 3])
        scores = self.op("Div", [self.op("MatMul", [q, k]), self.const(math.sqrt(dh))])
        if bias is not None:
            scores = self.op("Add", [scores, bias])
        probs = self.op("Softmax", [scores], axis=-1)
        ctx = self.op("Transpose", [self.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = self.op("Reshape", [ctx, self.ints([0, 0, hidden])])
        return self.linear(ctx, hidden, hidden, prefix="attn_out")

    def dim_of(self, x: str, axis: int) -> str:
        """A 1-element int64 tensor holding ``x.shape[axis]`` (Shape + Gather, as exported)."""
        return self.op("Unsqueeze", [self.op("Gather", [self.op("Shape", [x]),
                                                        self.ints(axis)], axis=0),
                                     self.ints([0])])

    # ------------------------------------------------------------------ output
    def build(self, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  self.initializers)
        model = helper.make_model(graph, producer_name="fusion_tvm.benchmarks.zoo",
                                  opset_imports=[helper.make_opsetid("", OPSET)],
                                  doc_string=doc)
        model.ir_version = IR_VERSION
        # Outputs are declared without shapes; let ONNX shape inference fill them in.
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
        for out in model.graph.output:
            if out.name in known and known[out.name].type.tensor_type.HasField("shape"):
                out.CopyFrom(known[out.name])
        helper.set_model_props(model, {
            "zoo.input_kinds": json.dumps(self.input_kinds),
            "zoo.default_dims": json.dumps(self.default_dims),
        })
        onnx.checker.check_model(model)
        return model


def batch_dim(batch: int, dynamic: bool):
    return BATCH_DIM if dynamic else batch


def seq_dim(seq: int, dynamic: bool):
    return SEQ_DIM if dynamic else seq
