"""Measured search over the schedule rules' knobs, kernel by kernel.

For every distinct fused kernel of a model the tuner asks the rule that schedules it for its
knobs (:meth:`~fusion_tvm.targets.base.ScheduleRule.knobs`), builds the rule's own choice and
up to ``trials`` other candidates (the derived value of each knob first, the rest sampled
from the knobs' product), times each alone on random inputs, and keeps the fastest in the
database when it beats the default by ``margin``. A candidate whose outputs differ from
the default schedule's is refused, so a tuned build computes what the default build does.
Kernels whose constant weights are packed at compile time are timed without the packing,
as they run in the model.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import tirx

from ..calibration._timing import Runner, TimingConfig
from ..calibration.kernels import concrete_shape, prim_inputs
from ..passes.apply_target_schedule import KNOBS_ATTR, RULE_ATTR, is_scheduled, schedule_primfunc
from ..passes.mark_constant_params import MarkConstantParams
from ..passes.prepack_weights import split_prepack
from ..tuning_db import TuningDatabase, TuningRecord, target_key, workload_key

logger = logging.getLogger(__name__)


@dataclass
class TunedKernel:
    """What the tuner did with one kernel."""

    name: str
    rule: str
    default_us: float
    best_us: float
    knobs: dict
    trials: int
    status: str = "tuned"  # or "kept" (no candidate beat the default), "skipped: why"

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0


@dataclass
class TuningReport:
    """The kernels tuned in one :func:`tune` call."""

    kernels: list[TunedKernel] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        """A text table: kernel, rule, default and best time, knobs."""
        lines = [f"{'kernel':44} {'rule':13} {'default us':>10} {'best us':>9} {'x':>5}  knobs"]
        for k in self.kernels:
            if k.status.startswith("skipped"):
                lines.append(f"{k.name[:44]:44} {k.rule:13} {k.status}")
                continue
            knobs = ", ".join(f"{n}={v}" for n, v in k.knobs.items()) or "(default)"
            lines.append(f"{k.name[:44]:44} {k.rule:13} {k.default_us:10.1f} {k.best_us:9.1f} "
                         f"{k.speedup:5.2f}  {knobs}")
        return "\n".join(lines)


def _candidates(space: Mapping[str, tuple], trials: int, seed: int) -> list[dict]:
    """Up to ``trials`` knob assignments other than the all-default one, the one-knob
    changes first, then a sample of the rest of the product."""
    names = list(space)
    default = {n: space[n][0] for n in names}
    single = [{**default, n: v} for n in names for v in space[n][1:]]
    rest = [dict(zip(names, combo, strict=True)) for combo in itertools.product(
        *(space[n] for n in names))]
    rest = [c for c in rest if c != default and c not in single]
    rng = np.random.default_rng(seed)
    rng.shuffle(rest)
    return (single + rest)[:trials]


class _Bench:
    """Random inputs for one kernel; builds scheduled versions of it (the compile-time
    packing split off and run once, as in the model) and times them."""

    def __init__(self, runner: Runner, func: tirx.PrimFunc, dims: Mapping[str, int],
                 seed: int = 0):
        self.runner = runner
        self.dims = dims
        self.inputs = prim_inputs(func, np.random.default_rng(seed), dims)

    def build(self, scheduled: tirx.PrimFunc) -> tuple:
        """``(module, args, outputs)``: the built kernel, its arguments (packed where the
        kernel reads a packed constant) and the arrays after one call."""
        split = split_prepack(scheduled)
        stages, kernel = split if split is not None else ([], scheduled)
        funcs = {"main": kernel.with_attr("global_symbol", "main")}
        for i, (_, pack) in enumerate(stages):
            funcs[f"pack_{i}"] = pack.with_attr("global_symbol", f"pack_{i}")
        module = self.runner.build_prim(tvm.IRModule(funcs))
        args = [a if isinstance(a, int) else self.runner.tensor(a) for a in self.inputs]
        for i, (index, pack) in enumerate(stages):
            dst = pack.params[1]
            packed = self.runner.tensor(
                np.zeros(concrete_shape(dst, self.dims), dtype=str(dst.dtype)))
            module[f"pack_{i}"](args[index], packed)
            args[index] = packed
        module["main"](*args)
        outputs = [a.numpy() for a, orig in zip(args, self.inputs, strict=True)
                   if not isinstance(orig, int) and a.shape == orig.shape]
        return module, args, outputs

    def time(self, built: tuple) -> float:
        """Seconds per call of a kernel from :meth:`build`."""
        module, args, _ = built
        return self.runner.time_prim(module, args)


def _same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.dtype.kind == "f":
            if not np.allclose(x, y, rtol=1e-3, atol=1e-4, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def tune_module(
    mod: tvm.IRModule,
    backend,
    hw,
    database: TuningDatabase,
    trials: int = 16,
    dims: Mapping[str, int] | None = None,
    margin: float = 0.05,
    timing: TimingConfig | None = None,
    names: Callable[[str], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> TuningReport:
    """Tune every unscheduled PrimFunc of ``mod`` (after fusion) into ``database``.

    Parameters
    ----------
    mod : tvm.IRModule
        Fused module before the schedule phase (``MarkConstantParams`` is applied here).
    backend, hw
        The target backend and its hardware spec (as the pipeline's parts hold them).
    database : TuningDatabase
        Receives one record per tuned kernel (the default kept is recorded as well).
    trials : int
        Candidates measured per kernel besides the default.
    dims : mapping, optional
        Values of symbolic dims for the timing inputs (``{"S": 128}``).
    margin : float
        A candidate must beat the default by this fraction to be kept.
    names : callable, optional
        Filter on kernel names (tune only some).
    log : callable, optional
        Receives one line per kernel.
    """
    start = time.perf_counter()
    dims = dict(dims or {})
    target = backend.target(hw)
    key_target = target_key(target)
    runner = Runner(target, timing or TimingConfig.quick())
    rules = list(backend.schedule_rules(hw))
    report = TuningReport()
    seen: set[str] = set()
    with target:
        mod = MarkConstantParams()(mod)
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
            continue
        name = gv.name_hint
        key = workload_key(func)
        if key in seen or (names is not None and not names(name)):
            continue
        seen.add(key)
        default = schedule_primfunc(func, rules, target, hw)
        if default is None:
            continue
        rule = next(r for r in rules if r.name == str(default.attrs[RULE_ATTR]))
        space = rule.knobs(func, target, hw)
        if not space or all(len(v) < 2 for v in space.values()):
            continue
        try:
            bench = _Bench(runner, func, dims)
        except ValueError as err:
            report.kernels.append(TunedKernel(name, rule.name, 0, 0, {}, 0, f"skipped: {err}"))
            continue
        default_built = bench.build(default)
        default_s = bench.time(default_built)
        best_s, best, best_built = default_s, {}, None
        measured = 0
        for knobs in _candidates(space, trials, seed=len(seen)):
            # As the pipeline schedules a recorded kernel; without the knobs applied (the
            # rule refused them) there is nothing to measure.
            candidate = schedule_primfunc(func, [rule], target, hw, (rule.name, knobs))
            if candidate is None or KNOBS_ATTR not in candidate.attrs:
                continue
            try:
                built = bench.build(candidate)
            except Exception as err:  # noqa: BLE001 - a combination the build refuses
                logger.debug("%s %s: %s", name, knobs, err)
                continue
            measured += 1
            if not _same(built[2], default_built[2]):
                logger.warning("%s: knobs %s change the results; refused", name, knobs)
                continue
            seconds = bench.time(built)
            if seconds < best_s:
                best_s, best, best_built = seconds, knobs, built
        if best:
            # Confirm against the winner's curse: time both again, interleaved.
            again_d, again_b = [default_s], [best_s]
            for _ in range(2):
                again_d.append(bench.time(default_built))
                again_b.append(bench.time(best_built))
            default_s, best_s = float(np.median(again_d)), float(np.median(again_b))
            if best_s > default_s * (1 - margin):
                best_s, best = default_s, {}
        status = "tuned" if best else "kept"
        tuned = TunedKernel(name, rule.name, default_s * 1e6, best_s * 1e6, best, measured,
                            status)
        report.kernels.append(tuned)
        database.commit(TuningRecord(key, key_target, rule.name, best, default_s * 1e6,
                                     best_s * 1e6, name, measured))
        if log is not None:
            log(f"{name}: {rule.name} {tuned.default_us:.1f} -> {tuned.best_us:.1f} us "
                f"({measured} candidates) {best or '(default kept)'}")
    report.seconds = time.perf_counter() - start
    return report
