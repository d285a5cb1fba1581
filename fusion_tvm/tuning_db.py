"""A tuning database the user keeps: measured knob values per kernel and target.

One JSON file. Each record names a workload (the structural hash of the unscheduled
PrimFunc, its symbol name left out, so the same fused kernel in another model or build
finds it), the target it was measured on, the rule and its knob values, and the times
that justified them (the rule's derived default and the best candidate, microseconds).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import tirx

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

    def __post_init__(self):
        if self.path is not None:
            self.path = Path(self.path)
            if self.path.exists():
                self._load(self.path)

    @classmethod
    def of(cls, database: TuningDatabase | str | os.PathLike | None) -> TuningDatabase | None:
        """``database`` itself, or the database in that file; None stays None."""
        if database is None or isinstance(database, TuningDatabase):
            return database
        path = Path(database)
        if not path.exists():
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

    def lookup(self, func: tirx.PrimFunc, target: tvm.target.Target) -> TuningRecord | None:
        """The record of ``func`` on ``target``, if any."""
        return self.records.get((workload_key(func), target_key(target)))

    def commit(self, record: TuningRecord) -> None:
        """Add or replace a record (a faster one only, when one exists)."""
        key = (record.workload, record.target)
        old = self.records.get(key)
        if old is None or record.best_us < old.best_us or old.rule != record.rule:
            self.records[key] = record

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the database as JSON (to ``path`` or the file it was opened from)."""
        out = Path(path) if path is not None else self.path
        if out is None:
            raise UserInputError("the tuning database has no file: pass a path to save()")
        records = sorted(self.records.values(), key=lambda r: (r.target, r.name, r.workload))
        data = {"version": VERSION, "records": [asdict(r) for r in records]}
        out.write_text(json.dumps(data, indent=1) + "\n")
        return out

    def __len__(self) -> int:
        return len(self.records)
