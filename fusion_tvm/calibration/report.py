"""Prediction report: how well does the cost model predict what it fuses?

For each model: every kernel of the plan (our partition) is timed alone (its scheduled
PrimFunc built as a module of its own, random inputs) and set against the plan's
per-group prediction; the whole model is timed with our partition and with FuseOps's (same
schedules, same spec), interleaved, and the measured speedup is set against the plan's
predicted one. :func:`models_report` does this over any (name, ONNX model, feeds) triples
(the real-model benchmark's, say); :func:`zoo_report` over zoo models by name.

Per-kernel comparison. A prediction includes the Relax VM's per-kernel overhead
(``hw.launch_overhead_s``); a kernel timed alone carries a direct call instead
(``call_s``, measured here). So the measured in-model time of a kernel is taken as
``measured_alone - call_s + launch_overhead_s`` ("measured_in_vm_s"), and the body-only
comparison (prediction minus the overhead against the time alone minus the call) is
reported as well, so that the overhead cannot hide a poor body prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._timing import Runner
from .kernels import plan_kernels, time_kernel

# A model's speedup over FuseOps counts as predicted when within this share of the measured one.
SPEEDUP_TOLERANCE = 0.15


# ------------------------------------------------------------------------------- metrics
def _ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks with ties averaged (1-based)."""
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):
        idx = a == v
        if idx.sum() > 1:
            ranks[idx] = ranks[idx].mean()
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (nan with fewer than 3 points or a constant side)."""
    if len(x) < 3:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def median_ape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Median of ``|predicted - measured| / measured``."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if not len(m):
        return float("nan")
    return float(np.median(np.abs(p - m) / m))


# -------------------------------------------------------------------------------- rows
@dataclass
class KernelRow:
    model: str
    kernel: str
    rule: str
    ops: int
    predicted_s: float
    measured_s: float  # alone, direct call
    measured_in_vm_s: float  # alone - call + VM launch overhead
    predicted_body_s: float
    measured_body_s: float
    parallel: bool = False
    roofline_s: float = 0.0
    internal_s: float = 0.0
    regions: int = 0  # parallel loops of the scheduled kernel
    predicted_regions: int = 0  # the model's count (roofline.parallel_regions)
    shape_class: str = ""
    efficiency: float = 0.0

    @property
    def category(self) -> str:
        """``rule:class`` with ``/par`` for kernels that start the thread pool."""
        return f"{self.rule}:{self.shape_class or '-'}{'/par' if self.regions else ''}"


@dataclass
class ModelRow:
    model: str
    kernels: int
    fuseops_kernels: int | None
    predicted_s: float
    predicted_fuseops_s: float | None
    measured_s: float
    measured_fuseops_s: float | None
    predicted_speedup: float | None
    measured_speedup: float | None
    speedup_error: float | None
    kernel_sum_measured_s: float
    spearman: float
    median_ape: float
    skipped: list[str] = field(default_factory=list)
    held_out: bool = False  # kept out of tuning (the real-model benchmark's Spec.held_out)

    @property
    def predicted_ratio(self) -> float | None:
        """``predicted_s / measured_s`` of the whole model (our plan)."""
        return self.predicted_s / self.measured_s if self.measured_s else None

    @property
    def speedup_predicted(self) -> bool | None:
        """Predicted speedup within :data:`SPEEDUP_TOLERANCE` of the measured one."""
        return None if self.speedup_error is None else self.speedup_error <= SPEEDUP_TOLERANCE


@dataclass
class PredictionReport:
    hardware: dict
    call_s: float
    parallel_overhead_s: float = 0.0
    kernels: list[KernelRow] = field(default_factory=list)
    models: list[ModelRow] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why it has no row

    # ---------------------------------------------------------------- summary
    def summary(self) -> dict:
        """Pooled per-kernel figures over every model, and the end-to-end errors."""
        k = self.kernels
        errs = [m.speedup_error for m in self.models if m.speedup_error is not None]
        held = [m for m in self.models if m.held_out and m.speedup_error is not None]
        ratios = [m.predicted_ratio for m in self.models if m.predicted_ratio]
        return {
            "models": len(self.models),
            "failed": len(self.failed),
            "kernels": len(k),
            "spearman": spearman([r.predicted_s for r in k], [r.measured_in_vm_s for r in k]),
            "median_ape": median_ape([r.predicted_s for r in k],
                                     [r.measured_in_vm_s for r in k]),
            "spearman_body": spearman([r.predicted_body_s for r in k],
                                      [r.measured_body_s for r in k]),
            "median_ape_body": median_ape([r.predicted_body_s for r in k],
                                          [r.measured_body_s for r in k]),
            "spearman_raw": spearman([r.predicted_s for r in k], [r.measured_s for r in k]),
            "median_ape_raw": median_ape([r.predicted_s for r in k], [r.measured_s for r in k]),
            "median_speedup_error": float(np.median(errs)) if errs else float("nan"),
            "max_speedup_error": float(np.max(errs)) if errs else float("nan"),
            "speedup_tolerance": SPEEDUP_TOLERANCE,
            "speedup_compared": len(errs),
            "speedup_within_tolerance": sum(e <= SPEEDUP_TOLERANCE for e in errs),
            "held_out_compared": len(held),
            "held_out_within_tolerance": sum(bool(m.speedup_predicted) for m in held),
            "median_total_ratio": float(np.median(ratios)) if ratios else float("nan"),
            "regions_predicted_right": float(np.mean([r.regions == r.predicted_regions
                                                      for r in k])) if k else float("nan"),
        }

    def by_category(self) -> dict[str, dict]:
        """Per ``rule:class[/par]``: kernels, median predicted/measured ratio, median abs
        error (a ratio far from 1 names the term that is mispriced)."""
        groups: dict[str, list[KernelRow]] = {}
        for r in self.kernels:
            groups.setdefault(r.category, []).append(r)
        out = {}
        for cat, rows in sorted(groups.items()):
            p = [r.predicted_s for r in rows]
            m = [r.measured_in_vm_s for r in rows]
            out[cat] = {
                "kernels": len(rows),
                "median_ratio": float(np.median(np.asarray(p) / np.asarray(m))),
                "median_ape": median_ape(p, m),
                "median_measured_s": float(np.median(m)),
            }
        return out

    def to_json(self) -> dict:
        return {
            "hardware": self.hardware,
            "call_s": self.call_s,
            "parallel_overhead_s": self.parallel_overhead_s,
            "summary": self.summary(),
            "by_category": self.by_category(),
            "models": [{**asdict(m), "predicted_over_measured": m.predicted_ratio}
                       for m in self.models],
            "failed": dict(self.failed),
            "kernels": [asdict(k) for k in self.kernels],
        }

    def table(self) -> str:
        """Per-model lines (``*``: held out) and the pooled summary."""
        def f(v, fmt):
            width = int(fmt.split(".")[0])
            return format(v, fmt) if v is not None and math.isfinite(v) else "-".rjust(width)

        w = max([16, *(len(m.model) + 1 for m in self.models)])
        lines = [
            f"{'model':<{w}} {'kern':>4} {'rho':>6} {'MdAPE':>6} | {'pred ms':>8} {'meas ms':>8} "
            f"{'p/m':>5} | {'FO pred':>8} {'FO meas':>8} | {'pred x':>6} {'meas x':>6} "
            f"{'err':>6}",
        ]
        for m in self.models:
            lines.append(
                f"{m.model + ('*' if m.held_out else ''):<{w}} {m.kernels:>4} "
                f"{f(m.spearman, '6.3f')} {f(100 * m.median_ape, '5.1f')}% | "
                f"{m.predicted_s * 1e3:8.3f} {m.measured_s * 1e3:8.3f} "
                f"{f(m.predicted_ratio, '5.2f')} | "
                f"{f(m.predicted_fuseops_s and m.predicted_fuseops_s * 1e3, '8.3f')} "
                f"{f(m.measured_fuseops_s and m.measured_fuseops_s * 1e3, '8.3f')} | "
                f"{f(m.predicted_speedup, '6.3f')} {f(m.measured_speedup, '6.3f')} "
                f"{f(m.speedup_error and 100 * m.speedup_error, '5.1f')}%"
            )
        lines.extend(f"{name:<{w}} failed: {why}" for name, why in self.failed.items())
        s = self.summary()
        lines += [
            "",
            f"all {s['kernels']} kernels: Spearman {s['spearman']:.3f}, median abs error "
            f"{100 * s['median_ape']:.1f}% (prediction vs time alone + VM overhead)",
            f"  body only: Spearman {s['spearman_body']:.3f}, median abs error "
            f"{100 * s['median_ape_body']:.1f}%;  raw (vs time alone): Spearman "
            f"{s['spearman_raw']:.3f}, median abs error {100 * s['median_ape_raw']:.1f}%",
            f"end-to-end speedup over FuseOps: median error {100 * s['median_speedup_error']:.1f}%"
            f", max {100 * s['max_speedup_error']:.1f}%",
            f"predicted speedup within {100 * SPEEDUP_TOLERANCE:.0f}% of measured: "
            f"{s['speedup_within_tolerance']}/{s['speedup_compared']} models"
            + (f" ({s['held_out_within_tolerance']}/{s['held_out_compared']} held out)"
               if s["held_out_compared"] else "")
            + f"; Spearman over all {s['kernels']} kernels {s['spearman']:.3f}; median "
            f"predicted/measured total {s['median_total_ratio']:.2f}",
        ]
        lines.append(f"parallel regions predicted right for "
                     f"{100 * s['regions_predicted_right']:.0f}% of the kernels "
                     f"({self.parallel_overhead_s * 1e6:.1f} us per region)")
        lines += ["", f"{'class':<28} {'kern':>4} {'pred/meas':>9} {'MdAPE':>6} {'meas us':>8}"]
        for cat, c in self.by_category().items():
            lines.append(f"{cat:<28} {c['kernels']:>4} {c['median_ratio']:9.2f} "
                         f"{100 * c['median_ape']:5.1f}% {c['median_measured_s'] * 1e6:8.1f}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- measure
def model_report(name: str, model, feeds, hw, runner: Runner, call_s: float,
                 rounds: int = 15, log: Callable[[str], None] | None = None
                 ) -> tuple[ModelRow, list[KernelRow]]:
    """Per-kernel and end-to-end comparison for one model (ONNX model or path)."""
    from ..api import compile as ft_compile
    from .micro import parallel_loops

    say = log or (lambda _m: None)
    target = str(runner.target.kind.name)
    ours = ft_compile(model, target=target, hw=hw)
    base = ft_compile(model, target=target, hw=hw, fusion="fuseops")
    launch = ours.hw.launch_overhead_s
    rows, skipped = [], []
    for k in plan_kernels(ours):
        if k.func is None:
            skipped.append(f"{k.group.name}: no PrimFunc found")
            continue
        try:
            t = time_kernel(runner, k.func)
        except Exception as err:  # noqa: BLE001 - one unbuildable kernel is reported, not fatal
            skipped.append(f"{k.func_name}: {err}")
            continue
        pred = k.group.predicted_time_s
        roof = max(k.detail.get("compute_s", 0.0), k.detail.get("memory_s", 0.0))
        internal = k.detail.get("internal_s", 0.0)
        regions = parallel_loops(k.func)
        rows.append(KernelRow(
            name, k.func_name, k.rule, len(k.group.ops), pred, t, max(t - call_s, 0) + launch,
            max(pred - launch, 1e-12), max(t - call_s, 1e-12), regions > 0, roof, internal,
            regions, int(k.detail.get("parallel_regions", 0)),
            str(k.detail.get("shape_class", "")), float(k.detail.get("efficiency", 0.0)),
        ))
    # Whole models, interleaved in short paired rounds: a neighbour's burst slows both sides
    # of a round alike, and the median of the per-round ratios discards the rounds it split.
    vm_ours, vm_base = runner.vm(ours.executable), runner.vm(base.executable)
    vm_args = [runner.tensor(np.ascontiguousarray(feeds[n])) for n in ours.input_names]
    t_ours, t_base = [], []
    for r in range(rounds):
        if r % 2:  # alternate which side runs first
            t_base.append(runner.time_vm(vm_base, vm_args, repeat=1))
            t_ours.append(runner.time_vm(vm_ours, vm_args, repeat=1))
        else:
            t_ours.append(runner.time_vm(vm_ours, vm_args, repeat=1))
            t_base.append(runner.time_vm(vm_base, vm_args, repeat=1))
    m_ours, m_base = float(np.median(t_ours)), float(np.median(t_base))
    ratios = np.asarray(t_base) / np.asarray(t_ours)
    plan = ours.plan
    p_speed = plan.predicted_speedup
    m_speed = float(np.median(ratios))
    err = abs(p_speed - m_speed) / m_speed if p_speed and m_speed else None
    row = ModelRow(
        name, ours.num_kernels, base.num_kernels, plan.predicted_time_s, plan.fuseops_time_s,
        m_ours, m_base, p_speed, m_speed, err, float(sum(r.measured_in_vm_s for r in rows)),
        spearman([r.predicted_s for r in rows], [r.measured_in_vm_s for r in rows]),
        median_ape([r.predicted_s for r in rows], [r.measured_in_vm_s for r in rows]),
        skipped,
    )
    say(f"{name}: {len(rows)} kernels, rho {row.spearman:.3f}, MdAPE {100 * row.median_ape:.1f}%"
        f", speedup predicted {p_speed or float('nan'):.3f} measured {m_speed:.3f}")
    return row, rows


def _why(err: BaseException) -> str:
    """The error's type and the first line of its message (TVM's run to pages)."""
    first = str(err).strip().splitlines()[:1]
    return f"{type(err).__name__}: {first[0][:200]}" if first else type(err).__name__


def models_report(items: Iterable[tuple[str, Any, Mapping[str, np.ndarray]]], hw,
                  runner: Runner, call_s: float, rounds: int = 15,
                  log: Callable[[str], None] | None = None, held_out: Collection[str] = (),
                  keep_going: bool = False,
                  on_model: Callable[[PredictionReport], None] | None = None
                  ) -> PredictionReport:
    """The report over ``(name, model, feeds)`` triples (see :func:`model_report`).

    Parameters
    ----------
    items : iterable of (str, onnx.ModelProto or path, dict)
        Each model with its name and its inputs by name; taken one at a time (a generator
        keeps one model in memory).
    hw : str or HardwareSpec
        The spec every model is compiled and predicted with.
    runner : Runner
        Times the kernels and the whole models.
    call_s : float
        Seconds of a direct call (``micro.measure_call``).
    rounds : int
        Interleaved whole-model rounds per model.
    log : callable, optional
        Progress lines.
    held_out : collection of str
        Names of the models kept out of tuning (marked in the rows).
    keep_going : bool
        A model that fails (compile, build or run) goes to ``report.failed`` and the next
        one is taken; else the error propagates.
    on_model : callable, optional
        Called with the report after every model (to save what is measured so far).

    Returns
    -------
    PredictionReport
    """
    from ..presets import get_hardware

    spec = get_hardware(hw)
    report = PredictionReport(spec.to_json(), call_s, spec.parallel_overhead_s)
    for name, model, feeds in items:
        try:
            row, rows = model_report(name, model, feeds, spec, runner, call_s, rounds, log)
        except Exception as err:  # noqa: BLE001 - one failing model is reported, not fatal
            if not keep_going:
                raise
            report.failed[name] = _why(err)
            if log is not None:
                log(f"{name}: failed: {report.failed[name]}")
        else:
            row.held_out = name in held_out
            report.models.append(row)
            report.kernels.extend(rows)
        if on_model is not None:
            on_model(report)
    return report


def zoo_report(models: Sequence[str], hw, runner: Runner, call_s: float, small: bool = True,
               rounds: int = 15, log: Callable[[str], None] | None = None
               ) -> PredictionReport:
    """The report over zoo models (``benchmarks.zoo`` must be importable)."""
    from benchmarks import zoo

    def items():
        for name in models:
            model = zoo.get_model(name, small=small)
            yield name, model, zoo.example_inputs(model)

    return models_report(items(), hw, runner, call_s, rounds=rounds, log=log)
