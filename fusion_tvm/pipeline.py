"""The full Relax pipeline with our fusion pass in place of FuseOps.

Phases (each a ``tvm.transform.Sequential``):

1. **prepare** — inference simplifications, legalization, op-pattern annotation;
2. **fuse** — ``FuseByCostModel`` (or FuseOps / nothing, for baselines) then ``FuseTIR``;
3. **schedule** — the target backend's rules (``ApplyTargetSchedule``), constant weights
   packed at compile time (``MarkConstantParams``, ``PrepackWeights``);
4. **lower** — the stock VM lowering (no further fusion).

Every front door (``compile``, ``tune``, the CLI's ``plan`` / ``explain``, the CUDA build,
the registered pipeline) resolves its target, backend and hardware spec once
(:func:`resolve`) and runs the phases through one runner, :func:`run_phases`: a fused
group that only the catch-all fallback rule could schedule is forbidden and the search
runs again, so the plan every door reports is the partition that is built.

``relax.register_pipeline("fusion_tvm")`` makes ``tvm.compile(mod, target,
relax_pipeline="fusion_tvm")`` use it; every factory argument has a default, and the
target is the one ``tvm.compile`` runs it under (``tvm.target.Target.current()``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import tvm
from tvm import relax

from .cost_models.base import CostModel, get_cost_model
from .errors import InvalidTargetError, UnknownNameError
from .hardware import HardwareSpec
from .legality import FusionKinds
from .origins import Origins, tracking
from .passes.apply_target_schedule import ApplyTargetSchedule
from .passes.combine_sibling_convs import CombineSiblingConvs
from .passes.combine_siblings import combine_siblings
from .passes.crop_conv_taps import CropConvTaps
from .passes.expand_small_powers import ExpandSmallPowers
from .passes.fast_math import FastMath
from .passes.fold_affine import FoldAffineIntoWeights
from .passes.fuse_by_cost_model import FuseByCostModel
from .passes.mark_constant_params import MarkConstantParams
from .passes.mark_noalias import MarkShapeFuncsNoAlias
from .passes.prebuild_kernels import prebuild_kernels
from .passes.prepack_weights import PrepackWeights
from .passes.sort_shape_func_stores import SortShapeFuncStores
from .passes.split_conv_regions import SplitConvRegions
from .passes.split_to_slices import SplitToSlices
from .plan import FusionPlan
from .presets import get_hardware, host_cpu_name, list_hardware
from .search import SearchConfig
from .targets.base import Backend, catch_all_names, get_backend
from .targets.schedule import applied_rules

#: Re-searches after scheduling feedback (each forbids the groups that fell back). A round
#: forbids those exact groups, and the search may offer a smaller one that falls back too:
#: YOLO11n's box head took 6 rounds, YOLOv8n's SPPF 8 (with 4, each kept one fallback
#: kernel: a multiply + max pool at 121 us against 28 predicted; 1.04 / 1.01 whole model).
FEEDBACK_ROUNDS = 8


class FusionMode(str, enum.Enum):
    """Which partition the pipeline builds."""

    COST = "cost"  # ours
    FUSEOPS = "fuseops"  # TVM's FuseOps (baseline)
    NONE = "none"  # one kernel per op


def fusion_mode(value: str | FusionMode) -> FusionMode:
    """Parse a fusion mode with a clear error."""
    try:
        return FusionMode(value)
    except ValueError as err:
        known = ", ".join(m.value for m in FusionMode)
        raise UnknownNameError(f"unknown fusion mode '{value}'; known: {known}") from err


def prepare_passes(
    backend: Backend | None = None,
    kinds: FusionKinds | None = None,
    hw: HardwareSpec | None = None,
) -> list[tvm.transform.Pass]:
    """Inference simplifications, the graph-level fusion kinds (BatchNorm folded into conv
    weights, sibling matmuls combined), legalization and annotation."""
    hw = hw or get_hardware("host")
    layout = list(backend.layout_passes(hw)) if backend is not None else []
    kinds = kinds or FusionKinds()
    fold = [relax.transform.FoldBatchnormToConv2D()] if kinds.weight_folding else []
    fold_affine = [FoldAffineIntoWeights()] if kinds.weight_folding else []
    siblings = [combine_siblings(hw), CombineSiblingConvs(hw, backend)] if kinds.siblings else []
    use_fast = backend.fast_math if backend is not None else True
    fast_math = [FastMath()] if use_fast else []
    return [
        # sort / scan / sampling ops get their library implementations (as tvm.compile does)
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        *fold,
        relax.transform.DecomposeOpsForInference(),
        *fold_affine,  # per-channel scale / shift chains into matmul and conv weights
        CropConvTaps(),  # taps that only read padding (large dilations) dropped
        *siblings,
        SplitConvRegions(),  # convs whose taps mostly read padding: one conv per region
        SplitToSlices(),
        ExpandSmallPowers(),  # x**2, x**3 as multiplies (powf is a scalar libm call)
        relax.transform.CanonicalizeBindings(),
        *layout,
        # vectorisable exp / erf / tanh (polynomial, ~1e-7 relative error) instead of
        # scalar libm calls: softmax and GELU epilogues run ~10-30x faster on CPU
        *fast_math,
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.DeadCodeElimination(),
    ]


def lower_passes() -> list[tvm.transform.Pass]:
    """Stock VM lowering, as in TVM's CPU pipeline, minus fusion."""
    t = relax.transform
    return [
        t.RewriteDataflowReshape(),
        t.ToNonDataflow(),
        t.RemovePurityChecking(),
        t.CallTIRRewrite(),
        t.StaticPlanBlockMemory(),
        t.LowerAllocTensor(),
        t.KillAfterLastUse(),
        t.LowerRuntimeBuiltin(),
        t.ComputePrimValue(),
        t.VMShapeLower(),
        MarkShapeFuncsNoAlias(),  # else the whole LLVM module loses alias info
        t.AttachGlobalSymbol(),
        SortShapeFuncStores(),  # VMShapeLower's store order follows addresses
    ]


