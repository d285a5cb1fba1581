"""Per-kernel profile of a compiled model: where one run spends its time.

>>> prof = cm.profile()                       # random inputs shaped like the model's
>>> print(prof.table())                       # slowest kernel first, with a total row
>>> Path("profile.json").write_text(json.dumps(prof.to_json()))

Every kernel one run launches (the ``call_tir`` calls of the compiled module, reshape views
excluded: :meth:`~fusion_tvm.api.CompiledModel.kernel_calls`) is timed alone, as built in
the model's own library (nothing is compiled again), on random inputs shaped from its
buffers; the whole model is timed through the Relax VM. Both use the calibration's runner
(``time_evaluator``: a loop of calls lasting a few ms per repetition) and keep the minimum
over ``repeat`` rounds. The difference between the whole run and the sum of the kernels is
the VM's own work: launches, allocations, shape checks, and the cache misses of a kernel
that follows another instead of itself.

Each kernel is matched to its plan group (:func:`~fusion_tvm.calibration.kernels.plan_kernels`)
for the cost model's prediction, the schedule rule that ran it, its work (FLOPs), its
modeled traffic (the bytes it reads and writes outside the kernel) and its roofline bound:
the larger of compute time at the machine's peak FLOP/s and traffic time at the bandwidth of
the memory level the model holds each tensor in, with every core working.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserInputError


# ---------------------------------------------------------------------------------- inputs
def random_array(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """A random input: standard normal floats; 0 / 1 for integers and booleans (ids and
    masks, valid for any vocabulary)."""
    dt = np.dtype(dtype or "float32")
    if dt.kind in "iub":
        return rng.integers(0, 2, size=tuple(shape)).astype(dt)
    return rng.standard_normal(tuple(shape)).astype(dt)


def random_feeds(loaded, dims: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for every input of ``loaded`` (a
    :class:`~fusion_tvm.frontend.LoadedModel`), symbolic dims set from ``dims`` (1 when
    absent)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in zip(loaded.input_names, loaded.input_shapes,
                                  loaded.input_dtypes, strict=True):
        concrete = [d if isinstance(d, int) else int(dims.get(d, 1)) for d in shape]
        feeds[name] = random_array(concrete, dtype, rng)
    return feeds


# ------------------------------------------------------------------------------------ rows
@dataclass
class KernelProfile:
    """One kernel of a run: measured against what the plan says of it.

    Attributes
    ----------
    index : int
        Position of the kernel's first call in the run.
    kernel : str
        The PrimFunc.
    group : int or None
        Index of its group in ``plan.groups`` (None: the plan does not know the kernel).
    rule : str
        The schedule rule that ran it (``GroupPlan.scheduled_rule``).
    calls : int
        Times one run calls it (``measured_s`` is per call).
    measured_s : float
        Seconds of one call, the kernel alone (the minimum over the repetitions).
    predicted_s : float or None
        The plan's prediction (VM launch included).
    ops : int
        Ops of its plan group.
    flops, traffic_bytes : float or None
        The plan's work and modeled traffic (inputs read plus outputs written).
    roofline_s : float or None
        The roofline lower bound on the whole machine.
    bound : str
        What the cost model says bounds it.
    """

    index: int
    kernel: str
    group: int | None
    rule: str
    ops: int
    calls: int
    measured_s: float
    predicted_s: float | None
    flops: float | None
    traffic_bytes: float | None
    roofline_s: float | None
    bound: str = ""

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s of the plan's work."""
        return None if self.flops is None else self.flops / self.measured_s / 1e9

    @property
    def gbps(self) -> float | None:
        """Achieved GB/s of the modeled traffic."""
        return None if self.traffic_bytes is None else self.traffic_bytes / self.measured_s / 1e9

    @property
    def roofline_share(self) -> float | None:
        """``roofline_s / measured_s``: 1.0 is the machine's limit."""
        return None if self.roofline_s is None else self.roofline_s / self.measured_s

    @property
    def predicted_ratio(self) -> float | None:
        """``predicted_s / measured_s``."""
        return None if self.predicted_s is None else self.predicted_s / self.measured_s

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(gflops=self.gflops, gbps=self.gbps, roofline_share=self.roofline_share,
                 predicted_ratio=self.predicted_ratio)
        return d


