"""Sibling (horizontal) fusion: matmuls that share their input become one wider matmul.

Q/K/V projections, gate/up projections and inception-style branches read the same
activation; computed as one matmul over concatenated weights (concatenated once, at
compile time) the activation is read once and one kernel runs instead of several. TVM's
``CombineParallelMatmul`` does the rewrite; this module decides *whether* to take it, from
the hardware spec: the predicted time of the branches apart versus combined.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, tirx

from ..hardware import HardwareSpec, OpClass


def _static_shape(expr) -> list[int] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tirx.IntImm):
            return None
        dims.append(int(d.value))
    return dims


def sibling_gain_s(hw: HardwareSpec, m: int, k: int, ns: list[int], itemsize: int = 4) -> float:
    """Predicted seconds saved by one ``m x k x sum(ns)`` matmul over ``len(ns)`` matmuls."""
    peak = hw.peak_flops[OpClass.MATMUL]
    bw = hw.dram.bandwidth_bytes_per_s

    def one(n: int) -> float:
        flops = 2.0 * m * k * n
        traffic = itemsize * (m * k + k * n + m * n)
        return hw.launch_overhead_s + max(flops / peak, traffic / bw)

    return sum(one(n) for n in ns) - one(sum(ns))


def make_check(hw: HardwareSpec, constants: set[str]):
    """The ``check`` callback of ``CombineParallelMatmul``: combine when predicted faster and
    every weight is a compile-time constant (named in ``constants``), so the concatenation
    costs nothing at run time."""

    def check(lhs, rhs_list, _bias_list, _bindings) -> bool:
        if not all(getattr(r, "name", None) in constants for r in rhs_list):
            return False
        lhs_shape = _static_shape(lhs)
        shapes = [_static_shape(r) for r in rhs_list]
        if lhs_shape is None or any(s is None or len(s) != 2 for s in shapes):
            return True  # symbolic batch / sequence: one launch saved whatever the size
        m = math.prod(lhs_shape[:-1])
        return sibling_gain_s(hw, m, lhs_shape[-1], [s[1] for s in shapes]) > 0

    return check


_MATMUL = tvm.ir.Op.get("relax.matmul")
_ADD = tvm.ir.Op.get("relax.add")


@relax.expr_functor.mutator
class _LiftMatmulWeights(relax.PyExprMutator):
    """Turn constant matmul weights and biases into parameters (CombineParallelMatmul only
    matches parameters); they are bound back right after."""

    def __init__(self, mod):
        super().__init__(mod)
        self.lifted: dict[str, object] = {}
        self.params: list[relax.Var] = []

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        if not isinstance(call, relax.Call) or not (
            call.op.same_as(_MATMUL) or call.op.same_as(_ADD)
        ):
            return call
        # matmul weights, and biases added to them (the pattern matches both as params);
        # exporters often write Add(bias, x): addition commutes, put the bias second.
        args = list(call.args)
        if call.op.same_as(_ADD) and isinstance(args[0], tvm.ir.expr.Constant) and not \
                isinstance(args[1], tvm.ir.expr.Constant):
            args = [args[1], args[0]]
        args = [self._lift(a) if k == 1 else a for k, a in enumerate(args)]
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def _lift(self, expr):
        if not isinstance(expr, tvm.ir.expr.Constant) or not isinstance(expr.ty, relax.TensorType):
            return expr
        # One parameter per use: exporters share one constant between branches (HF BERT's
        # Q, K and V biases are one zero tensor), and the pattern wants distinct biases.
        # Bound back to the same Constant node, so a weight shared by two matmuls (tied or
        # layer-shared weights) stays one tensor in the artifact.
        var = relax.Var(f"__ftvm_w{len(self.params)}", expr.ty)
        self.params.append(var)
        self.lifted[var.name] = expr
        return var


@tvm.transform.module_pass(opt_level=0, name="CombineSiblingMatmuls")
class CombineSiblingMatmuls:
    """Combine matmuls sharing their input when :func:`make_check` predicts a gain."""

    def __init__(self, hw: HardwareSpec):
        self.hw = hw

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Lift constant weights, combine, bind the weights back (folded later)."""
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or (
                func.attrs is not None and "Primitive" in func.attrs
            ):
                continue
            lifter = _LiftMatmulWeights(mod)
            body = lifter.visit_expr(func.body)
            if len(lifter.params) < 2:
                continue
            lifted = relax.Function(
                list(func.params) + lifter.params, body, func.ret_ty, func.is_pure, func.attrs
            )
            single = tvm.IRModule({gv: lifted})
            try:
                single = relax.transform.CombineParallelMatmul(
                    make_check(self.hw, set(lifter.lifted))
                )(single)
                single = tvm.IRModule({gv: single[gv.name_hint].bind_params(lifter.lifted)})
            except Exception:  # noqa: BLE001 - an optional rewrite: leave the function as is
                # TVM's pattern rewriter rejects some graphs (a constant matmul operand:
                # fuzz seed 5124); sibling fusion is then simply not applied.
                continue
            mod = tvm.IRModule(
                {g: (single[gv.name_hint] if g.same_as(gv) else f)
                 for g, f in mod.functions.items()},
                attrs=mod.attrs,
                global_infos=mod.global_infos,
            )
        return mod


def combine_siblings(hw: HardwareSpec) -> tvm.transform.Pass:
    """Sibling-matmul combination gated by :func:`make_check` for ``hw``."""
    return CombineSiblingMatmuls(hw)
