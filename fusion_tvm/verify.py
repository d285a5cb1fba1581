"""Measured decisions where the cost model cannot tell: ``compile(..., verify="measure")``.

For every dataflow block :func:`~fusion_tvm.search.choose_partition` keeps the predicted
faster of its candidates (the search's partition, FuseOps's merged further, unfused). Where
the kept one is predicted to save less than :data:`VERIFY_BAND` of the runner-up's time,
the model's own error could reverse the decision; ``verify="measure"`` then builds the model
with the runner-up and times both builds on the device (the host CPU for ``llvm``), keeps
the faster and records both times in the plan (``plan.verified``, one line per block in
``plan.table()``) and in the tuning database, keyed by the block's structure
(:func:`~fusion_tvm.tuning_db.block_key`), the target and the hardware spec: the next compile
with the same database reads the decision and times nothing.

Granularity: all uncertain blocks are flipped together, the whole model built once per
side. That is one extra fusion (from the same prepared module), one extra build and a
timing of a fraction of a second whatever the number of uncertain blocks, so the mode
costs seconds (about +4 s on the bundled detection head, against 6 s for the compile);
per-block builds would cost one build per block, and the question that matters (which
model runs faster) is answered on the whole model, kernel launches and caches between
blocks included. The price: with several uncertain blocks in one compile their decisions
are taken together (every block's record carries the two whole-model times), and a block
whose flip helps is kept from it when the others' flips hurt more. A later compile with the
database times only the blocks it has no record of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .calibration._timing import TimingConfig
from .errors import UserInputError
from .hardware import DeviceKind
from .pipeline import PhaseResult
from .plan import BlockPlan, FusionPlan
from .profile import random_feeds
from .search import SearchConfig
from .threads import use_all_cores
from .tuning_db import BlockDecision, TuningDatabase, block_key, partition_key, target_key

#: Modes of ``compile(..., verify=...)`` (None: off, the default).
VERIFY_MODES = ("measure",)
#: A block decision is measured when the kept partition is predicted to save less than this
#: share of the runner-up's time: the cost model's median per-kernel error is 14% over the
#: zoo (docs/bench/prediction_full.md), so a smaller predicted gain is inside its error.
VERIFY_BAND = 0.15
#: Timing of the two builds: interleaved rounds (order alternating), each a loop of at
#: least ``min_repeat_ms``; the median per build (a neighbour's burst spoils a round).
TIMING = TimingConfig(repeat=9, min_repeat_ms=10.0, statistic="median")


def check_verify(verify: str | None) -> str | None:
    """``verify`` when it names a mode (None: off); else :class:`UserInputError`."""
    if verify is None or verify in VERIFY_MODES:
        return verify
    known = ", ".join(repr(m) for m in VERIFY_MODES)
    raise UserInputError(f"verify={verify!r} is not a verify mode; use None (off) or {known}")


def uncertain_blocks(plan: FusionPlan, band: float = VERIFY_BAND) -> list[BlockPlan]:
    """Blocks of ``plan`` whose kept partition is predicted to save less than ``band`` of
    the runner-up's time."""
    return [
        b for b in plan.blocks
        if b.alternative is not None
        and b.alternative_time_s - b.predicted_time_s <= band * b.alternative_time_s
    ]


def time_interleaved(executables: Sequence[Any], device: tvm.runtime.Device,
                     arrays: Sequence[np.ndarray], timing: TimingConfig = TIMING) -> list[float]:
    """Seconds of one run of ``main`` of each executable on ``arrays``: ``timing.repeat``
    rounds, each executable timed once a round (order alternating between rounds), the
    configured statistic of each one's rounds."""
    if device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
        use_all_cores()
    vms = [relax.VirtualMachine(exe, device) for exe in executables]
    args = [tvm.runtime.tensor(a, device) for a in arrays]
    timers = []
    for vm in vms:
        vm.set_input("main", *args)
        # Warm-up and the calls per round, found once: a timer asked for min_repeat_ms
        # searches its count again on every call, tripling the time spent.
        probe = vm.module.time_evaluator("invoke_stateful", device, number=1, repeat=1,
                                         min_repeat_ms=int(timing.min_repeat_ms))
        per_call = max(probe("main").mean, 1e-9)
        number = max(timing.number, int(timing.min_repeat_ms * 1e-3 / per_call))
        timers.append(vm.module.time_evaluator("invoke_stateful", device, number=number,
                                               repeat=1))
    times: list[list[float]] = [[] for _ in vms]
    for r in range(timing.repeat):
        order = range(len(vms)) if r % 2 == 0 else reversed(range(len(vms)))
        for i in order:
            times[i].append(timers[i]("main").mean)
    return [timing.reduce(t) for t in times]


