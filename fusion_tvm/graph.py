"""FusionGraph: the dataflow graph of one Relax dataflow block, ready for fusion search.

One node per binding. ``call_tir`` bindings are fusible nodes carrying their PrimFunc,
op-pattern kind and a structural analysis (FLOPs by class, reuse of each input). Every
other binding (tuples, ``TupleGetItem``, ``match_cast``, packed calls, relax ops left
unlegalized) is a *barrier* node: it keeps its place in the dependency graph, so that
convexity is checked through it, but it never joins a group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, reduce

import tvm
from tvm import relax, tirx

from .ops import OpClass, PatternKind
from .tir_analysis import PrimFuncInfo, analyze_primfunc, evaluate, shape_elems

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")


def is_kernel_call(expr) -> bool:
    """A ``call_tir`` or ``call_tir_inplace`` (which writes into some of its arguments):
    the calls that launch a PrimFunc and may be fused."""
    return isinstance(expr, relax.Call) and (
        expr.op.same_as(CALL_TIR) or expr.op.same_as(CALL_TIR_INPLACE)
    )


@dataclass
class TensorInfo:
    """A value flowing between nodes (a binding var, a tuple field, a constant or a param)."""

    id: int
    name: str
    shape: tuple  # PrimExpr dims; () for scalars / non-tensors
    dtype: str
    producer: int | None = None  # node id; None for params / constants / outer vars
    consumers: list[int] = field(default_factory=list)
    escapes: bool = False  # used outside the fusible world (barrier, block output, later)
    is_constant: bool = False

    def nbytes(self, dims: Mapping[str, int]) -> float:
        """Bytes of this tensor with symbolic dims bound by ``dims``."""
        if not self.dtype or not self.shape and self.is_constant and not self.producer:
            return 0.0 if not self.dtype else max(tvm.DataType(self.dtype).bits, 8) / 8
        bits = tvm.DataType(self.dtype).bits
        return shape_elems(self.shape, dims) * max(bits, 8) / 8


@dataclass
class FusionNode:
    """One binding of the block."""

    id: int
    name: str  # the binding var's name
    binding: relax.Binding
    inputs: list[int]  # tensor ids in argument order (call_tir) or used vars (barrier)
    outputs: list[int]  # tensor ids
    func_name: str = ""  # the PrimFunc's global name ('' for barriers)
    pattern: PatternKind = PatternKind.OPAQUE
    info: PrimFuncInfo | None = None
    fusible: bool = False
    is_view: bool = False  # a pure reshape: becomes a free view when left alone
    #: dtypes of the PrimFunc's buffer shapes (int64 from LegalizeOps, int32 in many
    #: hand-written PrimFuncs): FuseTIR cannot join buffers whose shapes differ in it.
    index_dtypes: frozenset[str] = frozenset()
    #: The ONNX node(s) this binding computes (empty: none, e.g. a layout conversion a pass
    #: inserted, or a model that is not ONNX); set on the plan by the pipeline.
    origins: tuple[str, ...] = ()

    @property
    def op_class(self) -> OpClass | None:
        """Dominant work class; None for barriers."""
        return self.info.op_class if self.info is not None else None

    @property
    def is_contraction(self) -> bool:
        """Whether this node is a matmul / conv."""
        return self.op_class in (OpClass.MATMUL, OpClass.CONV)

    @property
    def is_reduction(self) -> bool:
        """Whether this node reduces (and is not a contraction)."""
        return self.op_class is OpClass.REDUCTION

    def flops(self, dims: Mapping[str, int]) -> dict[OpClass, float]:
        """FLOPs by class."""
        return self.info.flops(dims) if self.info is not None else {}

    def touched_fraction(self, arg_index: int, dims: Mapping[str, int]) -> float:
        """Fraction (<= 1) of argument ``arg_index`` actually read (gathers read little)."""
        if self.info is None or arg_index >= len(self.info.param_names):
            return 1.0
        return min(1.0, self.info.read_ratio(arg_index, dims))

    def reuse(self, arg_index: int, dims: Mapping[str, int]) -> float:
        """Times each element of argument ``arg_index`` is read."""
        if self.info is None or arg_index >= len(self.info.param_names):
            return 1.0
        return self.info.reuse(arg_index, dims)


@dataclass
class FusionGraph:
    """Nodes in binding (= topological) order, tensors, and the dims used to evaluate sizes."""

    nodes: list[FusionNode]
    tensors: list[TensorInfo]
    dims: dict[str, int]
    succs: list[set[int]] = field(default_factory=list)
    preds: list[set[int]] = field(default_factory=list)
    #: Groups the target could not schedule (feedback); no candidate may contain one.
    forbidden: list[frozenset[int]] = field(default_factory=list)

    def __post_init__(self):
        if not self.succs:
            self.succs = [set() for _ in self.nodes]
            self.preds = [set() for _ in self.nodes]
        for t in self.tensors:
            if t.producer is None:
                continue
            for c in t.consumers:
                if c != t.producer:
                    self.succs[t.producer].add(c)
                    self.preds[c].add(t.producer)

    @property
    def fusible_nodes(self) -> list[int]:
        """Ids of the call_tir nodes that may join groups."""
        return [n.id for n in self.nodes if n.fusible]

    def add_edge(self, u: int, v: int) -> None:
        """A control/shape dependence (e.g. a match_cast defining a symbolic dim)."""
        if u != v:
            self.succs[u].add(v)
            self.preds[v].add(u)

    def nbytes(self, tensor_id: int) -> float:
        """Bytes of a tensor at the graph's dims."""
        return self.tensors[tensor_id].nbytes(self.dims)

    @cached_property
    def cold_bytes(self) -> float:
        """Bytes of the tensors no node of the block produces (weights, constants, inputs).

        One run reads them all before it reads any of them again: a kernel finds one in the
        level that holds them all, not in the level its own size fits.
        """
        return sum(self.nbytes(t.id) for t in self.tensors if t.producer is None)

    def with_dims(self, dims: Mapping[str, int]) -> FusionGraph:
        """The same graph evaluated at other symbolic dims."""
        return FusionGraph(self.nodes, self.tensors, dict(dims), self.succs, self.preds,
                           self.forbidden)

    def describe(self, node_id: int) -> str:
        """``name = func(...)`` for messages."""
        n = self.nodes[node_id]
        return f"{n.name} = {n.func_name or type(n.binding.value).__name__}"


