"""A tuning database the user keeps: measured knob values per kernel and target.

One JSON file. Each record names a workload (the structural hash of the unscheduled
PrimFunc, its symbol name left out, so the same fused kernel in another model or build
finds it), the target it was measured on, the rule and its knob values, and the times
that justified them (the rule's derived default and the best candidate, microseconds).

The same file keeps measured block decisions (``compile(..., verify="measure")``): for a
dataflow block (keyed by :func:`block_key`, the structure of its fusion graph) on a target
and hardware spec, which of two candidate partitions ran faster and both times.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax, tirx

from .errors import UserInputError

#: Format version written into the file; a file of another version is refused.
VERSION = 1


def workload_key(func: tirx.PrimFunc) -> str:
    """Stable key of an unscheduled PrimFunc: its structure, not its name."""
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"


def target_key(target: tvm.target.Target) -> str:
    """The target as recorded (kind and CPU / architecture)."""
    return str(target)


def block_key(graph, mod: tvm.IRModule) -> str:
    """Stable key of a dataflow block: its fusion graph (a
    :class:`~fusion_tvm.graph.FusionGraph` built from ``mod``), names left out.

    Per node the workload key of its PrimFunc (a barrier: its kind) and the tensors it reads
    and writes; per tensor its shape, dtype, producer and role; the dims sizes were
    evaluated at. The same block in another build of the model finds its record.
    """
    parts: list = []
    for node in graph.nodes:
        value = node.binding.value
        if node.func_name:
            what = workload_key(mod[value.args[0]])
        else:
            op = getattr(value, "op", None) if isinstance(value, relax.Call) else None
            what = type(value).__name__ + (f":{op.name}" if isinstance(op, tvm.ir.Op) else "")
        parts.append((what, tuple(node.inputs), tuple(node.outputs)))
    for t in graph.tensors:
        parts.append((tuple(str(d) for d in t.shape), t.dtype, t.producer, t.is_constant,
                      t.escapes))
    parts.append(tuple(sorted((str(k), str(v)) for k, v in graph.dims.items())))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def partition_key(groups) -> str:
    """Stable key of a partition (groups of node ids) of one block."""
    canonical = sorted(sorted(int(i) for i in g) for g in groups)
    return hashlib.sha256(repr(canonical).encode()).hexdigest()[:16]


@dataclass
class BlockDecision:
    """Which of two candidate partitions of one block ran faster on one target.

    Attributes
    ----------
    block : str
        :func:`block_key` of the block.
    target : str
        :func:`target_key` of the target it was measured on.
    hardware : str
        Name of the hardware spec the candidates were predicted for.
    source : str
        The candidate kept (``"search"``, ``"fuseops"`` or ``"unfused"``).
    candidates : dict
        Source -> :func:`partition_key` of the two partitions timed: the decision holds
        while the search still offers those two.
    measured_us : dict
        Source -> microseconds of one run of the whole model built with it.
    name : str
        ``function#block`` when measured, for people reading the file.
    """

    block: str
    target: str
    hardware: str
    source: str
    candidates: dict
    measured_us: dict
    name: str = ""


@dataclass
class TuningRecord:
    """Measured knob values of one kernel on one target."""

    workload: str
    target: str
    rule: str
    knobs: dict
    default_us: float
    best_us: float
    name: str = ""  # the kernel's name when it was tuned, for people reading the file
    trials: int = 0

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0


@dataclass
class TuningDatabase:
    """Records keyed by ``(workload, target)``; load and save as JSON.

    Parameters
    ----------
    path : str or os.PathLike, optional
        File the database is read from (when it exists) and saved to.
    """

    path: Path | None = None
    records: dict = field(default_factory=dict)
    #: Measured block decisions keyed by ``(block, target, hardware)``.
    decisions: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.path is not None:
            self.path = Path(self.path)
            if self.path.exists():
                self._load(self.path)

    @classmethod
    def of(cls, database: TuningDatabase | str | os.PathLike | None,
           create: bool = False) -> TuningDatabase | None:
        """``database`` itself, or the database in that file (a new, empty one when the file
        does not exist and ``create``); None stays None."""
        if database is None or isinstance(database, TuningDatabase):
            return database
        path = Path(database)
        if not path.exists() and not create:
            raise UserInputError(f"tuning database '{path}' does not exist")
        return cls(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise UserInputError(f"tuning database '{path}' is not readable JSON: {err}") from err
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise UserInputError(
                f"tuning database '{path}': expected version {VERSION}, "
                f"found {data.get('version') if isinstance(data, dict) else type(data).__name__}"
            )
        for i, rec in enumerate(data.get("records", [])):
            try:
                record = TuningRecord(**rec)
            except TypeError as err:
                raise UserInputError(f"tuning database '{path}': record {i}: {err}") from err
            self.records[(record.workload, record.target)] = record
        for i, rec in enumerate(data.get("decisions", [])):
            try:
                decision = BlockDecision(**rec)
            except TypeError as err:
                raise UserInputError(f"tuning database '{path}': decision {i}: {err}") from err
            self.decisions[(decision.block, decision.target, decision.hardware)] = decision

    def lookup(self, func: tirx.PrimFunc, target: tvm.target.Target) -> TuningRecord | None:
        """The record of ``func`` on ``target``, if any."""
        return self.records.get((workload_key(func), target_key(target)))

    def commit(self, record: TuningRecord) -> None:
        """Add or replace a record (a faster one only, when one exists)."""
        key = (record.workload, record.target)
        old = self.records.get(key)
        if old is None or record.best_us < old.best_us or old.rule != record.rule:
            self.records[key] = record

    def lookup_decision(self, block: str, target: tvm.target.Target,
                        hardware: str) -> BlockDecision | None:
        """The measured decision of the block keyed ``block`` on ``target``, if any."""
        return self.decisions.get((block, target_key(target), hardware))

    def commit_decision(self, decision: BlockDecision) -> None:
        """Add or replace a block decision (the latest measurement wins)."""
        self.decisions[(decision.block, decision.target, decision.hardware)] = decision

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the database as JSON (to ``path`` or the file it was opened from)."""
        out = Path(path) if path is not None else self.path
        if out is None:
            raise UserInputError("the tuning database has no file: pass a path to save()")
        records = sorted(self.records.values(), key=lambda r: (r.target, r.name, r.workload))
        data = {"version": VERSION, "records": [asdict(r) for r in records]}
        if self.decisions:  # files without decisions read as they always did
            decisions = sorted(self.decisions.values(),
                               key=lambda d: (d.target, d.hardware, d.name, d.block))
            data["decisions"] = [asdict(d) for d in decisions]
        out.write_text(json.dumps(data, indent=1) + "\n")
        return out

    def __len__(self) -> int:
        return len(self.records)
