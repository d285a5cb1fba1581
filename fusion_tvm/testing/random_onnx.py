"""Random, valid, well-conditioned ONNX graphs for differential fuzzing.

>>> case = random_model(seed=7)           # same seed -> byte-identical model and feeds
>>> case.model, case.feeds
>>> result = check_case(case)             # ours vs the unfused build vs onnxruntime
>>> small = reduce_case(case, result.kind)  # delta-debugging: drop nodes while it still fails

Graphs use opset 17 and float32 only. Every tensor carries an upper bound on its magnitude so
that ``Exp`` only sees bounded inputs, denominators stay away from zero and ``Sqrt`` reads an
``Abs``: fp32 comparisons at rtol/atol 1e-4..1e-3 then say something about the compiler, not
about conditioning. The batch dim of every input is symbolic (``dim_param="N"``) in about half
of the graphs; no op reshapes, slices or splits a symbolic dim.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
SYM = "N"
Dim = int | str
Shape = tuple[Dim, ...]


@dataclass
class Tensor:
    name: str
    shape: Shape
    bound: float  # upper bound of |value|


@dataclass
class FuzzCase:
    """A generated model, its feeds and the seed it came from."""

    seed: int
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    batch: int  # the value fed for the symbolic dim (or the static batch)

    @property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.model.graph.node]


# ------------------------------------------------------------------------------- builder
class _Builder:
    def __init__(self, rng: random.Random, batch: int, symbolic: bool):
        self.rng = rng
        self.np_rng = np.random.default_rng(rng.randrange(1 << 31))
        self.batch = batch
        self.symbolic = symbolic
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.inputs: list[Tensor] = []
        self.pool: list[Tensor] = []
        self.used: set[str] = set()
        self._n = 0

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"{stem}{self._n}"

    def const(self, values: np.ndarray, stem: str = "c") -> str:
        name = self.fresh(stem)
        self.inits.append(numpy_helper.from_array(values, name))
        return name

    def weight(self, shape: Sequence[int], scale: float = 1.0) -> str:
        w = self.np_rng.uniform(-scale, scale, size=tuple(shape)).astype(np.float32)
        return self.const(w, "w")

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def node(self, op: str, inputs: Sequence[str], shapes_bounds, **attrs) -> list[Tensor]:
        outs = [Tensor(self.fresh("t"), tuple(s), float(b)) for s, b in shapes_bounds]
        self.nodes.append(
            helper.make_node(op, list(inputs), [t.name for t in outs], name=self.fresh(op), **attrs)
        )
        self.used.update(inputs)
        self.pool.extend(outs)
        return outs

    def add_input(self, shape: Shape) -> Tensor:
        t = Tensor(f"in{len(self.inputs)}", shape, 1.0)
        self.inputs.append(t)
        self.pool.append(t)
        return t

    def concrete(self, shape: Shape) -> tuple[int, ...]:
        return tuple(self.batch if d == SYM else d for d in shape)


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            return None
    return tuple(reversed(out))


def _numel(shape: Shape) -> int:
    return math.prod(d for d in shape if d != SYM)


def _factorize(n: int, rng: random.Random, max_rank: int) -> list[int]:
    dims = []
    while n > 1 and len(dims) < max_rank - 1:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divisors)
        dims.append(d)
        n //= d
    dims.append(n)
    rng.shuffle(dims)
    return dims


# ---------------------------------------------------------------------------------- ops
# Each op takes (builder, tensor) and returns True if it emitted something.
def _unary(b: _Builder, x: Tensor) -> bool:
    op = b.rng.choice(["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Erf", "Exp", "Sqrt"])
    if op == "Exp":
        if x.bound > 3:
            (x,) = b.node("Tanh", [x.name], [(x.shape, 1.0)])
        b.node("Exp", [x.name], [(x.shape, math.exp(x.bound))])
    elif op == "Sqrt":
        (a,) = b.node("Abs", [x.name], [(x.shape, x.bound)])
        b.node("Sqrt", [a.name], [(x.shape, math.sqrt(x.bound))])
    else:
        bound = 1.0 if op in ("Sigmoid", "Tanh", "Erf") else x.bound
        b.node(op, [x.name], [(x.shape, bound)])
    return True


def _const_like(b: _Builder, shape: Shape) -> tuple[Shape, str]:
    """A constant broadcastable against ``shape`` (some dims 1, maybe fewer leading dims)."""
    rank = len(shape) - b.rng.randrange(len(shape)) if b.rng.random() < 0.3 else len(shape)
    cshape = []
    for d in shape[len(shape) - rank:]:
        cshape.append(1 if d == SYM or b.rng.random() < 0.35 else d)
    return tuple(cshape), b.weight(cshape)


def _binary(b: _Builder, x: Tensor) -> bool:
    op = b.rng.choice(["Add", "Sub", "Mul", "Div", "Max", "Min"])
    others = [t for t in b.pool if t is not x and _broadcast(x.shape, t.shape) is not None]
    if others and b.rng.random() < 0.6:
        y = b.rng.choice(others)  # fan-out from an earlier tensor: diamonds
        if b.rng.random() < 0.5:
            x, y = y, x
        yshape, yname, ybound = y.shape, y.name, y.bound
    else:
        yshape, yname = _const_like(b, x.shape)
        ybound = 1.0
    out = _broadcast(x.shape, yshape)
    if op == "Div":
        # Denominator |y| + c with c in [0.5, 1]: never near zero.
        (a,) = b.node("Abs", [yname], [(yshape, ybound)])
        c = b.const(np.float32(b.rng.uniform(0.5, 1.0)).reshape(()), "c")
        (den,) = b.node("Add", [a.name, c], [(yshape, ybound + 1)])
        b.node("Div", [x.name, den.name], [(out, x.bound * 2)])
        return True
    bound = {"Add": x.bound + ybound, "Sub": x.bound + ybound, "Mul": x.bound * ybound}
    b.node(op, [x.name, yname], [(out, bound.get(op, max(x.bound, ybound)))])
    return True


def _reduce(b: _Builder, x: Tensor) -> bool:
    op = b.rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"])
    rank = len(x.shape)
    axes = sorted(b.rng.sample(range(rank), b.rng.randint(1, min(2, rank))))
    if b.rng.random() < 0.3:
        axes = [a - rank for a in axes]  # negative axes
    keep = b.rng.random() < 0.5
    if keep and rank == 1:
        return False
    if not keep and len(axes) == rank:
        return False
    pos = {a % rank for a in axes}
    shape = tuple(1 if i in pos else d for i, d in enumerate(x.shape)) if keep else tuple(
        d for i, d in enumerate(x.shape) if i not in pos
    )
    count = math.prod(b.batch if x.shape[i] == SYM else x.shape[i] for i in pos)
    bound = x.bound * count if op == "ReduceSum" else x.bound
    if op == "ReduceSum":  # opset 13+: axes is an input
        b.node(op, [x.name, b.ints(axes)], [(shape, bound)], keepdims=int(keep))
    else:  # ReduceMean / ReduceMax: axes is still an attribute at opset 17
        b.node(op, [x.name], [(shape, bound)], axes=axes, keepdims=int(keep))
    return True


def _matmul(b: _Builder, x: Tensor) -> bool:
    if len(x.shape) < 2 or x.shape[-1] == SYM:
        return False
    k = x.shape[-1]
    r = b.rng.random()
    if r < 0.25 and x.shape[-2] != SYM:
        # x @ x^T: a diamond through a Transpose (batched when rank > 2).
        perm = list(range(len(x.shape) - 2)) + [len(x.shape) - 1, len(x.shape) - 2]
        tshape = tuple(x.shape[p] for p in perm)
        (t,) = b.node("Transpose", [x.name], [(tshape, x.bound)], perm=perm)
        out = x.shape[:-1] + (x.shape[-2],)
        b.node("MatMul", [x.name, t.name], [(out, x.bound * x.bound * k)])
        return True
    n = b.rng.randint(1, 8)
    scale = 1.0 / math.sqrt(k)
    if r < 0.5 and len(x.shape) >= 3 and x.shape[-3] != SYM:
        wshape = (x.shape[-3], k, n)  # batched weight, broadcast over the leading dims
    else:
        wshape = (k, n)
    out = _broadcast(x.shape[:-2], wshape[:-2]) + (x.shape[-2], n)
    b.node("MatMul", [x.name, b.weight(wshape, scale)], [(out, x.bound * k * scale)])
    return True


def _gemm(b: _Builder, x: Tensor) -> bool:
    if len(x.shape) != 2 or x.shape[1] == SYM:
        return False
    m, k = x.shape
    n = b.rng.randint(1, 8)
    trans_b = b.rng.random() < 0.5
    scale = 1.0 / math.sqrt(k)
    w = b.weight((n, k) if trans_b else (k, n), scale)
    alpha = round(b.rng.uniform(0.5, 1.5), 3)
    inputs = [x.name, w]
    attrs = {"alpha": alpha, "transB": int(trans_b)}
    bound = alpha * x.bound * k * scale
    if b.rng.random() < 0.7:
        inputs.append(b.weight(b.rng.choice([(n,), (1, n)])))
        attrs["beta"] = round(b.rng.uniform(0.5, 1.5), 3)
        bound += attrs["beta"]
    b.node("Gemm", inputs, [((m, n), bound)], **attrs)
    return True


def _conv(b: _Builder, x: Tensor) -> bool:
    if len(x.shape) != 4 or SYM in x.shape[1:]:
        return False
    n, c, h, w = x.shape
    k = b.rng.choice([1, 3, 3])
    stride = b.rng.choice([1, 1, 2])
    pad = b.rng.choice([0, 1]) if k == 3 else 0
    if h + 2 * pad < k or w + 2 * pad < k:
        return False
    depthwise = c > 1 and b.rng.random() < 0.4
    group = c if depthwise else 1
    cout = c * b.rng.choice([1, 2]) if depthwise else b.rng.randint(1, 6)
    fan_in = (c // group) * k * k
    scale = 1.0 / math.sqrt(fan_in)
    inputs = [x.name, b.weight((cout, c // group, k, k), scale)]
    if b.rng.random() < 0.6:
        inputs.append(b.weight((cout,), 0.5))
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    b.node(
        "Conv", inputs, [((n, cout, oh, ow), x.bound * fan_in * scale + 0.5)],
        kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group,
    )
    return True


def _pool(b: _Builder, x: Tensor) -> bool:
    if len(x.shape) != 4 or SYM in x.shape[2:]:
        return False
    n, c, h, w = x.shape
    op = b.rng.choice(["MaxPool", "AveragePool"])
    k = b.rng.choice([2, 3])
    stride = b.rng.choice([1, 2])
    pad = b.rng.choice([0, 0, 1])
    if h + 2 * pad < k or w + 2 * pad < k:
        return False
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    b.node(op, [x.name], [((n, c, oh, ow), x.bound)],
           kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    return True


def _reshape(b: _Builder, x: Tensor) -> bool:
    lead = 1 if x.shape and x.shape[0] == SYM else 0
    if SYM in x.shape[lead:]:
        return False
    dims = _factorize(_numel(x.shape[lead:]), b.rng, 4 - lead)
    target = [0] * lead + dims
    out = x.shape[:lead] + tuple(dims)
    if b.rng.random() < 0.3 and dims:
        target[lead + b.rng.randrange(len(dims))] = -1
    b.node("Reshape", [x.name, b.ints(target)], [(out, x.bound)])
    return True


def _transpose(b: _Builder, x: Tensor) -> bool:
    if len(x.shape) < 2:
        return False
    perm = list(range(len(x.shape)))
    while perm == sorted(perm):
        b.rng.shuffle(perm)
    b.node("Transpose", [x.name], [(tuple(x.shape[p] for p in perm), x.bound)], perm=perm)
    return True


def _static_axes(x: Tensor, min_size: int = 1) -> list[int]:
    return [i for i, d in enumerate(x.shape) if d != SYM and d >= min_size]


def _concat(b: _Builder, x: Tensor) -> bool:
    axes = _static_axes(x)
    if not axes:
        return False
    axis = b.rng.choice(axes)
    same = [
        t for t in b.pool
        if len(t.shape) == len(x.shape) and t.shape[axis] != SYM
        and all(i == axis or t.shape[i] == x.shape[i] for i in range(len(x.shape)))
    ]
    parts = [x]
    for _ in range(b.rng.randint(1, 2)):
        if b.rng.random() < 0.6:
            parts.append(b.rng.choice(same))  # may be x itself: fan-out into one node
        else:
            shape = list(x.shape)
            if SYM in shape:
                continue
            shape[axis] = b.rng.randint(1, 3)
            parts.append(Tensor(b.weight(shape), tuple(shape), 1.0))
    if len(parts) < 2:
        return False
    size = sum(t.shape[axis] for t in parts)
    out = tuple(size if i == axis else d for i, d in enumerate(x.shape))
    neg = b.rng.random() < 0.3
    b.node("Concat", [t.name for t in parts], [(out, max(t.bound for t in parts))],
           axis=axis - len(x.shape) if neg else axis)
    return True


def _split(b: _Builder, x: Tensor) -> bool:
    axes = _static_axes(x, 2)
    if not axes:
        return False
    axis = b.rng.choice(axes)
    size = x.shape[axis]
    nparts = b.rng.randint(2, min(3, size))
    cuts = sorted(b.rng.sample(range(1, size), nparts - 1))
    sizes = [e - s for s, e in zip([0, *cuts], [*cuts, size], strict=True)]
    outs = [(tuple(s if i == axis else d for i, d in enumerate(x.shape)), x.bound) for s in sizes]
    b.node("Split", [x.name, b.ints(sizes)], outs, axis=axis)
    return True


def _slice(b: _Builder, x: Tensor) -> bool:
    axes = _static_axes(x, 2)
    if not axes:
        return False
    chosen = sorted(b.rng.sample(axes, b.rng.randint(1, min(2, len(axes)))))
    starts, ends, steps = [], [], []
    shape = list(x.shape)
    for a in chosen:
        size = x.shape[a]
        step = b.rng.choice([1, 1, 2, -1])
        if step > 0:
            s = b.rng.randrange(size - 1)
            e = b.rng.randint(s + 1, size)
            if b.rng.random() < 0.2:
                e = 1 << 30  # "to the end", as exporters write it
            shape[a] = len(range(s, min(e, size), step))
        else:
            s = b.rng.randint(1, size - 1)
            # A negative end counts from the back, so "through index 0" is -INT_MAX.
            e = b.rng.randrange(0, s) if b.rng.random() < 0.7 else -(1 << 30)
            shape[a] = len(range(s, max(e, -1), step))
        starts.append(s)
        ends.append(e)
        steps.append(step)
    inputs = [x.name, b.ints(starts), b.ints(ends), b.ints(chosen), b.ints(steps)]
    b.node("Slice", inputs, [(tuple(shape), x.bound)])
    return True


def _softmax(b: _Builder, x: Tensor) -> bool:
    axis = b.rng.randrange(-len(x.shape), len(x.shape))
    b.node("Softmax", [x.name], [(x.shape, 1.0)], axis=axis)
    return True


def _layernorm(b: _Builder, x: Tensor) -> bool:
    rank = len(x.shape)
    axis = rank - 1 if rank < 3 or b.rng.random() < 0.7 else rank - 2
    norm = x.shape[axis:]
    if SYM in norm or _numel(norm) < 4:
        return False
    scale = b.weight(norm)
    bias = b.weight(norm, 0.5)
    # eps 1e-3 keeps near-constant rows from amplifying rounding noise past the tolerance.
    b.node("LayerNormalization", [x.name, scale, bias],
           [(x.shape, 1.5 * math.sqrt(_numel(norm)))], axis=axis, epsilon=1e-3)
    return True


OPS: dict[str, tuple[Callable[[_Builder, Tensor], bool], float]] = {
    "unary": (_unary, 3.0),
    "binary": (_binary, 3.0),
    "reduce": (_reduce, 1.0),
    "matmul": (_matmul, 1.2),
    "gemm": (_gemm, 0.6),
    "conv": (_conv, 1.5),
    "pool": (_pool, 0.6),
    "reshape": (_reshape, 0.7),
    "transpose": (_transpose, 0.7),
    "concat": (_concat, 0.6),
    "split": (_split, 0.5),
    "slice": (_slice, 0.6),
    "softmax": (_softmax, 0.7),
    "layernorm": (_layernorm, 0.6),
}


def _input_shapes(rng: random.Random, batch: Dim) -> list[Shape]:
    kind = rng.choice(["image", "image", "seq", "mat", "flat"])
    if kind == "image":
        first: Shape = (batch, rng.randint(1, 4), rng.randint(3, 8), rng.randint(3, 8))
    elif kind == "seq":
        first = (batch, rng.randint(1, 6), rng.randint(2, 8))
    elif kind == "mat":
        first = (batch, rng.randint(2, 12))
    else:
        first = (batch, rng.randint(2, 4), rng.randint(1, 4), rng.randint(1, 5))
    shapes = [first]
    if rng.random() < 0.35:
        # A second input that broadcasts against the first (maybe with fewer dims).
        second = tuple(d if d == batch or rng.random() < 0.6 else 1 for d in first)
        shapes.append(second if rng.random() < 0.7 else second[1:] or (1,))
    return shapes


def random_model(seed: int, min_ops: int = 5, max_ops: int = 15) -> FuzzCase:
    """Generate a valid opset-17 model of ``min_ops..max_ops`` nodes from ``seed``."""
    rng = random.Random(seed)
    symbolic = rng.random() < 0.5
    batch = rng.randint(1, 3)
    b = _Builder(rng, batch, symbolic)
    for shape in _input_shapes(rng, SYM if symbolic else batch):
        b.add_input(shape)
    target = rng.randint(min_ops, max_ops)
    names, weights = zip(*[(k, w) for k, (_, w) in OPS.items()], strict=True)
    attempts = 0
    while len(b.nodes) < target and attempts < 200:
        attempts += 1
        unused_inputs = [t for t in b.inputs if t.name not in b.used]
        if unused_inputs:
            x = unused_inputs[0]
        else:
            # Prefer recent tensors (chains) but reach back sometimes (fan-out).
            pool = b.pool
            x = pool[-1 - min(int(rng.expovariate(0.7)), len(pool) - 1)]
        if _numel(x.shape) > 4096 or (x.bound > 1e4):
            continue
        kind = rng.choices(names, weights)[0]
        OPS[kind][0](b, x)
    for t in b.inputs:
        if t.name not in b.used:
            _binary(b, t)
    produced = {o for n in b.nodes for o in n.output}
    consumed = {i for n in b.nodes for i in n.input}
    outputs = [t for t in b.pool if t.name in produced and t.name not in consumed]
    extra = [t for t in b.pool if t.name in produced and t.name in consumed]
    if extra and rng.random() < 0.3:
        outputs.append(rng.choice(extra))  # an intermediate that also escapes
    graph = helper.make_graph(
        b.nodes, f"fuzz_{seed}",
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape))
         for t in b.inputs],
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape))
         for t in outputs],
        b.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fusion_tvm.fuzz"
    )
    model.ir_version = 8  # what onnxruntime of any recent version reads
    feed_rng = np.random.default_rng(seed)
    feeds = {
        t.name: feed_rng.uniform(-1, 1, size=b.concrete(t.shape)).astype(np.float32)
        for t in b.inputs
    }
    return FuzzCase(seed=seed, model=model, feeds=feeds, batch=batch)



# -------------------------------------------------------------------------------- oracle
RTOL = 1e-3
ATOL = 1e-4  # scaled by max(1, max|reference|)

# Failure kinds. Those in OURS are bugs of fusion_tvm's passes (the unfused build is fine).
OK = "ok"
GENERATOR = "generator"  # onnxruntime rejects the model: a bug of this module
IMPORT = "import"  # the frontend refuses the model (both builds)
STOCK_CRASH = "stock_crash"  # the unfused build fails too: TVM, not us
STOCK_MISMATCH = "stock_mismatch"  # the unfused build disagrees with onnxruntime
OURS_CRASH = "ours_crash"  # fusion="cost" fails where fusion="none" builds
ILL_FORMED = "ill_formed"  # a pass left a module that is not well formed
OURS_MISMATCH = "ours_mismatch"  # fusion="cost" disagrees with the unfused build
OURS = frozenset({OURS_CRASH, ILL_FORMED, OURS_MISMATCH})


@dataclass
class CheckResult:
    kind: str
    detail: str = ""
    num_kernels: tuple[int, int] = (0, 0)  # (ours, unfused)
    compile_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind == OK

    def signature(self) -> str:
        """What must stay the same while a reducer shrinks the case."""
        first = self.detail.splitlines()[0] if self.detail else ""
        if self.kind == OURS_CRASH:
            return f"{self.kind}:{first[:120]}"
        return self.kind


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str:
    """Empty when ``got`` matches ``want`` (same shapes, NaN masks and values within tolerance),
    else a one-line description of the first difference."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        gn, wn = np.isnan(g), np.isnan(w)
        if (gn != wn).any():
            return f"output {i}: NaN at {int((gn != wn).sum())} positions where the other has none"
        finite = np.isfinite(w) & np.isfinite(g)
        if (g[~finite & ~wn] != w[~finite & ~wn]).any():
            return f"output {i}: infinities differ"
        scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
        err = np.abs(g[finite].astype(np.float64) - w[finite])
        tol = ATOL * scale + RTOL * np.abs(w[finite])
        if (err > tol).any():
            worst = int(np.argmax(err - tol))
            return (f"output {i}: max abs error {err.max():.3g} (tolerance {tol[worst]:.3g}, "
                    f"scale {scale:.3g}) at {int((err > tol).sum())} of {err.size} elements")
    return ""