@dataclass
class PipelineParts:
    """The phases of one configured pipeline, kept apart so callers can inspect between."""

    prepare: tvm.transform.Pass
    fuse: tvm.transform.Pass
    schedule: tvm.transform.Pass
    lower: tvm.transform.Pass
    fuse_pass: FuseByCostModel | None
    target: tvm.target.Target
    hw: HardwareSpec
    backend: Backend


@dataclass(frozen=True)
class Resolved:
    """The target of one front-door call, resolved once and handed down.

    Attributes
    ----------
    backend : Backend
    hw : HardwareSpec
    target : tvm.target.Target
        The TVM target the schedule rules size for and the build compiles for.
    """

    backend: Backend
    hw: HardwareSpec
    target: tvm.target.Target


def parse_target(target):
    """A TVM ``Target`` for a JSON target dict (or its JSON text, as the CLI passes it);
    other values (names, backends, targets, None) unchanged. Malformed ones raise
    :class:`InvalidTargetError`."""
    if isinstance(target, str) and target.lstrip().startswith("{"):
        try:
            target = json.loads(target)
        except json.JSONDecodeError as err:
            raise InvalidTargetError(f"target {target!r} is not valid JSON: {err}") from None
    if isinstance(target, Mapping):
        try:
            return tvm.target.Target(dict(target))
        except Exception as err:  # noqa: BLE001 - TVM reports bad targets as assorted errors
            lines = str(err).strip().splitlines() or [type(err).__name__]
            raise InvalidTargetError(f"invalid target {dict(target)}: {lines[-1]}") from None
    return target


def backend_name(target) -> str:
    """The fusion_tvm backend a target (name, JSON dict, TVM ``Target``) runs on."""
    target = parse_target(target)
    if isinstance(target, tvm.target.Target):
        return _backend_of(target, None)[0]
    return get_backend(target if target is not None else "llvm").name