# --------------------------------------------------------------------------- building
def _tensor_shape_dtype(ty) -> tuple[tuple, str]:
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        shape = ty.shape
        if isinstance(shape, relax.ShapeExpr):
            return tuple(shape.values), str(ty.dtype)
    if isinstance(ty, relax.TensorType):
        return (), str(ty.dtype)
    return (), ""


def _sym_names_of(ty) -> set[str]:
    try:
        return {v.name for v in relax.analysis.tir_vars_in_type(ty)}
    except Exception:  # noqa: BLE001 - not every type supports it
        return set()


def _index_dtypes(func) -> frozenset[str]:
    """The dtypes of a PrimFunc's buffer shape dims (static and symbolic alike)."""
    if not isinstance(func, tirx.PrimFunc):
        return frozenset()
    return frozenset(
        str(d.ty) for p in func.params for d in (getattr(p, "shape", None) or ())
    )


def _same_size(args, out: relax.Var) -> bool:
    """One tensor argument with as many elements as ``out``: a leading slice (the first
    channel blocks of a blocked tensor) also maps flat index to flat index, but it is a
    copy, not a view RewriteDataflowReshape can make of it."""
    tensors = [a for a in args if isinstance(getattr(a, "ty", None), relax.TensorType)]
    if len(tensors) != 1:
        return False
    shapes = [t.ty.shape for t in (tensors[0], out)]
    if not all(isinstance(s, relax.ShapeExpr) for s in shapes):
        return False
    sizes = [reduce(lambda a, b: a * b, s.values, tirx.IntImm("int64", 1))
             for s in shapes]
    return tvm.sym.Analyzer().can_prove_equal(sizes[0], sizes[1])


