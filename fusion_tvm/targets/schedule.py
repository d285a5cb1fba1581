"""The schedule-rule driver: try a target's rules in order on a PrimFunc, first match wins.

:class:`~fusion_tvm.passes.apply_target_schedule.ApplyTargetSchedule` runs it over a
module; a rule that schedules a kernel in parts (the staged chain) runs it on each part.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tvm
from tvm import tirx

from ..attrs import KNOBS_ATTR, RULE_ATTR, SCHEDULED_ATTR
from ..hardware import HardwareSpec
from .base import ScheduleRule

logger = logging.getLogger(__name__)

def applied_rules(mod: tvm.IRModule) -> dict[str, str]:
    """PrimFunc name -> the schedule rule that scheduled it (unscheduled ones left out)."""
    out = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None:
            rule = func.attrs.get(RULE_ATTR, None)
            if rule is not None:
                out[gvar.name_hint] = str(rule)
    return out


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
