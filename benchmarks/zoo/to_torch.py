"""Run a zoo ONNX graph as a ``torch.nn.Module`` (the PyTorch eager / torch.compile contenders).

Only the zoo's operator set is covered. Shape arithmetic (Shape/Gather/Slice/Concat on shapes,
constant subgraphs) is folded once with ``onnx.reference`` for the given input shapes, so the
module holds plain tensor ops with Python-int attributes and ``torch.compile`` sees a static graph.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul,
           "Div": operator.truediv, "Pow": operator.pow}


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fixed_shapes(model: onnx.ModelProto, shapes: dict) -> dict[str, tuple]:
    """Every tensor's static shape, by ONNX shape inference on the concrete input shapes."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for inp in m.graph.input:
        if inp.name in shapes:
            dims = inp.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[inp.name], strict=True):
                d.Clear()
                d.dim_value = int(v)
    m = shape_inference.infer_shapes(m, data_prop=True)
    out = {}
    for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(d.dim_value for d in dims)
    return out


def fold(model: onnx.ModelProto, shapes: dict) -> tuple[dict, list]:
    """Split the graph into folded constants (numpy) and the nodes that depend on inputs."""
    static = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    known = _fixed_shapes(model, shapes)
    program = []
    for node in model.graph.node:
        if node.op_type == "Shape" and node.input[0] in known:
            static[node.output[0]] = np.array(known[node.input[0]], np.int64)
        elif all(i == "" or i in static for i in node.input):
            feeds = {i: static[i] for i in node.input if i}
            for name, val in zip(node.output, ReferenceEvaluator(node).run(None, feeds),
                                 strict=True):
                static[name] = np.asarray(val)
        else:
            program.append(node)
    return static, program