@dataclass
class ModelProfile:
    """Every kernel of one run, slowest first, and the whole run.

    Attributes
    ----------
    model : str
    target, hardware : str
    dims : dict
        Values of the symbolic dims the model ran at.
    run_s : float
        Seconds of one whole run through the Relax VM (the minimum over the repetitions).
    kernels : list of KernelProfile
        Sorted by total measured time per run, descending.
    timing : dict
        ``repeat``, ``min_repeat_ms``, ``statistic``.
    notes : list of str
    """

    model: str
    target: str
    hardware: str
    dims: dict
    run_s: float
    kernels: list[KernelProfile] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ---------------------------------------------------------------- totals
    @property
    def num_kernels(self) -> int:
        """Kernel launches per run."""
        return sum(k.calls for k in self.kernels)

    @property
    def kernel_sum_s(self) -> float:
        """Sum of the kernels' times per run."""
        return sum(k.measured_s * k.calls for k in self.kernels)

    @property
    def overhead_s(self) -> float:
        """Whole run minus the kernels: the VM's own work (negative within noise)."""
        return self.run_s - self.kernel_sum_s

    @property
    def predicted_s(self) -> float:
        """Sum of the predictions per run (of the kernels the plan prices)."""
        return sum(k.predicted_s * k.calls for k in self.kernels if k.predicted_s is not None)

    @property
    def unpriced(self) -> int:
        """Kernels per run without a prediction (outside the plan)."""
        return sum(k.calls for k in self.kernels if k.predicted_s is None)

    # ---------------------------------------------------------------- output
    def to_json(self) -> dict:
        """JSON-ready; :meth:`from_json` reads it back."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["kernels"] = [k.to_json() for k in self.kernels]
        d.update(num_kernels=self.num_kernels, kernel_sum_s=self.kernel_sum_s,
                 overhead_s=self.overhead_s, predicted_s=self.predicted_s,
                 unpriced=self.unpriced)
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelProfile:
        """The profile :meth:`to_json` wrote."""
        kept = _own_fields(cls, data)
        kept["kernels"] = [KernelProfile(**_own_fields(KernelProfile, row))
                           for row in data.get("kernels", [])]
        return cls(**kept)

    def table(self, max_rows: int | None = None) -> str:
        """Plain text: one line per kernel, slowest first, and the total."""
        timing = self.timing
        head = (f"profile of {self.model or 'model'} on {self.hardware} ({self.target}): "
                f"{self.num_kernels} kernels, each timed alone")
        if timing:
            head += (f", {timing.get('statistic', 'min')} of {timing.get('repeat')} x "
                     f">= {timing.get('min_repeat_ms')} ms")
        lines = [head, f"symbolic dims: {self.dims or 'none'}", "",
                 f"{'#':>4}  {'kernel':<44} {'rule':<15} {'meas us':>9} {'run':>4} "
                 f"{'pred us':>9} {'pred/meas':>9} {'GFLOP/s':>8} {'GB/s':>7} {'roofline':>8}"]
        rows = self.kernels if max_rows is None else self.kernels[:max_rows]
        for k in rows:
            name = k.kernel if k.calls == 1 else f"{k.kernel} (x{k.calls})"
            share = k.measured_s * k.calls / self.run_s if self.run_s else None
            lines.append(
                f"{k.index:>4}  {_cut(name, 44):<44} {_cut(k.rule or '-', 15):<15} "
                f"{k.measured_s * 1e6:>9.1f} {_pct(share):>4} "
                f"{_num(k.predicted_s, 1e6, '9.1f')} {_num(k.predicted_ratio, 1, '9.2f')} "
                f"{_num(k.gflops, 1, '8.1f')} {_num(k.gbps, 1, '7.1f')} "
                f"{_pct(k.roofline_share):>8}")
        if len(rows) < len(self.kernels):
            lines.append(f"  ... {len(self.kernels) - len(rows)} more")
        lines += ["", self.total_line()]
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def total_line(self) -> str:
        """The total row: kernels, their sum, the whole run and the difference."""
        share = self.overhead_s / self.run_s if self.run_s else float("nan")
        if self.unpriced == self.num_kernels:
            predicted = "no predictions"
        else:
            without = f" ({self.unpriced} kernel(s) without)" if self.unpriced else ""
            predicted = f"predicted {self.predicted_s * 1e6:.1f} us{without}"
        return (f"total: {self.num_kernels} kernels, {self.kernel_sum_s * 1e6:.1f} us summed; "
                f"whole run {self.run_s * 1e6:.1f} us; VM / launch overhead "
                f"{self.overhead_s * 1e6:.1f} us ({100 * share:.1f}%); {predicted}")


def _own_fields(cls, data: Mapping[str, Any]) -> dict:
    """The entries of ``data`` that are fields of the dataclass ``cls`` (derived figures
    written by ``to_json`` are left out)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