def resolve(target: str | Mapping | Backend | tvm.target.Target | Resolved | None = None,
            hw: str | HardwareSpec | None = None) -> Resolved:
    """Backend, hardware spec and TVM target from what a user names.

    ``target`` is a backend name (``"llvm"``, ``"cuda"``, ``"hls"``), a :class:`Backend`,
    a TVM ``Target`` or its JSON dict: ``{"kind": "cuda", "arch": "sm_90"}`` is the CUDA
    backend with the GPU preset of that arch unless ``hw`` names one;
    ``{"kind": "llvm", "mcpu": "znver4"}`` builds for that CPU, with the preset of that
    CPU (the host's when it is the host's) unless ``hw`` names one. An llvm target that
    names no CPU gets the host's (generic x86-64 code runs fp16 ~100x slower). None is the
    host CPU.
    """
    if isinstance(target, Resolved):
        return target
    target = parse_target(target)
    user_target = None
    if isinstance(target, tvm.target.Target):
        user_target = target
        target, hw = _backend_of(target, hw)
    backend = get_backend(target if target is not None else "llvm")
    spec = get_hardware(hw if hw is not None else backend.default_hardware)
    tvm_target = backend.target(spec)
    if user_target is not None and "mcpu" in user_target.attrs and backend.name == "llvm":
        tvm_target = user_target
    return Resolved(backend, spec, tvm_target)


def _cpu_preset(mcpu: str) -> str | None:
    """The hardware preset of a CPU named by LLVM's mcpu: the host when it is the host's,
    else a preset built for it; None when none is."""
    if mcpu == host_cpu_name():
        return "host"
    for name in list_hardware():
        if name == "host":
            continue
        spec = get_hardware(name)
        if spec.kind.value == "cpu" and dict(spec.target).get("mcpu") == mcpu:
            return name
    return None


def _backend_of(target: tvm.target.Target, hw) -> tuple[str, str | HardwareSpec | None]:
    """The backend name a TVM target's kind maps to, and ``hw`` (for a CUDA target named
    by arch alone: the GPU preset of that arch, when there is one; for an llvm target
    with an mcpu: the preset of that CPU)."""
    kind = target.kind.name
    if kind in ("llvm", "c"):
        if hw is None and "mcpu" in target.attrs:
            mcpu = str(target.attrs["mcpu"])
            hw = _cpu_preset(mcpu)
            if hw is None:
                warnings.warn(
                    f"fusion_tvm: no hardware preset for mcpu '{mcpu}': code is built for it "
                    f"but priced with this host's spec (pass hw= a preset or a HardwareSpec "
                    f"of that CPU)", stacklevel=3)
        return "llvm", hw
    if kind != "cuda":
        raise InvalidTargetError(
            f"target kind '{kind}' has no fusion_tvm backend; use an llvm or cuda target")
    arch = str(target.attrs["arch"]) if "arch" in target.attrs else ""
    if hw is None and arch:
        gpus = {name: get_hardware(name).gpu for name in list_hardware()}
        hw = next((name for name, gpu in gpus.items() if gpu and gpu.arch == arch), None)
    return "cuda", hw


def make_pipeline(
    target: str | Backend | Resolved = "llvm",
    hw: str | HardwareSpec | None = None,
    fusion: str | FusionMode = FusionMode.COST,
    schedule: bool = True,
    cost_model: str | CostModel | None = None,
    shape_hints: Mapping[str, int] | None = None,
    config: SearchConfig | None = None,
    database=None,
) -> PipelineParts:
    """Configure the pipeline's phases for a target (``database``: tuned knob values,
    a :class:`~fusion_tvm.tuning_db.TuningDatabase` or its file)."""
    resolved = resolve(target, hw)
    backend, hw = resolved.backend, resolved.hw
    mode = fusion_mode(fusion)
    fuse_pass = None
    if mode is FusionMode.COST:
        model = get_cost_model(cost_model or backend.default_cost_model, hw, backend)
        fuse_pass = FuseByCostModel(
            model, backend=backend, config=config, shape_hints=shape_hints
        )
        fuse = [fuse_pass, relax.transform.FuseTIR()]
    elif mode is FusionMode.FUSEOPS:
        fuse = [relax.transform.FuseOps(), relax.transform.FuseTIR()]
    else:
        fuse = []
    # Rules learn which inputs are constants; packing stages of constants then run once,
    # here, instead of on every call.
    sched = (
        [MarkConstantParams(), ApplyTargetSchedule(backend, hw, database), PrepackWeights()]
        if schedule
        else []
    )
    return PipelineParts(
        prepare=tvm.transform.Sequential(
            prepare_passes(backend, (config or SearchConfig()).kinds, hw),
            name="fusion_tvm.prepare",
        ),
        fuse=tvm.transform.Sequential(
            fuse + [relax.transform.DeadCodeElimination()], name="fusion_tvm.fuse"
        ),
        schedule=tvm.transform.Sequential(sched, name="fusion_tvm.schedule"),
        lower=tvm.transform.Sequential(lower_passes(), name="fusion_tvm.lower"),
        fuse_pass=fuse_pass,
        target=resolved.target,
        hw=hw,
        backend=backend,
    )