def to_torch(model: onnx.ModelProto, shapes: dict):
    """A ``torch.nn.Module`` computing ``model`` for inputs of the given ``shapes``.

    ``forward`` takes the graph inputs in order and returns a tuple of the graph outputs.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812

    static, program = fold(model, shapes)

    class OnnxModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.consts = {}
            for k, v in static.items():
                if v.dtype.kind in "fiub" and v.size:
                    t = torch.from_numpy(np.array(v, copy=True))
                    self.register_buffer(f"c{len(self.consts)}", t, persistent=False)
                    self.consts[k] = f"c{len(self.consts)}"
            self.steps = [(_lower(n, static, torch, F), list(n.input), list(n.output))
                          for n in program]
            self.input_names = [i.name for i in model.graph.input if i.name not in static]
            self.output_names = [o.name for o in model.graph.output]

        def forward(self, *args):
            env = dict(zip(self.input_names, args, strict=True))
            for k, attr in self.consts.items():
                env[k] = getattr(self, attr)
            for fn, ins, outs in self.steps:
                env[outs[0]] = fn(*[env[i] if i else None for i in ins])
            return tuple(env[o] for o in self.output_names)

    return OnnxModule().eval()


def _lower(node, static: dict, torch, F):  # noqa: C901, N803 - one table of op lowerings
    """The torch callable for one ONNX node; constant operands become Python values."""
    a = _attrs(node)
    op = node.op_type

    def const(i):
        return static[node.input[i]]

    def ints(i):
        return [int(v) for v in np.asarray(const(i)).reshape(-1)]

    if op in _BINARY:
        fn = _BINARY[op]
        scalar = [node.input[i] in static and const(i).size == 1 and const(i).dtype.kind == "f"
                  for i in (0, 1)]
        # Scalar constants become Python floats: cheaper, and torch.compile's attention
        # pattern matcher wants a float softmax scale, not a 1-element tensor.
        if op == "Pow" and scalar[1] and float(const(1)) in (2.0, 3.0):
            return (lambda x, _: x * x) if float(const(1)) == 2.0 else (lambda x, _: x * x * x)
        if scalar[1]:
            c1 = float(const(1))
            return lambda x, _: fn(x, c1)
        if scalar[0]:
            c0 = float(const(0))
            return lambda _, y: fn(c0, y)
        return fn
    unary = {"Relu": F.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
             "Sqrt": torch.sqrt, "Identity": lambda x: x}
    if op in unary:
        return unary[op]
    if op == "Conv":
        pads = a.get("pads", [0, 0, 0, 0])
        assert pads[:2] == pads[2:], "asymmetric conv padding"
        stride, groups = tuple(a.get("strides", [1, 1])), a.get("group", 1)
        return lambda x, w, b=None: F.conv2d(x, w, b, stride, tuple(pads[:2]),
                                             tuple(a.get("dilations", [1, 1])), groups)
    if op == "BatchNormalization":
        eps = a.get("epsilon", 1e-5)
        return lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, eps)
    if op == "Clip":
        lo, hi = float(const(1)), float(const(2))
        return lambda x, *_: torch.clamp(x, lo, hi)
    if op == "MaxPool":
        pads = a.get("pads", [0, 0, 0, 0])
        return lambda x: F.max_pool2d(x, a["kernel_shape"], a.get("strides"), pads[:2])
    if op == "GlobalAveragePool":
        return lambda x: x.mean((2, 3), keepdim=True)
    if op == "Flatten":
        axis = a.get("axis", 1)
        return lambda x: x.reshape(math.prod(x.shape[:axis]), -1)
    if op == "Gemm":
        assert not a.get("transA", 0) and a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1
        if a.get("transB", 0):
            return lambda x, w, b=None: F.linear(x, w, b)
        return lambda x, w, b=None: torch.addmm(b, x, w) if b is not None else x @ w
    if op == "MatMul":
        return torch.matmul
    if op == "Reshape":
        shape = ints(1)
        return lambda x, _: x.reshape([x.shape[i] if s == 0 else s for i, s in enumerate(shape)])
    if op == "Transpose":
        return lambda x: x.permute(a["perm"])
    if op == "Softmax":
        return lambda x: torch.softmax(x, a.get("axis", -1))
    if op == "LayerNormalization":
        assert a.get("axis", -1) == -1
        eps = a.get("epsilon", 1e-5)
        return lambda x, w, b=None: F.layer_norm(x, (x.shape[-1],), w, b, eps)
    if op == "ReduceMean":
        axes, keep = a.get("axes"), bool(a.get("keepdims", 1))
        return lambda x, *_: x.mean(axes, keepdim=keep)
    if op == "Gather":
        axis = a.get("axis", 0)
        if node.input[1] in static:
            if const(1).ndim == 0:
                k = int(const(1))
                return lambda x, _: x.select(axis, k)
        return lambda x, i: x.index_select(axis, i.reshape(-1)).reshape(
            x.shape[:axis] + i.shape + x.shape[axis + 1:])
    if op == "Unsqueeze":
        axes = sorted(ints(1))
        def unsqueeze(x, _):
            for ax in axes:
                x = x.unsqueeze(ax)
            return x
        return unsqueeze
    if op == "Concat":
        return lambda *xs: torch.cat(xs, a["axis"])
    if op == "Expand":
        shape = ints(1)
        return lambda x, _: x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))
    if op == "Cast":
        dtype = {onnx.TensorProto.FLOAT: torch.float32,
                 onnx.TensorProto.INT64: torch.int64}[a["to"]]
        return lambda x: x.to(dtype)
    if op == "Resize":
        assert a.get("mode", b"nearest") in (b"nearest", "nearest")
        scales = [float(s) for s in const(2)][2:]
        return lambda x, *_: F.interpolate(x, scale_factor=scales, mode="nearest")
    if op == "Slice":
        starts, ends = ints(1), ints(2)
        axes = ints(3) if len(node.input) > 3 and node.input[3] else list(range(len(starts)))
        def slc(x, *_):
            index = [slice(None)] * x.dim()
            for ax, s, e in zip(axes, starts, ends, strict=True):
                index[ax] = slice(s, e)
            return x[tuple(index)]
        return slc
    raise NotImplementedError(f"to_torch: ONNX op {op} is not lowered")