def _compile(model, fusion: str, schedule: bool, hw: str, well_formed: bool):
    """``fusion_tvm.compile`` under TVM's ``WellFormedInstrument`` (checked after every pass).

    The instrument prints the whole module when a check fails and raises a bare
    AssertionError; we keep the print off the terminal and re-raise naming the pass.
    """
    import contextlib
    import io

    from tvm.relax.ir.instrument import WellFormedInstrument

    import fusion_tvm

    if not well_formed:
        return fusion_tvm.compile(model, hw=hw, fusion=fusion, schedule=schedule)
    last = _LastPass()
    instruments = [last, WellFormedInstrument(validate_before_transform=False)]
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                tvm.transform.PassContext(instruments=instruments):
            return fusion_tvm.compile(model, hw=hw, fusion=fusion, schedule=schedule)
    except AssertionError as err:
        raise IllFormedError(f"module not well formed after pass {last.current}") from err


class IllFormedError(AssertionError):
    """A pass produced a module that ``relax.analysis.check_well_formed`` rejects."""


@tvm.instrument.pass_instrument
class _LastPass:
    """Remembers the pass being run (the stock instrument's failure does not say)."""

    def __init__(self):
        self.current = "?"

    def run_before_pass(self, _mod, info):
        self.current = info.name

    def run_after_pass(self, _mod, info):
        # Runs before the checker's own run_after_pass (it comes first in the list), so a
        # failing check names the pass that just ran, not a nested one.
        self.current = info.name


