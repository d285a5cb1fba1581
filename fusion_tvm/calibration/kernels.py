"""The kernels of a compiled model, one per plan group, each timed alone.

:func:`plan_kernels` pairs every :class:`~fusion_tvm.plan.GroupPlan` with the scheduled
PrimFunc that FuseTIR made of it in ``cm.fused_mod`` and with the cost model's breakdown;
:func:`time_kernel` builds one such PrimFunc as a module of its own and times it on random
inputs shaped from its buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, tirx

from ..grouping import group_name
from ..passes.apply_target_schedule import RULE_ATTR
from ..plan import GroupPlan
from ._timing import Runner

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass
class Kernel:
    """One kernel of a plan: its group, its PrimFunc and the model's prediction."""

    group: GroupPlan
    func_name: str
    func: tirx.PrimFunc | None
    detail: dict = field(default_factory=dict)
    graph: object = field(default=None, repr=False)  # FusionGraph of the block
    members: frozenset = field(default=frozenset(), repr=False)

    @property
    def rule(self) -> str:
        if self.func is not None and self.func.attrs is not None and RULE_ATTR in self.func.attrs:
            return str(self.func.attrs[RULE_ATTR])
        return self.group.rule


def _callees(mod: tvm.IRModule, function: str) -> dict[str, list[str]]:
    """Binding var name -> PrimFunc names called by ``call_tir`` bound to it, in ``function``."""
    out: dict[str, list[str]] = {}
    if function not in [gv.name_hint for gv in mod.get_global_vars()]:
        return out
    func = mod[function]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return out
    for block in func.body.blocks:
        for b in block.bindings:
            v = getattr(b, "value", None)
            if isinstance(v, relax.Call) and v.op.same_as(CALL_TIR):
                out.setdefault(b.var.name, []).append(v.args[0].name_hint)
    return out


def plan_kernels(cm) -> list[Kernel]:
    """Every kernel of ``cm.plan`` with its scheduled PrimFunc (``func`` None if not found)."""
    plan = cm.plan
    if plan is None:
        raise ValueError("the compiled model has no fusion plan (compile with fusion='cost')")
    mod = cm.fused_mod
    prims = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    model = plan.cost_model_obj
    callees: dict[str, dict[str, list[str]]] = {}
    blocks = {(b.function, b.block_index): b for b in plan.blocks}
    kernels = []
    for gp in plan.groups:
        block = blocks.get((gp.function, getattr(gp, "block_index", 0)))
        if block is None and len(plan.blocks) == 1:
            block = plan.blocks[0]
        if block is None:
            kernels.append(Kernel(gp, gp.name, None))
            continue
        graph, g = block.graph, frozenset(gp.node_ids)
        members = sorted(g)
        # The plan names the kernel (newer plans); else FuseTIR's name for the group, checked
        # against the call_tir bound to one of the group's bindings.
        name = getattr(gp, "kernel", "") or None
        if name not in prims:
            expect = graph.nodes[members[0]].func_name if len(members) == 1 \
                else group_name(graph, members)
            if gp.function not in callees:
                callees[gp.function] = _callees(mod, gp.function)
            called = [c for op in gp.ops for c in callees[gp.function].get(op, [])]
            name = next((c for c in called if c == expect), None)
            name = name or next((c for c in called if c.startswith(expect)), None)
            name = name or expect
        detail = dict(model.estimate(graph, g).detail) if model is not None else {}
        kernels.append(Kernel(gp, name, prims.get(name), detail, graph, g))
    return kernels


# ------------------------------------------------------------------------------- timing
def _random(shape, dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return np.ones(shape, dtype=bool)
    # Integer tensors are indices or token ids: zero is in range for every gather.
    return np.zeros(shape, dtype=dtype)


def concrete_shape(buf, dims: Mapping[str, int] | None = None) -> tuple[int, ...] | None:
    """``buf``'s shape with its symbolic dims set from ``dims`` (by name); None when a
    dim is missing from ``dims`` or does not simplify to a constant."""
    out = []
    for d in buf.shape:
        if isinstance(d, tirx.IntImm):
            out.append(int(d))
            continue
        free = tirx.analysis.undefined_vars(d)
        if dims is None or any(v.name not in dims for v in free):
            return None
        analyzer = tvm.sym.Analyzer()
        for v in free:
            analyzer.bind(v, tirx.IntImm(str(v.ty), int(dims[v.name])))
        value = analyzer.simplify(d)
        if not isinstance(value, tirx.IntImm):
            return None
        out.append(int(value))
    return tuple(out)


def prim_inputs(func: tirx.PrimFunc, rng: np.random.Generator,
                dims: Mapping[str, int] | None = None) -> list:
    """Random arrays for every buffer parameter of ``func``, and the value of every scalar
    shape parameter; symbolic dims take their values from ``dims`` (by name).

    Raises ``ValueError`` naming what is symbolic and has no value."""
    args: list = []
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is None:
            if dims is None or param.name not in dims:
                raise ValueError(
                    f"parameter {param.name} is not a buffer (symbolic shape parameter)")
            args.append(int(dims[param.name]))
            continue
        concrete = concrete_shape(param, dims)
        if concrete is None:
            free = sorted({v.name for d in shape for v in tirx.analysis.undefined_vars(d)
                           if dims is None or v.name not in dims})
            raise ValueError(f"buffer {param.name} has a symbolic shape {list(shape)}; no value "
                             f"for {', '.join(repr(n) for n in free)}")
        args.append(_random(concrete, str(param.dtype), rng))
    return args


def standalone_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """``func`` as the ``main`` of a module of its own."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def time_kernel(runner: Runner, func: tirx.PrimFunc, seed: int = 0) -> float:
    """Median seconds of one call of ``func`` alone on random inputs."""
    rng = np.random.default_rng(seed)
    args = [runner.tensor(a) for a in prim_inputs(func, rng)]
    module = runner.build_prim(standalone_module(func))
    return runner.time_prim(module, args)
