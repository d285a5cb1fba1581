"""FuseByCostModel: group call_tir bindings into Primitive functions chosen by a cost model.

A drop-in replacement for ``relax.transform.FuseOps`` in a ``tvm.transform.Sequential``:
run it after ``LegalizeOps`` + ``AnnotateTIROpPattern`` and follow it with ``FuseTIR``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import tvm
from tvm import relax

from ..baseline import fuseops_groups
from ..cost_models.base import CostModel, get_cost_model
from ..cost_models.multi_point import MultiPointCostModel
from ..graph import build_fusion_graph, default_dims
from ..grouping import rewrite_block, vars_used_after
from ..hardware import HardwareSpec
from ..plan import BlockPlan, FusionPlan, count_kernels, group_plan, is_kernel
from ..presets import get_hardware
from ..search import SearchConfig, choose_partition, singletons
from ..shape_hints import check_names, representative, sample_points


def _fusable_functions(mod: tvm.IRModule) -> list[str]:
    names = []
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        attrs = func.attrs if func.attrs is not None else {}
        if "Primitive" in attrs or "Codegen" in attrs or "Composite" in attrs:
            continue
        names.append(gv.name_hint)
    return sorted(names)


@tvm.transform.module_pass(opt_level=0, name="FuseByCostModel")
class FuseByCostModel:
    """Search the partition with the least predicted time and materialise it.

    Parameters
    ----------
    cost_model : CostModel or str
        The injected cost model (or a registered name, built for ``hw``).
    hw : HardwareSpec or str, optional
        Hardware the model predicts for; defaults to the host CPU.
    backend : Backend, optional
        Target backend (template limits and rule names).
    config : SearchConfig, optional
        Search options.
    shape_hints : mapping, optional
        Expected values of symbolic dims: an int, a ``(lo, hi)`` range or a list of values
        per dim name; with ranges the plan is chosen over sample points of the range.
    compare_fuseops : bool
        Also price FuseOps's partition for the plan's predicted speedup.

    Attributes
    ----------
    plan : FusionPlan
        The plan of the last module transformed.
    """

    def __init__(
        self,
        cost_model: CostModel | str = "roofline",
        hw: HardwareSpec | str | None = None,
        backend=None,
        config: SearchConfig | None = None,
        shape_hints: Mapping[str, int] | None = None,
        compare_fuseops: bool = True,
    ):
        if isinstance(cost_model, CostModel):
            self.cost_model = cost_model
            self.hw = cost_model.hw
        else:
            self.hw = get_hardware(hw or "host")
            self.cost_model = get_cost_model(cost_model, self.hw, backend)
        self.backend = backend
        # The backend's template limits are capabilities: they override the config's.
        self.config = config or SearchConfig()
        if backend is not None:
            self.config = dataclasses.replace(self.config, limits=backend.template_limits)
        self.shape_hints = dict(shape_hints or {})
        self.compare_fuseops = compare_fuseops
        self.plan = FusionPlan()

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Fuse every dataflow block of every non-primitive Relax function."""
        start = time.perf_counter()
        funcs = _fusable_functions(mod)
        dims = default_dims(mod)
        check_names(self.shape_hints, set(dims))
        dims.update({k: representative(v) for k, v in self.shape_hints.items()})
        model = self.cost_model
        points = sample_points(self.shape_hints) if self.shape_hints else []
        if len(points) > 1:
            model = MultiPointCostModel(self.cost_model, [{**dims, **p} for p in points])
        plan = FusionPlan(
            target=str(getattr(self.backend, "name", "") or self.hw.target.get("kind", "")),
            hardware=self.hw.name,
            cost_model=model.name,
            dims=dims,
            cost_model_obj=model,
            limits=self.config.limits,
            kinds=self.config.kinds,
        )
        if len(points) > 1:
            plan.notes.append(f"plan chosen over {len(points)} sample points: {points}")
        unhinted = sorted(set(dims) - set(self.shape_hints))
        if unhinted:
            defaults = {k: dims[k] for k in unhinted}
            plan.notes.append(f"no hint for {unhinted}: defaults used {defaults}")
        baseline = {}
        if self.compare_fuseops:
            try:
                baseline = fuseops_groups(mod, funcs)
            except Exception as err:  # noqa: BLE001 - the baseline is informative only
                plan.notes.append(f"FuseOps baseline unavailable: {err}")
                baseline = None
        bb = relax.BlockBuilder(mod)
        info_cache: dict = {}
        new_funcs: dict[str, relax.Function] = {}
        search_s = 0.0
        fo_time = 0.0 if baseline is not None else None
        fo_kernels = 0 if baseline is not None else None
        for fi, fname in enumerate(funcs):
            func = mod[fname]
            if not isinstance(func.body, relax.SeqExpr):
                continue
            new_blocks = []
            for bi, block in enumerate(func.body.blocks):
                if not isinstance(block, relax.DataflowBlock):
                    new_blocks.append(block)
                    continue
                used_later = vars_used_after(func, bi)
                graph = build_fusion_graph(mod, block, used_later, dims, info_cache)
                graph.forbidden = [g for f, b, g in self.config.forbidden if (f, b) == (fname, bi)]
                fo_groups = None
                if baseline is not None:
                    fo_groups = _complete(baseline.get((fi, bi), []), len(graph.nodes))
                    fo_time += model.estimate_plan(graph, fo_groups)
                    fo_kernels += count_kernels(graph, fo_groups)
                t0 = time.perf_counter()
                prefer = next((s for f, b, s in self.config.sources if (f, b) == (fname, bi)),
                              None)
                choice = choose_partition(graph, model, self.config, fo_groups, prefer)
                search_s += time.perf_counter() - t0
                groups = choice.groups
                _note_choice(plan, fname, bi, choice)
                plan.blocks.append(BlockPlan(
                    fname, bi, groups, fo_groups, graph, choice.source, choice.time_s,
                    choice.runner_up, choice.runner_up_groups, choice.runner_up_time_s,
                ))
                plan.predicted_time_s += choice.time_s
                plan.unfused_time_s += model.estimate_plan(graph, singletons(graph))
                plan.num_kernels += count_kernels(graph, groups)
                plan.unfused_kernels += count_kernels(graph, singletons(graph))
                kernel_names: dict[frozenset[int], str] = {}
                dropped: list[frozenset[int]] = []
                new_blocks.append(
                    rewrite_block(bb, graph, block, groups, used_later, kernel_names, dropped)
                )
                _record_groups(plan, graph, groups, model, (fname, bi), kernel_names, dropped)
            new_func = relax.Function(
                func.params, relax.SeqExpr(new_blocks, func.body.body), func.ret_ty,
                func.is_pure, func.attrs, func.span,
            )
            new_funcs[fname] = new_func
        plan.fuseops_time_s = fo_time
        plan.fuseops_kernels = fo_kernels
        plan.search_time_s = search_s
        plan.notes.append(f"pass time {time.perf_counter() - start:.3f} s")
        self.plan = plan
        out = bb.get()
        funcs_out = {gv: new_funcs.get(gv.name_hint, f) for gv, f in out.functions.items()}
        out = tvm.IRModule(funcs_out, attrs=out.attrs, global_infos=out.global_infos)
        return relax.transform.Normalize()(out)