def stock_tvm_error(case: FuzzCase) -> str:
    """Build and run ``case`` with TVM alone (Relax ONNX importer, ``zero`` pipeline,
    ``tvm.compile`` for LLVM); the error in one line, or "" when it runs."""
    import contextlib
    import io

    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            mod = from_onnx(case.model, keep_params_in_input=False)
        target = tvm.target.Target("llvm")
        with target:
            mod = relax.get_pipeline("zero")(mod)
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        names = [i.name for i in case.model.graph.input]
        vm["main"](*[tvm.runtime.tensor(case.feeds[n]) for n in names if n in case.feeds])
    except Exception as err:  # noqa: BLE001 - any failure of TVM alone
        return _one_line(err)
    return ""


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def check_case(
    case: FuzzCase,
    schedule: bool = True,
    hw: str = "ci-x86-avx2",
    well_formed: bool = True,
    reference: Sequence[np.ndarray] | None = None,
    always_unfused: bool = True,
) -> CheckResult:
    """Compile ``case`` with ``fusion="cost"`` and ``fusion="none"``; run both and onnxruntime.

    The module is checked for well-formedness after every pass (``WellFormedInstrument``) and
    once more after fusion and scheduling (``check_well_formed(cm.fused_mod)``).

    With ``always_unfused=False`` the unfused build (half the compile time) is only made when
    ours fails or disagrees with onnxruntime, to tell our bugs from TVM's.
    """
    import time

    from tvm import relax

    from ..errors import UserInputError

    start = time.perf_counter()
    try:
        want = list(reference) if reference is not None else run_onnxruntime(case.model, case.feeds)
    except Exception as err:  # noqa: BLE001 - a model onnxruntime refuses is our generator's bug
        return CheckResult(GENERATOR, _one_line(err))
    # Ours builds and runs first: the VM's allocator hands freed blocks out again, so an
    # output element our kernels forget to write would otherwise hold the unfused build's
    # (correct) value and the bug would go unseen.
    ill_formed = ""
    try:
        try:
            ours = _compile(case.model, "cost", schedule, hw, well_formed)
        except IllFormedError as err:
            # Record it, then check the numbers anyway: a wrong result is the worse bug.
            ill_formed = str(err)
            ours = _compile(case.model, "cost", schedule, hw, well_formed=False)
        got = ours.run(case.feeds)
    except UserInputError as err:
        return CheckResult(IMPORT, _one_line(err))
    except Exception as err:  # noqa: BLE001
        ours_error = _one_line(err)
    else:
        ours_error = ""
        if not always_unfused and not compare(got, want):
            if well_formed and not ill_formed and not relax.analysis.check_well_formed(
                    ours.fused_mod):
                ill_formed = "check_well_formed(cm.fused_mod) is False"
            kernels = (ours.num_kernels, 0)
            kind, detail = (ILL_FORMED, ill_formed) if ill_formed else (OK, "")
            return CheckResult(kind, detail, kernels, time.perf_counter() - start)
    try:
        base = _compile(case.model, "none", schedule, hw, well_formed=False)
        base_out = base.run(case.feeds)
    except Exception as err:  # noqa: BLE001
        # fusion="none" still runs our prepare passes (layouts, sibling combine, slices) and
        # schedule rules: the crash is TVM's only if TVM's own pipeline crashes too.
        if not stock_tvm_error(case):
            return CheckResult(OURS_CRASH, f"{ours_error or 'unfused build'}: {_one_line(err)} "
                                           "(stock TVM builds and runs it)")
        return CheckResult(STOCK_CRASH, _one_line(err))
    if ours_error:
        return CheckResult(OURS_CRASH, ours_error)
    kernels = (ours.num_kernels, base.num_kernels)
    if well_formed and not ill_formed and not relax.analysis.check_well_formed(ours.fused_mod):
        ill_formed = "check_well_formed(cm.fused_mod) is False"
    elapsed = time.perf_counter() - start
    diff = compare(got, base_out)
    if diff:
        return CheckResult(OURS_MISMATCH, f"fused vs unfused: {diff}", kernels, elapsed)
    diff = compare(base_out, want)
    if diff:
        return CheckResult(STOCK_MISMATCH, f"unfused vs onnxruntime: {diff}", kernels, elapsed)
    if ill_formed:
        return CheckResult(ILL_FORMED, ill_formed, kernels, elapsed)
    return CheckResult(OK, "", kernels, elapsed)


