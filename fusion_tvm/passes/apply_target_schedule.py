"""ApplyTargetSchedule: schedule every PrimFunc with the target backend's rules."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tvm
from tvm import tirx

from ..cost_models.hardware import HardwareSpec
from ..cost_models.presets import get_hardware
from ..targets.base import Backend, ScheduleRule, get_backend

logger = logging.getLogger(__name__)

#: Attribute naming the rule that scheduled a PrimFunc.
RULE_ATTR = "fusion_tvm.rule"
SCHEDULED_ATTR = "tirx.is_scheduled"
#: Attribute holding the tuned knob values a PrimFunc was scheduled with.
KNOBS_ATTR = "fusion_tvm.knobs"


def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` carries ``tirx.is_scheduled`` = true."""
    return func.attrs is not None and bool(func.attrs.get(SCHEDULED_ATTR, False))


def schedule_primfunc(
    func: tirx.PrimFunc,
    rules: Sequence[ScheduleRule],
    target: tvm.target.Target,
    hw: HardwareSpec,
    knobs: tuple[str, dict] | None = None,
) -> tirx.PrimFunc | None:
    """Try ``rules`` in order on ``func``; the first schedule returned wins.

    A rule that raises is logged and skipped, so a bug in one template costs speed,
    never the build. ``knobs`` = ``(rule name, values)`` (a tuning record) is tried first
    with that rule. Returns the scheduled function with ``tirx.is_scheduled`` and
    ``fusion_tvm.rule`` set (and ``fusion_tvm.knobs`` when tuned values were used), or
    None when no rule matched.
    """
    attempts = [(rule, None) for rule in rules]
    if knobs is not None:
        attempts = [(r, dict(knobs[1])) for r in rules if r.name == knobs[0]] + attempts
    for rule, values in attempts:
        try:
            sch = (rule.apply(func, target, hw) if values is None
                   else rule.apply(func, target, hw, knobs=values))
        except Exception as err:  # noqa: BLE001 - any failure means "try the next rule"
            logger.debug("schedule rule %s failed: %s", rule.name, err)
            continue
        if sch is None:
            continue
        scheduled = sch.mod["main"]
        if values is not None:
            scheduled = scheduled.with_attr(KNOBS_ATTR, values)
        # Keep the caller-visible attrs (global_symbol, noalias, ...) of the original.
        if func.attrs is not None:
            for key, value in func.attrs.items():
                if scheduled.attrs is None or key not in scheduled.attrs:
                    scheduled = scheduled.with_attr(key, value)
        scheduled = scheduled.with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, rule.name)
        return scheduled
    return None


@tvm.transform.module_pass(opt_level=0, name="ApplyTargetSchedule")
class ApplyTargetSchedule:
    """Schedule each not-yet-scheduled PrimFunc with the backend's rules (first match wins).

    Parameters
    ----------
    backend : str or Backend
        The target backend (``"llvm"``...) whose ``schedule_rules`` are applied.
    hw : str or HardwareSpec, optional
        Hardware the templates size their tiles for; the backend's default if None.
    database : TuningDatabase, str or os.PathLike, optional
        Tuned knob values (:mod:`fusion_tvm.tuning`): a function with a record for this
        target is scheduled by the recorded rule with the recorded knobs.

    Notes
    -----
    The input module is never mutated: a new module holds the scheduled functions.
    Whether a function fits the backend's target is checked here, once, not by the rules:
    a PrimFunc whose ``target`` attribute names another target kind is left alone.
    """

    def __init__(self, backend: str | Backend = "llvm", hw: str | HardwareSpec | None = None,
                 database=None):
        from ..tuning.database import TuningDatabase

        self.database = TuningDatabase.of(database)
        self.backend = get_backend(backend)
        self.hw = get_hardware(hw if hw is not None else self.backend.default_hardware)
        self.target = self.backend.target(self.hw)
        self.rules = list(self.backend.schedule_rules(self.hw))

    def _fits(self, func: tirx.PrimFunc) -> bool:
        own = func.attrs.get("target") if func.attrs is not None else None
        return own is None or own.kind.name == self.target.kind.name

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Return a copy of ``mod`` with every schedulable PrimFunc scheduled."""
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func) or not self._fits(func):
                continue
            record = self.database.lookup(func, self.target) if self.database else None
            knobs = (record.rule, record.knobs) if record is not None else None
            scheduled = schedule_primfunc(func, self.rules, self.target, self.hw, knobs)
            if scheduled is not None:
                updates[gvar] = scheduled
        if not updates:
            return mod
        functions = {gvar: updates.get(gvar, func) for gvar, func in mod.functions_items()}
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