def _num(v: float | None, scale: float, fmt: str) -> str:
    width = int(fmt.split(".")[0])
    return format(v * scale, fmt) if v is not None and math.isfinite(v) else "-".rjust(width)


def _pct(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None and math.isfinite(v) else "-"


# --------------------------------------------------------------------------------- measure
def _find(lib, name: str):
    """The module of ``lib``'s import tree that defines ``name`` itself (``time_evaluator``
    looks a name up in one module, not its imports)."""
    stack = [lib]
    while stack:
        m = stack.pop()
        if m.implements_function(name, False):
            return m
        stack.extend(m.imports)
    return None


def _cpu_target(cm):
    """``cm``'s target, which must be the CPU this process runs on."""
    target = getattr(cm, "target", None)  # an HLS build has none
    if target is None or str(target.kind.name) != "llvm":
        kind = "none" if target is None else str(target.kind.name)
        raise UserInputError(f"profile times kernels on this CPU: the model must be built for "
                             f"the llvm target, not '{kind}'")
    return target


def _kernel_timer(runner, lib, name: str, func, rng: np.random.Generator,
                  dims: Mapping[str, int], notes: list[str]) -> Callable[[], float]:
    """A callable timing one repetition of the built kernel ``name`` (seconds per call) on
    random inputs shaped from ``func``'s buffers."""
    from .calibration.kernels import prim_inputs, standalone_module

    args = [runner.tensor(a) if isinstance(a, np.ndarray) else a
            for a in prim_inputs(func, rng, dims)]
    home, entry = _find(lib, name), name
    if home is None:  # lowered away under another name: build it alone
        notes.append(f"{name}: not in the built library; timed as a module of its own")
        home, entry = runner.build_prim(standalone_module(func)), "main"
    return lambda: runner.time_prim(home, args, entry=entry, repeat=1)


def _roofline_s(detail: Mapping[str, Any], hw) -> float | None:
    """The cost model's roofline terms on the whole machine (a serial kernel's terms are
    priced on one core: undone here)."""
    if "compute_s" not in detail or "memory_s" not in detail:
        return None
    bound = max(float(detail["compute_s"]), float(detail["memory_s"]))
    return bound / hw.num_cores if detail.get("serial") else bound


class _PlanFigures:
    """What the plan says of a kernel, at the dims the model runs at.

    At the plan's own dims these are the plan's figures; at other dims every group is
    priced again by the plan's cost model (a model over several sample points by the model
    it wraps) on its graph evaluated at the run's dims.
    """

    def __init__(self, plan, dims: Mapping[str, int]):
        from .cost_models.multi_point import MultiPointCostModel

        model = plan.cost_model_obj
        if isinstance(model, MultiPointCostModel):
            model = model.inner
        self.model = model
        self.dims = dict(dims)
        self.same = all(plan.dims.get(d, v) == v for d, v in self.dims.items())
        self.views: dict[int, Any] = {}  # graph id -> view (cost models cache by identity)

    def __call__(self, k) -> tuple[float, float, float, dict, str]:
        """``(predicted_s, flops, traffic_bytes, detail, bound)`` of a plan kernel."""
        g = k.group
        if self.same or self.model is None or k.graph is None:
            predicted, flops, detail, bound = g.predicted_time_s, g.flops, k.detail, g.bound
            dram = g.dram_bytes
        else:
            view = self.views.get(id(k.graph))
            if view is None:
                view = self.views[id(k.graph)] = k.graph.with_dims(
                    {**k.graph.dims, **self.dims})
            cost = self.model.estimate(view, k.members)
            predicted, flops, detail, bound = cost.time_s, cost.flops, cost.detail, cost.reason
            dram = cost.dram_bytes
        traffic = detail.get("in_bytes", 0.0) + detail.get("out_bytes", 0.0) or dram
        return float(predicted), float(flops), float(traffic), dict(detail), bound


def profile_model(cm, feeds: Sequence[np.ndarray], dims: Mapping[str, int] | None = None,
                  repeat: int = 7, min_repeat_ms: int = 3, seed: int = 0,
                  model: str = "") -> ModelProfile:
    """Time every kernel of ``cm`` alone and the whole run; see the module docstring.

    The repetitions go in rounds (the whole run, then every kernel once, ``repeat`` times)
    and each figure is the minimum over the rounds: on a shared machine a neighbour's burst
    spoils a round or two of every kernel rather than all of one kernel's repetitions.

    Parameters
    ----------
    cm : CompiledModel
        Built for the ``llvm`` target.
    feeds : sequence of numpy.ndarray
        The model's inputs in order (checked by the caller: :meth:`CompiledModel.profile`).
    dims : mapping, optional
        Values of the symbolic dims the model runs at: the kernels' own random inputs are
        shaped with them, and the plan's figures are evaluated at them.
    repeat : int
        Rounds; the minimum is kept.
    min_repeat_ms : int
        Length of one repetition (calls are looped until it lasts that long).
    seed : int
        Seed of the kernels' random inputs.
    model : str
        Name shown in the table.

    Returns
    -------
    ModelProfile
    """
    from .calibration._timing import Runner, TimingConfig

    target = _cpu_target(cm)
    if repeat < 1:
        raise UserInputError(f"repeat must be at least 1, got {repeat}")
    runner = Runner(target, TimingConfig(repeat=1, min_repeat_ms=min_repeat_ms,
                                         statistic="min"))
    dims = dict(dims or {})
    rows, notes = _kernel_rows(cm, dims)
    rng = np.random.default_rng(seed)
    lib = runner.load(cm.executable)
    prims = {gv.name_hint: f for gv, f in cm.fused_mod.functions_items() if gv.name_hint in rows}
    timers = {name: _kernel_timer(runner, lib, name, prims[name], rng, dims, notes)
              for name in rows}
    vm = runner.vm(cm.executable)
    vm_args = [runner.tensor(np.ascontiguousarray(a)) for a in feeds]
    runs: list[float] = []
    for _ in range(repeat):
        runs.append(runner.time_vm(vm, vm_args, repeat=1))
        for name, row in rows.items():
            t = timers[name]()
            row.measured_s = min(row.measured_s, t) if row.measured_s else t
    kernels = sorted(rows.values(), key=lambda r: (-r.measured_s * r.calls, r.index))
    return ModelProfile(
        model=model, target=str(target.kind.name), hardware=cm.hw.name, dims=dims,
        run_s=min(runs), kernels=kernels,
        timing={"repeat": repeat, "min_repeat_ms": min_repeat_ms, "statistic": "min"},
        notes=notes)


def _kernel_rows(cm, dims: Mapping[str, int]) -> tuple[dict[str, KernelProfile], list[str]]:
    """One row per kernel one run launches (by PrimFunc, in order of first call), with what
    the plan says of it and no time yet; and notes."""
    from .calibration.kernels import plan_kernels
    from .passes.apply_target_schedule import RULE_ATTR

    plan = cm.plan
    notes: list[str] = []
    by_name: dict[str, Any] = {}
    group_index: dict[int, int] = {}
    figures = None
    if plan is not None:
        group_index = {id(g): i for i, g in enumerate(plan.groups)}
        by_name = {k.func_name: k for k in reversed(plan_kernels(cm))}  # the first wins
        figures = _PlanFigures(plan, dims)
        if not figures.same:
            notes.append(f"the plan's figures are evaluated again at the run's dims "
                         f"{dict(dims)} (the plan was searched at {plan.dims})")
    prims = {gv.name_hint: f for gv, f in cm.fused_mod.functions_items()}
    rows: dict[str, KernelProfile] = {}
    for index, name in enumerate(cm.kernel_calls()):
        if name in rows:
            rows[name].calls += 1
            continue
        attrs = prims[name].attrs
        attr = str(attrs[RULE_ATTR]) if attrs is not None and RULE_ATTR in attrs else ""
        k = by_name.get(name)
        if k is None or figures is None:
            rows[name] = KernelProfile(index, name, None, attr, 0, 1, 0.0, None, None, None,
                                       None)
            continue
        predicted, flops, traffic, detail, bound = figures(k)
        g = k.group
        rows[name] = KernelProfile(
            index, name, group_index.get(id(g)), g.scheduled_rule or attr or g.rule,
            len(g.ops), 1, 0.0, predicted, flops, traffic, _roofline_s(detail, cm.hw), bound)
    missing = [r.kernel for r in rows.values() if r.group is None]
    if plan is None:
        notes.append("built without a fusion plan (fusion='cost' has one): no predictions")
    elif missing:
        notes.append(f"{len(missing)} kernel(s) outside the plan (no prediction): "
                     f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return rows, notes