# ------------------------------------------------------------------------------- reducer
def _all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the graph (inputs, node outputs), computed by onnxruntime."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in known:
                vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                probe.graph.output.append(vi)
                known.add(name)
    names = [o.name for o in probe.graph.output]
    values = dict(zip(names, run_onnxruntime(probe, feeds), strict=True))
    values.update(feeds)
    return values


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        infos[vi.name] = vi
    return infos


def sub_case(case: FuzzCase, keep: Sequence[int], values=None, infos=None) -> FuzzCase:
    """The case restricted to nodes ``keep``: tensors they read but no kept node produces
    become graph inputs (fed with the values they had in the full model), and kept outputs
    no kept node reads become graph outputs."""
    graph = case.model.graph
    values = values if values is not None else _all_values(case.model, case.feeds)
    infos = infos if infos is not None else _value_infos(case.model)
    nodes = [graph.node[i] for i in sorted(keep)]
    inits = {t.name: t for t in graph.initializer}
    produced = {o for n in nodes for o in n.output if o}
    consumed = {i for n in nodes for i in n.input if i}
    inputs, used_inits = [], []
    for name in dict.fromkeys(i for n in nodes for i in n.input if i):
        if name in produced:
            continue
        if name in inits:
            used_inits.append(inits[name])
        else:
            inputs.append(name)
    outs = [o for n in nodes for o in n.output if o and o not in consumed]
    outs += [o.name for o in graph.output if o.name in produced and o.name not in outs]

    def info(name):
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(infos[name])
        return vi

    sub = helper.make_graph(nodes, graph.name + "_reduced", [info(n) for n in inputs],
                            [info(n) for n in outs], used_inits)
    model = helper.make_model(sub, opset_imports=list(case.model.opset_import),
                              producer_name="fusion_tvm.fuzz.reduce")
    model.ir_version = case.model.ir_version
    feeds = {n: np.asarray(values[n], dtype=np.float32) for n in inputs}
    return FuzzCase(seed=case.seed, model=model, feeds=feeds, batch=case.batch)


