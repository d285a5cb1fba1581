"""Optional tuning: measure the schedule rules' knobs into a database the user keeps.

>>> report = fusion_tvm.tune("model.onnx", "model.tuning.json")
>>> cm = fusion_tvm.compile("model.onnx", tuning_db="model.tuning.json")

The default path never needs it: every rule derives its knobs from the hardware spec.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..tuning_db import TuningDatabase, TuningRecord, workload_key
from .tuner import TunedKernel, TuningReport, tune_module


def tune(
    model: Any,
    database: str | os.PathLike | TuningDatabase,
    target: str | None = None,
    hw=None,
    trials: int = 16,
    cost_model: str | None = None,
    shape_hints: Mapping[str, int] | None = None,
    shape_dict: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, int] | None = None,
    search=None,
    timing=None,
    log: Callable[[str], None] | None = None,
) -> TuningReport:
    """Tune the kernels of ``model``'s fused build and save the knob values to ``database``.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto or tvm.IRModule
        The model, as :func:`fusion_tvm.compile` takes it.
    database : str, os.PathLike or TuningDatabase
        The database (a JSON file, created when missing, records added or improved).
    target, hw, cost_model, shape_hints, shape_dict, search
        As for :func:`fusion_tvm.compile`: the build whose kernels are tuned.
    trials : int
        Candidates measured per kernel besides the rule's own choice.
    dims : mapping, optional
        Values of symbolic dims for the timing inputs; ``shape_hints`` values by default.
    timing : TimingConfig, optional
        How each candidate is timed.
    log : callable, optional
        Receives one line per kernel.

    Returns
    -------
    TuningReport
    """
    from ..frontend import load_model
    from ..pipeline import resolve, run_phases

    db = database if isinstance(database, TuningDatabase) else TuningDatabase(database)
    loaded = load_model(model, shape_dict=shape_dict)
    result = run_phases(loaded.mod, resolve(target, hw), cost_model=cost_model,
                        shape_hints=shape_hints, config=search)
    parts, fused = result.parts, result.fused
    if dims is None:
        dims = {k: int(v) for k, v in (shape_hints or {}).items() if isinstance(v, int)}
    report = tune_module(fused, parts.backend, parts.hw, db, trials=trials, dims=dims,
                         timing=timing, log=log)
    if db.path is not None:
        db.save()
    return report


__all__ = [
    "TunedKernel", "TuningDatabase", "TuningRecord", "TuningReport", "tune", "tune_module",
    "workload_key",
]