def _record_groups(plan: FusionPlan, graph, groups, model, where: tuple[str, int],
                   kernel_names: dict, dropped: list) -> None:
    """Add the kernels of one rewritten block to ``plan``; dead groups (dropped by the
    rewrite) are noted and not counted."""
    fname, bi = where
    for g in dropped:
        plan.num_kernels -= count_kernels(graph, [g])
        plan.notes.append(f"{fname} block {bi}: dead group of "
                          f"{[graph.nodes[i].name for i in sorted(g)]} dropped")
    for g in groups:
        if g in dropped or not is_kernel(graph, g):
            continue
        name = "+".join(graph.nodes[i].func_name for i in sorted(g))
        plan.groups.append(group_plan(graph, g, model, fname, name, bi, kernel_names.get(g, "")))


def _note_choice(plan: FusionPlan, fname: str, bi: int, choice) -> None:
    """Record a block where a partition other than the search's own was kept."""
    if choice.source != "search":
        plan.fallbacks.append({
            "function": fname, "block": bi, "source": choice.source,
            "predicted_s": choice.time_s, "search_predicted_s": choice.search_time_s,
        })


def _complete(groups: list[set[int]], n: int) -> list[frozenset[int]]:
    covered = set().union(*groups) if groups else set()
    return [frozenset(g) for g in groups] + [frozenset([i]) for i in range(n) if i not in covered]