def _candidates(block: BlockPlan) -> dict[str, str]:
    """Source -> partition key of the two candidates of ``block``."""
    return {block.source: partition_key(block.groups),
            block.alternative: partition_key(block.alternative_groups)}


def measure_uncertain(
    first: PhaseResult,
    phases: Callable[[SearchConfig, tvm.IRModule], PhaseResult],
    build: Callable[[PhaseResult], Any],
    loaded,
    database: TuningDatabase | None,
    config: SearchConfig | None = None,
    band: float = VERIFY_BAND,
) -> PhaseResult:
    """Settle the uncertain block decisions of ``first`` by measurement.

    Parameters
    ----------
    first : PhaseResult
        The phases as the model decided them (``fusion="cost"``).
    phases : callable
        ``phases(config, prepared)`` runs the phases again under a search config (the
        measured decisions in its ``sources``) from ``first``'s prepared module.
    build : callable
        Builds a phase result into a VM executable.
    loaded : LoadedModel
        The model (its inputs, for random feeds).
    database : TuningDatabase, optional
        Decisions read and written (and the file saved, when it has one).
    config : SearchConfig, optional
        The search config ``first`` ran under.
    band : float
        See :data:`VERIFY_BAND`.

    Returns
    -------
    PhaseResult
        The phases kept, their plan's ``verified`` filled in. The build timed here is not
        handed back: a VM made on an executable writes its constants' memory scope into
        it, and a library exported from it then warns on every save and load (a fresh
        build costs under a second).
    """
    parts, plan = first.parts, first.plan
    if parts.hw.kind is DeviceKind.FPGA:
        raise UserInputError(f"verify='measure' times builds on the device; the "
                             f"{parts.backend.name} target runs none here")
    device = parts.backend.device()
    if not device.exist:
        raise UserInputError(f"verify='measure' times builds on the device: no {device} here")
    blocks = uncertain_blocks(plan, band)
    plan.verified = []
    plan.notes.append(f"verify=measure: {len(blocks)} block decision(s) predicted within "
                      f"{band:.0%} of the runner-up")
    if not blocks:
        return first
    target, hw = parts.target, parts.hw.name
    keys = {id(b): block_key(b.graph, first.prepared) for b in blocks}
    cached: dict[int, BlockDecision] = {}
    for b in blocks:
        rec = database.lookup_decision(keys[id(b)], target, hw) if database is not None else None
        if rec is not None and rec.candidates == _candidates(b):
            cached[id(b)] = rec
    todo = [b for b in blocks if id(b) not in cached]
    base = config or SearchConfig()
    pinned = base.sources + tuple((b.function, b.block_index, cached[id(b)].source)
                                  for b in blocks if id(b) in cached)
    keep = first
    if any(rec.source != b.source for b in blocks if (rec := cached.get(id(b)))):
        keep = phases(dataclasses.replace(base, sources=pinned), first.prepared)
    measured: dict[int, dict[str, float]] = {
        id(b): {s: us * 1e-6 for s, us in cached[id(b)].measured_us.items()}
        for b in blocks if id(b) in cached
    }
    kept_source = {id(b): cached[id(b)].source for b in blocks if id(b) in cached}
    if todo:
        flipped = pinned + tuple((b.function, b.block_index, b.alternative) for b in todo)
        other = phases(dataclasses.replace(base, sources=flipped), first.prepared)
        exe_keep, exe_other = build(keep), build(other)
        feeds = random_feeds(loaded, plan.dims)
        arrays = [np.ascontiguousarray(feeds[n]) for n in loaded.input_names]
        t_keep, t_other = time_interleaved([exe_keep, exe_other], device, arrays)
        flip = t_other < t_keep
        keep = other if flip else keep
        for b in todo:
            measured[id(b)] = {b.source: t_keep, b.alternative: t_other}
            kept_source[id(b)] = b.alternative if flip else b.source
            if database is not None:
                database.commit_decision(BlockDecision(
                    keys[id(b)], target_key(target), hw, kept_source[id(b)], _candidates(b),
                    {s: t * 1e6 for s, t in measured[id(b)].items()},
                    f"{b.function}#{b.block_index}",
                ))
        if database is not None and database.path is not None:
            database.save()
    if keep is not first:
        keep.plan.verified = []
        keep.plan.notes.append(plan.notes[-1])
    for b in blocks:
        kept = kept_source[id(b)]
        other_source = b.alternative if kept == b.source else b.source
        predicted = {b.source: b.predicted_time_s, b.alternative: b.alternative_time_s}
        keep.plan.verified.append({
            "function": b.function, "block": b.block_index, "source": kept,
            "alternative": other_source, "predicted_s": predicted,
            "measured_s": measured[id(b)], "cached": id(b) in cached,
        })
    return keep