@dataclass
class PhaseResult:
    """What :func:`run_phases` produced.

    Attributes
    ----------
    parts : PipelineParts
        The phases of the last round (its ``lower`` phase builds the module).
    fused : IRModule
        After fusion (FuseTIR), before scheduling.
    mod : IRModule
        After scheduling (``fused`` when scheduling is off).
    plan : FusionPlan or None
        The cost-model plan of the partition in ``mod``, each group's ``scheduled_rule``
        recorded; None unless ``fusion="cost"``.
    prepared : IRModule or None
        Before fusion (the module the plan's block graphs were built from).
    origins : dict of relax.Var to tuple of str
        The ONNX node(s) each binding of ``prepared`` came from (empty when the model
        named none): what the plan's ops show (:mod:`fusion_tvm.origins`).
    """

    parts: PipelineParts
    fused: tvm.IRModule
    mod: tvm.IRModule
    plan: FusionPlan | None
    prepared: tvm.IRModule | None = None
    origins: Origins = dataclasses.field(default_factory=dict)


def run_phases(
    mod: tvm.IRModule,
    resolved: Resolved,
    fusion: str | FusionMode = FusionMode.COST,
    schedule: bool = True,
    cost_model: str | CostModel | None = None,
    shape_hints: Mapping[str, int] | None = None,
    config: SearchConfig | None = None,
    database=None,
    feedback_rounds: int = FEEDBACK_ROUNDS,
    prepared: tvm.IRModule | None = None,
    origins: Mapping[relax.Var, tuple[str, ...]] | None = None,
) -> PhaseResult:
    """Prepare, fuse and schedule ``mod`` for ``resolved``: the one phase runner.

    With scheduling on, a fused group that only the fallback rule could schedule is
    forbidden and the search runs again (``feedback_rounds`` at most), so the plan is the
    partition that is built. ``prepared``: the ``prepared`` module of an earlier result for
    the same model, target and fusion kinds, fused again without preparing again (measured
    decisions re-run the search only). ``origins``: the ONNX node(s) of each binding
    (:attr:`LoadedModel.origins <fusion_tvm.frontend.LoadedModel.origins>`; with
    ``prepared``, the earlier result's ``origins``), carried through the passes onto the
    plan's ops. Other arguments as :func:`make_pipeline`.
    """

    def make(cfg):
        return make_pipeline(resolved, fusion=fusion, schedule=schedule, cost_model=cost_model,
                             shape_hints=shape_hints, config=cfg, database=database)

    parts = make(config)
    catch_all = catch_all_names(parts.backend.schedule_rules(parts.hw))
    notes = []
    with parts.target:
        if prepared is None:
            with tracking(mod, origins) as tracker:
                prepared = parts.prepare(mod)
            if tracker is not None:
                origins = tracker.result(prepared)
                if tracker.error:
                    notes.append(f"ONNX node names lost in the passes ({tracker.error})")
        fused = parts.fuse(prepared)
        scheduled = parts.schedule(fused)
        cfg = config or SearchConfig()
        for _ in range(feedback_rounds):
            if parts.fuse_pass is None or not schedule:
                break
            failed = fallback_groups(scheduled, parts.fuse_pass.plan, catch_all)
            if not failed:
                break
            cfg = dataclasses.replace(cfg, forbidden=cfg.forbidden + tuple(failed))
            parts = make(cfg)
            fused = parts.fuse(prepared)
            scheduled = parts.schedule(fused)
    plan = parts.fuse_pass.plan if parts.fuse_pass is not None else None
    record_rules(scheduled, plan)
    if plan is not None:
        plan.set_origins(origins or {})
        plan.notes.extend(notes)
    return PhaseResult(parts, fused, scheduled, plan, prepared, dict(origins or {}))


