"""ApplyTargetSchedule: schedule every PrimFunc with the target backend's rules."""

from __future__ import annotations

import tvm
from tvm import tirx

from ..attrs import KNOBS_ATTR, RULE_ATTR, SCHEDULED_ATTR
from ..hardware import HardwareSpec
from ..presets import get_hardware
from ..targets.base import Backend, get_backend
from ..targets.schedule import is_scheduled, schedule_primfunc
from ..tuning_db import TuningDatabase

__all__ = ["KNOBS_ATTR", "RULE_ATTR", "SCHEDULED_ATTR", "ApplyTargetSchedule", "is_scheduled",
           "schedule_primfunc"]

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
