"""The full Relax pipeline with our fusion pass in place of FuseOps.

Phases (each a ``tvm.transform.Sequential``):

1. **prepare** — inference simplifications, legalization, op-pattern annotation;
2. **fuse** — ``FuseByCostModel`` (or FuseOps / nothing, for baselines) then ``FuseTIR``;
3. **schedule** — the target backend's rules (``ApplyTargetSchedule``), constant weights
   packed at compile time (``MarkConstantParams``, ``PrepackWeights``);
4. **lower** — the stock VM lowering (no further fusion).

``relax.register_pipeline("fusion_tvm")`` makes ``tvm.compile(mod, target,
relax_pipeline="fusion_tvm")`` use it; every factory argument has a default.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import tvm
from tvm import relax

from .cost_models.base import CostModel, get_cost_model
from .cost_models.hardware import HardwareSpec
from .cost_models.presets import get_hardware
from .errors import UnknownNameError
from .legality import FusionKinds
from .passes.combine_sibling_convs import CombineSiblingConvs
from .passes.combine_siblings import combine_siblings
from .passes.expand_small_powers import ExpandSmallPowers
from .passes.fast_math import FastMath
from .passes.fold_affine import FoldAffineIntoWeights
from .passes.fuse_by_cost_model import FuseByCostModel
from .passes.mark_constant_params import MarkConstantParams
from .passes.mark_noalias import MarkShapeFuncsNoAlias
from .passes.prepack_weights import PrepackWeights
from .passes.sort_shape_func_stores import SortShapeFuncStores
from .passes.split_to_slices import SplitToSlices
from .search import SearchConfig
from .targets.base import Backend, get_backend


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
        *siblings,
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


def make_pipeline(
    target: str | Backend = "llvm",
    hw: str | HardwareSpec | None = None,
    fusion: str | FusionMode = FusionMode.COST,
    schedule: bool = True,
    cost_model: str | CostModel | None = None,
    shape_hints: Mapping[str, int] | None = None,
    config: SearchConfig | None = None,
    database=None,
) -> PipelineParts:
    """Configure the pipeline's phases for a target (``database``: tuned knob values,
    a :class:`~fusion_tvm.tuning.database.TuningDatabase` or its file)."""
    backend = get_backend(target)
    hw = get_hardware(hw if hw is not None else backend.default_hardware)
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
    from .passes.apply_target_schedule import ApplyTargetSchedule

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
        target=backend.target(hw),
        hw=hw,
        backend=backend,
    )


def build_pipeline(**kwargs) -> tvm.transform.Pass:
    """The whole pipeline as one pass (arguments as :func:`make_pipeline`)."""
    parts = make_pipeline(**kwargs)
    seq = tvm.transform.Sequential(
        [parts.prepare, parts.fuse, parts.schedule, parts.lower], name="fusion_tvm"
    )

    @tvm.transform.module_pass(opt_level=0, name="fusion_tvm.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with parts.target:
            return seq(mod)

    return _pipeline


def _registered_pipeline(
    target: str = "llvm",
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