def build_fusion_graph(
    mod: tvm.IRModule,
    block: relax.DataflowBlock,
    used_outside: set,
    dims: Mapping[str, int] | None = None,
    info_cache: dict | None = None,
) -> FusionGraph:
    """Build the graph of ``block``.

    Parameters
    ----------
    mod : IRModule
        Holds the PrimFuncs called by the block.
    block : relax.DataflowBlock
        The block to analyse.
    used_outside : set of relax.Var
        Vars used after the block (later blocks, the function's result).
    dims : mapping, optional
        Values of symbolic dims for size evaluation (missing ones default to 1).
    info_cache : dict, optional
        PrimFunc name -> :class:`PrimFuncInfo`, shared across blocks.
    """
    info_cache = {} if info_cache is None else info_cache
    tensors: list[TensorInfo] = []
    var_tensor: dict = {}  # relax var / constant -> tensor id (single-output)
    nodes: list[FusionNode] = []
    sym_def: dict[str, int] = {}  # symbolic dim name -> node id of the match_cast defining it

    def tensor_of(expr, name: str | None = None) -> int:
        if expr in var_tensor:
            return var_tensor[expr]
        shape, dtype = _tensor_shape_dtype(expr.ty)
        t = TensorInfo(
            id=len(tensors),
            name=name or getattr(expr, "name", "") or type(expr).__name__,
            shape=shape,
            dtype=dtype,
            is_constant=isinstance(expr, tvm.ir.expr.Constant),
        )
        tensors.append(t)
        var_tensor[expr] = t.id
        return t.id

    extra_edges: list[tuple[int, int]] = []
    for idx, binding in enumerate(block.bindings):
        value = binding.value
        var = binding.var
        is_call_tir = is_kernel_call(value)
        node = FusionNode(id=idx, name=var.name, binding=binding, inputs=[], outputs=[])
        if is_call_tir and isinstance(value.args[1], relax.Tuple) and len(value.args) == 2:
            gv = value.args[0]
            func = mod[gv]
            node.func_name = gv.name_hint
            if gv.name_hint not in info_cache:
                info_cache[gv.name_hint] = analyze_primfunc(func)
            node.info = info_cache[gv.name_hint]
            node.index_dtypes = _index_dtypes(func)
            # RewriteDataflowReshape turns such a binding into a free view, except when it
            # produces a block output (which needs its own memory).
            node.is_view = bool(relax.analysis.has_reshape_pattern(func)) and isinstance(
                var, relax.DataflowVar
            ) and _same_size(value.args[1].fields, var)
            pattern = func.attrs.get("op_pattern", 8) if func.attrs is not None else 8
            node.pattern = PatternKind(int(pattern)) if int(pattern) in (0, 1, 2, 3, 4, 7) \
                else PatternKind.OPAQUE
            single_tensor_out = isinstance(var.ty, relax.TensorType)
            node.fusible = node.pattern is not PatternKind.OPAQUE and single_tensor_out
            for arg in value.args[1].fields:
                if isinstance(getattr(arg, "ty", None), tvm.ir.PrimType):
                    # a symbolic dim passed by value: no data moves
                    tid = tensor_of(arg)
                    tensors[tid].is_constant = True
                    node.inputs.append(tid)
                elif isinstance(arg, (relax.Var, tvm.ir.expr.Constant)):
                    tid = tensor_of(arg)
                    node.inputs.append(tid)
                else:  # an inline expression we do not model: keep it unfused
                    node.fusible = False
        else:
            for used in relax.analysis.free_vars(value):
                node.inputs.append(tensor_of(used))
        # outputs
        out = tensor_of(var, var.name)
        tensors[out].producer = idx
        node.outputs.append(out)
        for tid in node.inputs:
            tensors[tid].consumers.append(idx)
            if not node.fusible:
                tensors[tid].escapes = True
        # symbolic dims defined by a match_cast order everything that mentions them
        for name in _sym_names_of(var.ty):
            if name in sym_def and sym_def[name] != idx:
                extra_edges.append((sym_def[name], idx))
        if isinstance(binding, relax.MatchCast):
            for name in _sym_names_of(binding.ty):
                sym_def.setdefault(name, idx)
        if not isinstance(var, relax.DataflowVar) or var in used_outside:
            tensors[out].escapes = True
        nodes.append(node)

    graph = FusionGraph(nodes=nodes, tensors=tensors, dims=dict(dims or {}))
    for u, v in extra_edges:
        graph.add_edge(u, v)
    return graph


def default_dims(mod: tvm.IRModule, hints: Mapping[str, int] | None = None) -> dict[str, int]:
    """Values for every symbolic dim of ``main``: the hint, else 1 for batch-like dims.

    Batch-like dims are those in the leading position of an input shape; other dims
    (sequence lengths, image sizes) default to 128 so that plans are not tuned for
    degenerate sizes.
    """
    hints = dict(hints or {})
    dims: dict[str, int] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for p in func.params:
            shape, _ = _tensor_shape_dtype(p.ty)
            for axis, d in enumerate(shape):
                if isinstance(d, tirx.Var) and d.name not in dims:
                    dims[d.name] = 1 if axis == 0 else 128
    dims.update(hints)
    return dims


__all__ = [
    "CALL_TIR",
    "CALL_TIR_INPLACE",
    "FusionGraph",
    "FusionNode",
    "PatternKind",
    "TensorInfo",
    "build_fusion_graph",
    "default_dims",
    "evaluate",
    "is_kernel_call",
]