def fallback_groups(mod: tvm.IRModule, plan: FusionPlan, catch_all: frozenset[str]
                    ) -> list[tuple[str, int, frozenset]]:
    """Multi-op groups of ``plan`` whose PrimFunc only a catch-all rule (``catch_all``:
    their names) scheduled."""
    fell_back = {name for name, rule in applied_rules(mod).items() if rule in catch_all}
    return [
        (g.function, g.block_index, frozenset(g.node_ids))
        for g in plan.groups
        if len(g.node_ids) > 1 and g.kernel in fell_back
    ]


def record_rules(mod: tvm.IRModule, plan: FusionPlan | None) -> None:
    """Set each group's ``scheduled_rule`` to the schedule rule that ran its kernel.

    ``rule`` is the rule class the cost model priced before scheduling (``matmul`` for an
    attention chain the CPU model prices as its contractions, say); ``scheduled_rule`` is
    the name the target's rule wrote on the PrimFunc (``flash_attention``, ``staged_chain``).
    """
    if plan is None:
        return
    applied = applied_rules(mod)
    for g in plan.groups:
        if g.kernel in applied:
            g.scheduled_rule = applied[g.kernel]


def build_pipeline(
    target: str | Backend | tvm.target.Target | None = None,
    hw: str | HardwareSpec | None = None,
    fusion: str | FusionMode = FusionMode.COST,
    schedule: bool = True,
    cost_model: str | CostModel | None = None,
    shape_hints: Mapping[str, int] | None = None,
    config: SearchConfig | None = None,
    database=None,
) -> tvm.transform.Pass:
    """The whole pipeline as one pass: :func:`run_phases`, then the VM lowering.

    With ``target`` None the pass follows the target it runs under
    (``tvm.target.Target.current()``, as ``tvm.compile`` sets it), else the host CPU.
    """

    @tvm.transform.module_pass(opt_level=0, name="fusion_tvm.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        chosen = target if target is not None else tvm.target.Target.current(allow_none=True)
        resolved = resolve(chosen, hw)
        result = run_phases(mod, resolved, fusion=fusion, schedule=schedule,
                            cost_model=cost_model, shape_hints=shape_hints, config=config,
                            database=database)
        with result.parts.target:
            lowered = result.parts.lower(result.mod)
        current = tvm.target.Target.current(allow_none=True)
        if _names_no_cpu(current) and resolved.backend.name == "llvm":
            # tvm.compile would generate generic code for its own target after this pass
            warnings.warn(
                f"fusion_tvm: target {str(current)!r} names no CPU: kernels are built for "
                f"the host's ({resolved.target.attrs.get('mcpu', '')})", stacklevel=2)
            lowered = prebuild_kernels(lowered, resolved.target)
        return lowered

    return _pipeline


def _names_no_cpu(target) -> bool:
    """An llvm TVM target without an mcpu (``tvm.compile(mod, "llvm")``)."""
    return (isinstance(target, tvm.target.Target) and target.kind.name == "llvm"
            and "mcpu" not in target.attrs)


def host_target() -> tvm.target.Target:
    """The TVM target of this machine's CPU (LLVM's mcpu of the host, its cores), for
    ``tvm.compile(mod, fusion_tvm.host_target(), relax_pipeline="fusion_tvm")``."""
    return get_backend("llvm").target(get_hardware("host"))


def _registered_pipeline(
    target: str | None = None,
    hw: str | HardwareSpec | None = None,
    fusion: str = "cost",
    schedule: bool = True,
    cost_model: str | None = None,
    shape_hints: Mapping[str, int] | None = None,
) -> tvm.transform.Pass:
    return build_pipeline(
        target=target, hw=hw, fusion=fusion, schedule=schedule, cost_model=cost_model,
        shape_hints=shape_hints,
    )


if "fusion_tvm" not in relax.pipeline.PIPELINE_MAP:
    relax.register_pipeline("fusion_tvm")(_registered_pipeline)