def reduce_case(
    case: FuzzCase,
    signature: str,
    check: Callable[[FuzzCase], CheckResult] = check_case,
    max_checks: int = 300,
    log: Callable[[str], None] | None = None,
) -> FuzzCase:
    """Delta debugging (ddmin) over the nodes: the smallest case whose check still fails
    with ``signature`` (see :meth:`CheckResult.signature`) within ``max_checks`` checks."""
    values = _all_values(case.model, case.feeds)
    infos = _value_infos(case.model)
    checks = 0

    def fails(keep: list[int]) -> bool:
        nonlocal checks
        if not keep or checks >= max_checks:
            return False
        checks += 1
        try:
            sub = sub_case(case, keep, values, infos)
            result = check(sub)
        except Exception:  # noqa: BLE001 - a sub-case the tools reject is just not a repro
            return False
        same = result.signature() == signature
        if log is not None:
            log(f"  check {checks}: {len(keep)} nodes -> {result.kind}{' (kept)' if same else ''}")
        return same

    keep = list(range(len(case.model.graph.node)))
    n = 2
    while len(keep) >= 2 and checks < max_checks:
        chunk = math.ceil(len(keep) / n)
        parts = [keep[i:i + chunk] for i in range(0, len(keep), chunk)]
        for part in parts:
            rest = [i for i in keep if i not in part]
            if fails(part):
                keep, n = part, 2
                break
            if fails(rest):
                keep, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(keep):
                break
            n = min(len(keep), 2 * n)
    return sub_case(case, keep, values, infos)


__all__ = [
    "OURS", "CheckResult", "FuzzCase", "OPSET", "check_case", "compare", "random_model",
    "reduce_case", "run_onnxruntime", "sub_case",
]
