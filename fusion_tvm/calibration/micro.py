"""Micro-benchmarks that turn a preset :class:`HardwareSpec` into a measured one.

Three families, all built from our own TIR (TVMScript) or our own pipeline:

* **bandwidth** of each memory level: streams over buffers sized to fit the level. On-chip
  levels run a triad ``B = 0.5 * B + A`` repeated inside one kernel (so the thread-pool
  start is amortised); off-chip memory runs one copy ``B = A`` over buffers several times the
  last cache. Bytes are counted the way the roofline model counts them (every tensor read
  and written once per pass).
* **launch overhead** of the Relax VM: a chain of ``k`` tiny kernels, time against ``k``; the
  slope is the cost of one kernel call in a model.
* **thread-pool overhead**: a small kernel (a microsecond of work per core) timed with its
  rows in parallel and serially; what the parallel one takes beyond ``serial / cores`` is
  the fork/join cost of one parallel region (``parallel_overhead_s``). On a shared machine
  it is mostly the time to wake a worker on a busy core, so it is measured, never assumed.
* **rule efficiency**: representative workloads compiled with our pipeline (so each kernel
  is scheduled by the llvm_cpu rule that would handle it in a model); for every kernel,
  efficiency = roofline time under the spec / measured body time, the definition the
  roofline cost model uses (``time = launch + regions x parallel overhead + max(compute,
  memory) / efficiency + internal``), the body being the time alone less the direct call
  and the thread-pool overhead of the kernel's parallel loops. A rule's figure is the
  geometric mean over its kernels, written as ``"rule"``; where its kernels fall in
  several shape classes (``roofline.shape_class``: small/large contractions, plain or
  transcendental elementwise work) each class gets its own ``"rule:class"`` figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import tvm
from tvm import relax
from tvm.script import tirx as T

from ..hardware import HardwareSpec, MemoryLevel
from ..ops import OpClass
from ..presets import FORK_JOIN_PROBE_COLS, FORK_JOIN_PROBES, fork_join_split, row_add_kernel
from ._timing import Runner
from .kernels import plan_kernels, time_kernel

RULES = ("matmul", "conv2d", "reduction", "elementwise", "fallback")


# ------------------------------------------------------------------------------ bandwidth
def triad_func(cores: int, rows: int, lanes: int, reps: int):
    """``reps`` passes of ``B = 0.5 * B + A`` over ``cores`` private slices, in parallel."""

    @T.prim_func
    def main(A: T.Buffer((cores, rows, lanes), "float32"),
             B: T.Buffer((cores, rows, lanes), "float32")):
        for c in T.parallel(cores):
            for _r in range(reps):
                for i in range(rows):
                    for j in T.vectorized(lanes):
                        B[c, i, j] = B[c, i, j] * T.float32(0.5) + A[c, i, j]

    return main


def copy_func(cores: int, rows: int, lanes: int):
    """One parallel pass of ``B = A``."""

    @T.prim_func
    def main(A: T.Buffer((cores, rows, lanes), "float32"),
             B: T.Buffer((cores, rows, lanes), "float32")):
        for c in T.parallel(cores):
            for i in range(rows):
                for j in T.vectorized(lanes):
                    B[c, i, j] = A[c, i, j]

    return main


@dataclass
class BandwidthResult:
    level: str
    tensor_bytes: int
    bytes_per_s: float
    seconds: float


def measure_level(runner: Runner, hw: HardwareSpec, level: MemoryLevel, fraction: float,
                  off_chip: bool) -> BandwidthResult:
    """Bandwidth of ``level`` with each tensor sized to ``fraction`` of its capacity."""
    cores, lanes = hw.num_cores, hw.simd_lanes_fp32
    if off_chip:
        last = max(lvl.capacity_bytes * (1 if lvl.shared else cores) for lvl in hw.on_chip) \
            if hw.on_chip else 32 << 20
        total = int(2 * last * fraction * 4)  # several times the last cache
    else:
        total = int(level.capacity_bytes * fraction * (1 if level.shared else cores))
    rows = max(1, total // (4 * lanes * cores))
    tensor_bytes = 4 * lanes * cores * rows
    if off_chip:
        func, traffic = copy_func(cores, rows, lanes), 2 * tensor_bytes
    else:
        reps = max(1, int((48 << 20) // (3 * tensor_bytes)))
        func, traffic = triad_func(cores, rows, lanes, reps), 3 * tensor_bytes * reps
    module = runner.build_prim(tvm.IRModule({"main": func}))
    shape = (cores, rows, lanes)
    args = [runner.tensor(np.full(shape, 0.5, "float32")) for _ in range(2)]
    seconds = runner.time_prim(module, args)
    return BandwidthResult(level.name, tensor_bytes, traffic / seconds, seconds)


def measure_bandwidth(runner: Runner, hw: HardwareSpec, thorough: bool = False
                      ) -> list[BandwidthResult]:
    """One figure per memory level: the median over three sizes when ``thorough``, else the
    faster of two runs at one size (another process only ever slows a run down: a quick
    calibration beside a busy process once measured L1 no faster than DRAM)."""
    fractions = (0.15, 0.25, 0.35) if thorough else (0.25, 0.25)
    out = []
    for k, level in enumerate(hw.memory):
        off_chip = k == len(hw.memory) - 1
        runs = [measure_level(runner, hw, level, f, off_chip) for f in fractions]
        runs.sort(key=lambda r: r.bytes_per_s)
        out.append(runs[len(runs) // 2] if thorough else runs[-1])
    return out


def monotone(bandwidths: Sequence[float]) -> list[float]:
    """Bandwidths made non-increasing outwards (an outer level is never faster: a noisy
    inner measurement takes the outer figure)."""
    out = list(bandwidths)
    for k in range(len(out) - 2, -1, -1):
        out[k] = max(out[k], out[k + 1])
    return out


# -------------------------------------------------------------------------- VM overhead
def _tiny_add(parallel: int = 0):
    """``B = A + 1`` on 4 floats, or on ``parallel`` x 16 floats with a parallel outer loop
    (the thread pool starts and joins, as in every kernel our rules parallelise)."""
    from tvm import s_tir, te

    shape = (parallel, 16) if parallel else (4,)
    a = te.placeholder(shape, "float32", name="A")
    b = te.compute(shape, lambda *i: a[i] + tvm.tirx.const(1, "float32"), name="B")
    func = te.create_prim_func([a, b])
    if not parallel:
        return func
    sch = s_tir.Schedule(func)
    outer, inner = sch.get_loops(sch.get_sblock("B"))
    sch.parallel(outer)
    sch.vectorize(inner)
    return sch.mod["main"]


def chain_module(k: int, parallel: int = 0) -> tvm.IRModule:
    """A Relax ``main`` calling one tiny PrimFunc ``k`` times in a row."""
    shape = (parallel, 16) if parallel else (4,)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    gv = bb.add_func(_tiny_add(parallel), "add_one")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(k):
                y = bb.emit(relax.call_tir(gv, (y,), relax.TensorType(shape, "float32")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def measure_launch(runner: Runner, thorough: bool = False, parallel: int = 0
                   ) -> tuple[float, dict[int, float]]:
    """Per-kernel cost of the Relax VM: least-squares slope of time against chain length
    (with ``parallel`` > 0, of a kernel that starts the thread pool on that many threads)."""
    from ..pipeline import lower_passes

    ks = (1, 16, 32, 64, 128) if thorough else (1, 32, 96)
    lower = tvm.transform.Sequential(lower_passes())
    times = {}
    shape = (parallel, 16) if parallel else (4,)
    for k in ks:
        vm = runner.build_vm(chain_module(k, parallel), relax_pipeline=lower)
        times[k] = runner.time_vm(vm, [runner.tensor(np.zeros(shape, "float32"))])
    x = np.array(ks, dtype=float)
    y = np.array([times[k] for k in ks])
    slope = float(np.polyfit(x, y, 1)[0])
    return max(slope, 1e-8), times


def measure_call(runner: Runner) -> float:
    """Seconds of one direct (no VM) call of a tiny kernel: what a standalone timing of a
    kernel carries besides its body."""
    module = runner.build_prim(tvm.IRModule({"main": _tiny_add().with_attr("global_symbol",
                                                                         "main")}))
    args = [runner.tensor(np.zeros(4, "float32")) for _ in range(2)]
    return runner.time_prim(module, args)


# ------------------------------------------------------------------------ rule workloads
def _module(build: Callable[[relax.BlockBuilder, list], relax.Expr], params) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    args = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in params]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(build(bb, args))
        bb.emit_func_output(out)
    return bb.get()


def _matmul(m, k, n):
    def build(bb, a):
        y = bb.emit(relax.op.matmul(a[0], a[1]))
        return bb.emit(relax.op.add(y, a[2]))
    return _module(build, [("x", (m, k)), ("w", (k, n)), ("b", (n,))])


def _conv(c, hw_, o, r):
    def build(bb, a):
        y = bb.emit(relax.op.nn.conv2d(a[0], a[1], padding=r // 2))
        return bb.emit(relax.op.nn.relu(y))
    return _module(build, [("x", (1, c, hw_, hw_)), ("w", (o, c, r, r))])


def _softmax(m, n):
    return _module(lambda bb, a: bb.emit(relax.op.nn.softmax(a[0])), [("x", (m, n))])


def _layernorm(m, n):
    def build(bb, a):
        return bb.emit(relax.op.nn.layer_norm(a[0], a[1], a[2], axes=[-1]))
    return _module(build, [("x", (m, n)), ("g", (n,)), ("b", (n,))])


def _bias_relu(m, n):
    def build(bb, a):
        return bb.emit(relax.op.nn.relu(relax.op.add(a[0], a[1])))
    return _module(build, [("x", (m, n)), ("b", (n,))])


def _transpose(a, b, c):
    def build(bb, x):
        y = bb.emit(relax.op.permute_dims(x[0], [1, 0, 2]))
        return bb.emit(relax.op.add(y, y))
    return _module(build, [("x", (a, b, c))])


def _activation(kind: str, m: int, n: int):
    """The activations models are made of, as their ONNX exports spell them: GELU with erf,
    GELU with tanh and ``pow(x, 3)``, SiLU (sigmoid), a plain exp, and a log (the only one
    left a libm call by ``FastMath``: it measures the transcendental peak)."""
    op = relax.op

    def c(v):
        return relax.const(v, "float32")

    def build(bb, a):
        x = a[0]
        if kind == "gelu_erf":
            e = bb.emit(op.erf(op.multiply(x, c(0.7071067811865476))))
            return bb.emit(op.multiply(op.multiply(x, c(0.5)), op.add(e, c(1.0))))
        if kind == "gelu_tanh":
            cube = bb.emit(op.power(x, c(3.0)))
            inner = bb.emit(op.multiply(op.add(x, op.multiply(cube, c(0.044715))),
                                        c(0.7978845608028654)))
            return bb.emit(op.multiply(op.multiply(x, c(0.5)), op.add(op.tanh(inner), c(1.0))))
        if kind == "silu":
            return bb.emit(op.multiply(x, op.sigmoid(x)))
        if kind == "log":  # no polynomial version: a libm call per element
            return bb.emit(op.log(op.add(op.abs(x), c(1.0))))
        return bb.emit(op.exp(x))
    return _module(build, [("x", (m, n))])


#: Per-element transcendental kernels: their throughput sets the spec's transcendental peak
#: (libm calls such as powf / erff / tanhf run far below the FMA peak / 16 of a preset).
TRANSCENDENTAL = ("gelu_erf", "gelu_tanh", "silu", "exp", "log")


@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable[[], tvm.IRModule]
    fallback_only: bool = False  # schedule with the Fallback rule alone (as a model would
    # when no template matches)
    transcendental: bool = False  # calibrates the transcendental peak, not a rule


def _fallback_backend():
    from ..targets.llvm_cpu import Fallback, LLVMCPUBackend

    class FallbackOnly(LLVMCPUBackend):
        """The llvm backend with its last rule only."""

        def schedule_rules(self, hw):
            return (Fallback(),)

    return FallbackOnly()


def workloads(thorough: bool = False) -> list[Workload]:
    """Representative workloads, a few sizes each (more when ``thorough``)."""
    w = [
        Workload("matmul_1x256x256", lambda: _matmul(1, 256, 256)),
        Workload("matmul_16x64x64", lambda: _matmul(16, 64, 64)),
        Workload("matmul_16x128x256", lambda: _matmul(16, 128, 256)),
        Workload("matmul_64x256x256", lambda: _matmul(64, 256, 256)),
        Workload("matmul_256x512x512", lambda: _matmul(256, 512, 512)),
        Workload("conv_16x32x32_3x3", lambda: _conv(16, 32, 16, 3)),
        Workload("conv_32x16x16_3x3", lambda: _conv(32, 16, 64, 3)),
        Workload("conv_8x16x16_3x3", lambda: _conv(8, 16, 8, 3)),
        Workload("conv_32x2x2_3x3", lambda: _conv(32, 2, 32, 3)),
        Workload("conv_16x6x6_3x3_o24", lambda: _conv(16, 6, 24, 3)),
        Workload("conv_64x1x1_1x1_o96", lambda: _conv(64, 1, 96, 1)),
        Workload("softmax_64x256", lambda: _softmax(64, 256)),
        Workload("softmax_16x64", lambda: _softmax(16, 64)),
        Workload("layernorm_16x64", lambda: _layernorm(16, 64)),
        Workload("layernorm_256x512", lambda: _layernorm(256, 512)),
        Workload("bias_relu_64x256", lambda: _bias_relu(64, 256)),
        Workload("bias_relu_512x1024", lambda: _bias_relu(512, 1024)),
        Workload("transpose_16x64x32", lambda: _transpose(16, 64, 32)),
        Workload("fallback_matmul_32x64x64", lambda: _matmul(32, 64, 64), fallback_only=True),
        *(Workload(f"{op}_32x256", lambda op=op: _activation(op, 32, 256), transcendental=True)
          for op in TRANSCENDENTAL),
    ]
    if thorough:
        w += [
            Workload("matmul_16x128x512", lambda: _matmul(16, 128, 512)),
            Workload("matmul_512x1024x1024", lambda: _matmul(512, 1024, 1024)),
            Workload("conv_64x56x56_3x3", lambda: _conv(64, 56, 64, 3)),
            Workload("conv_8x32x32_1x1", lambda: _conv(8, 32, 32, 1)),
            Workload("softmax_256x1024", lambda: _softmax(256, 1024)),
            Workload("layernorm_64x128", lambda: _layernorm(64, 128)),
            Workload("bias_relu_16x64", lambda: _bias_relu(16, 64)),
            Workload("transpose_64x128x64", lambda: _transpose(64, 128, 64)),
            Workload("fallback_matmul_64x128x128", lambda: _matmul(64, 128, 128),
                     fallback_only=True),
            *(Workload(f"{op}_128x256", lambda op=op: _activation(op, 128, 256),
                       transcendental=True) for op in TRANSCENDENTAL),
        ]
    return w


@dataclass
class KernelEfficiency:
    workload: str
    kernel: str
    rule: str
    roofline_s: float
    internal_s: float
    measured_s: float
    efficiency: float
    parallel: bool = False
    transcendental_flops: float = 0.0
    calibrates: str = ""  # the rule, or "transcendental"
    regions: int = 0  # parallel loops of the scheduled kernel (thread-pool fork/joins)
    shape_class: str = ""  # roofline.shape_class of the group
    scheduled_rule: str = ""  # the rule that scheduled it (``rule`` is the model's name)


def kernel_efficiency(roofline_s: float, internal_s: float, body_s: float) -> float:
    """The efficiency that makes the model predict ``body_s`` for this kernel, in (0, 1.5]."""
    spent = body_s - internal_s
    if spent <= 0:
        return 1.5
    return float(min(1.5, max(1e-3, roofline_s / spent)))


def measure_rules(runner: Runner, hw: HardwareSpec, call_s: float, thorough: bool = False,
                  log: Callable[[str], None] | None = None,
                  between: Callable[[], None] | None = None) -> list[tuple]:
    """Time every kernel of the representative workloads; returns ``(KernelEfficiency,
    graph, group)`` triples (``hw`` supplies the roofline: peaks and calibrated bandwidths,
    and the thread-pool overhead taken out of every parallel region; the graphs let
    :func:`refit` re-estimate under a changed spec without re-timing). ``between`` runs
    after each workload (a round of the thread-pool probe, spread over the calibration)."""
    from ..api import compile as ft_compile

    probe = replace(hw, efficiency={r: 1.0 for r in RULES}, launch_overhead_s=0.0,
                    parallel_overhead_s=0.0)
    out = []
    for w in workloads(thorough):
        target = _target_kind(runner)
        if w.fallback_only and target == "llvm":
            target = _fallback_backend()
        cm = ft_compile(w.build(), target=target, hw=probe)
        for k in plan_kernels(cm):
            if k.func is None or not k.detail:
                continue
            roof = max(k.detail.get("compute_s", 0.0), k.detail.get("memory_s", 0.0))
            internal = k.detail.get("internal_s", 0.0)
            measured = time_kernel(runner, k.func)
            regions = parallel_loops(k.func)
            eff = kernel_efficiency(roof, internal,
                                    max(measured - call_s - hw.parallel_cost(regions), 1e-9))
            trans = sum(k.graph.nodes[i].flops(k.graph.dims).get(OpClass.TRANSCENDENTAL, 0.0)
                        for i in k.members)
            # Keyed by the rule the cost model names for the group (what it looks up), but
            # a kernel the fallback scheduled calibrates "fallback".
            rule = "fallback" if k.rule == "fallback" else str(k.detail.get("rule", k.rule))
            e = KernelEfficiency(w.name, k.func_name, rule, roof, internal, measured, eff,
                                 regions > 0, float(trans),
                                 "transcendental" if w.transcendental else k.rule,
                                 regions, str(k.detail.get("shape_class", "")), k.rule)
            out.append((e, k.graph, k.members))
            if log:
                log(f"  {w.name:<26} {k.func_name[:36]:<36} {k.rule:<12} "
                    f"{e.shape_class:<14} {regions}p {measured * 1e6:9.1f} us  eff {eff:.3f}")
        if between is not None:
            between()
    return out


def transcendental_peak(effs: Sequence[KernelEfficiency], call_s: float,
                        elementwise_eff: float) -> float | None:
    """Transcendental FLOP/s such that the model predicts the measured per-element kernels:
    ``flops / (peak * efficiency) = body`` (geometric mean over the kernels)."""
    rates = [e.transcendental_flops / max(e.measured_s - call_s, 1e-9) / elementwise_eff
             for e in effs if e.calibrates == "transcendental" and e.transcendental_flops > 0]
    if not rates:
        return None
    return float(math.exp(np.mean(np.log(rates))))


def refit(measured: Sequence[tuple], spec: HardwareSpec, call_s: float) -> list[KernelEfficiency]:
    """Efficiencies re-derived under ``spec`` (new peaks or thread-pool overhead) from the
    same measurements."""
    from ..cost_models.roofline import RooflineCostModel
    from ..targets.base import get_backend

    model = RooflineCostModel(replace(spec, efficiency={r: 1.0 for r in RULES},
                                      launch_overhead_s=0.0, parallel_overhead_s=0.0),
                              get_backend("llvm"))
    out = []
    for e, graph, group in measured:
        d = model.estimate(graph, group).detail
        roof = max(d.get("compute_s", 0.0), d.get("memory_s", 0.0))
        internal = d.get("internal_s", 0.0)
        body = max(e.measured_s - call_s - spec.parallel_cost(e.regions), 1e-9)
        eff = kernel_efficiency(roof, internal, body)
        out.append(replace(e, roofline_s=roof, internal_s=internal, efficiency=eff))
    return out


def parallel_loops(func) -> int:
    """Parallel loops of a scheduled PrimFunc: each forks and joins the thread pool."""
    return 0 if func is None else func.script().count("T.parallel(")


def is_parallel(func) -> bool:
    """Whether a scheduled PrimFunc has a parallel loop (starts the thread pool)."""
    return parallel_loops(func) > 0


def _target_kind(runner: Runner) -> str:
    return str(runner.target.kind.name)


def aggregate(effs: Sequence[KernelEfficiency], classes: bool = False) -> dict[str, float]:
    """Geometric mean of the efficiencies of each rule's kernels.

    The rule's figure (``"rule"``) leaves out the per-element transcendental kernels (they
    calibrate the transcendental work: the ``"elementwise:transcendental"`` class, or the
    transcendental peak). With ``classes``, a rule whose kernels fall in several shape
    classes also gets one ``"rule:class"`` figure per class.
    """
    def gmean(v):
        return float(math.exp(np.mean(np.log(v))))

    by_rule: dict[str, list[float]] = {}
    by_class: dict[str, dict[str, list[float]]] = {}
    for e in effs:
        if e.calibrates != "transcendental":
            by_rule.setdefault(e.rule, []).append(e.efficiency)
        # An activation kernel calibrates only the transcendental class: pow(x, 3) in GELU
        # (counted as plain multiplies, compiled to powf) would mislead the plain class.
        plain_activation = e.calibrates == "transcendental" and e.shape_class != "transcendental"
        if e.shape_class and not plain_activation:
            by_class.setdefault(e.rule, {}).setdefault(e.shape_class, []).append(e.efficiency)
    out = {r: gmean(v) for r, v in by_rule.items()}
    if classes:
        for rule, per in by_class.items():
            if len(per) > 1 or rule not in out:
                out.update({f"{rule}:{c}": gmean(v) for c, v in per.items()})
    return out


# -------------------------------------------------------------------------------- driver
@dataclass
class CalibrationResult:
    """Everything measured, and the spec made of it."""

    spec: HardwareSpec
    bandwidth: list[BandwidthResult] = field(default_factory=list)
    launch_s: float = 0.0
    chain_s: dict[int, float] = field(default_factory=dict)
    call_s: float = 0.0
    kernels: list[KernelEfficiency] = field(default_factory=list)
    #: Extra cost of one parallel region (parallel chain slope - serial), as in the spec.
    parallel_overhead_s: float = 0.0
    #: Measured throughput of the activation kernels (FLOP/s as the graph counts them).
    transcendental_flops_per_s: float | None = None
    #: The thread-pool probe: seconds of the same work run serially and in parallel.
    parallel_probe_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        from dataclasses import asdict

        return {
            "spec": self.spec.to_json(),
            "bandwidth": [asdict(b) for b in self.bandwidth],
            "launch_s": self.launch_s,
            "chain_s": {str(k): v for k, v in self.chain_s.items()},
            "parallel_probe_s": dict(self.parallel_probe_s),
            "call_s": self.call_s,
            "kernels": [asdict(k) for k in self.kernels],
            "parallel_overhead_s": self.parallel_overhead_s,
            "transcendental_flops_per_s": self.transcendental_flops_per_s,
        }


class ParallelProbe:
    """Seconds the first parallel loop of a kernel adds, and each further one.

    The same work (``FORK_JOIN_PROBE_COLS`` floats per core) is timed with its rows in parallel and
    serially: the parallel kernel's time beyond its ideal share ``serial / cores`` is the
    first fork/join; a kernel of two such loops in a row gives the second (the workers are
    awake by then). Each :meth:`round` times the three kernels once; the figures are the
    medians over rounds, so rounds spread over the calibration average the machine's load
    over the same minutes as the kernels they are subtracted from.
    """

    def __init__(self, runner: Runner, hw: HardwareSpec):
        self.runner, self.cores = runner, hw.num_cores
        self.times: dict[str, list[float]] = {"serial": [], "parallel": [], "parallel_x2": []}
        self.first: list[float] = []
        self.further: list[float] = []
        if self.cores <= 1:
            return
        self.args = [runner.tensor(np.zeros((self.cores, FORK_JOIN_PROBE_COLS), "float32"))
                     for _ in range(2)]
        self.modules = {
            name: runner.build_prim(tvm.IRModule(
                {"main": row_add_kernel(self.cores, FORK_JOIN_PROBE_COLS, par, loops)}))
            for name, (par, loops) in FORK_JOIN_PROBES.items()}

    def round(self) -> None:
        """Time the three probe kernels once more (nothing on one core)."""
        if self.cores <= 1:
            return
        t = {name: self.runner.time_prim(m, self.args) for name, m in self.modules.items()}
        for name, v in t.items():
            self.times[name].append(v)
        first, further = fork_join_split(t, self.cores)
        self.first.append(first)
        self.further.append(further)

    def estimate(self) -> tuple[float, float]:
        """``(first loop, each further loop)`` seconds: medians over the rounds."""
        if not self.first:
            return 0.0, 0.0
        return (max(float(np.median(self.first)), 0.0),
                max(float(np.median(self.further)), 0.0))

    def summary(self) -> dict[str, float]:
        return {name: float(np.median(v)) for name, v in self.times.items() if v}


def measure_parallel_overhead(runner: Runner, hw: HardwareSpec, rounds: int = 7
                              ) -> tuple[float, float, dict[str, float]]:
    """:class:`ParallelProbe` figures from ``rounds`` rounds in a row."""
    probe = ParallelProbe(runner, hw)
    for _ in range(rounds):
        probe.round()
    return (*probe.estimate(), probe.summary())


def run_calibration(runner: Runner, base: HardwareSpec, thorough: bool = False,
                    log: Callable[[str], None] | None = None,
                    rules: bool = True, transcendental: bool = False) -> CalibrationResult:
    """Measure ``base``'s device through ``runner``; return the calibrated spec and the data.

    The spec gets the measured bandwidths, ``launch_overhead_s`` (VM call),
    ``parallel_overhead_s`` (one thread-pool fork/join) and the efficiencies by rule and by
    ``"rule:class"`` (fitted with the thread-pool overhead taken out of every parallel loop).

    ``transcendental``: also replace the preset's transcendental peak by the measured
    throughput of the activation kernels (their ``elementwise:transcendental`` efficiency
    then absorbs less). Off by default: the per-class efficiency already makes the model
    predict those kernels, and a peak fitted on activations misprices the few
    transcendental operations inside normalisations (one rsqrt per row).
    """
    say = log or (lambda _m: None)
    bw = measure_bandwidth(runner, base, thorough)
    for b in bw:
        say(f"bandwidth {b.level:<5} {b.tensor_bytes / 1024:>10.0f} KiB tensors "
            f"{b.bytes_per_s / 1e9:8.1f} GB/s")
    fixed = monotone([b.bytes_per_s for b in bw])
    memory = tuple(replace(lvl, bandwidth_bytes_per_s=v) for lvl, v in zip(base.memory, fixed,
                                                                             strict=True))
    launch, chain = measure_launch(runner, thorough)
    probe = ParallelProbe(runner, base)
    for _ in range(3):
        probe.round()
    par, par_next = probe.estimate()
    call = measure_call(runner)
    spec = replace(base, name=f"{base.name}-calibrated", memory=memory, launch_overhead_s=launch,
                   parallel_overhead_s=par, parallel_region_s=par_next)
    measured = measure_rules(runner, spec, call, thorough, say, probe.round) if rules else []
    # The probe's rounds ran between the workloads: refit with the figures of the whole run.
    par, par_next = probe.estimate()
    spec = replace(spec, parallel_overhead_s=par, parallel_region_s=par_next)
    say(f"VM launch overhead {launch * 1e6:.2f} us/kernel (direct call {call * 1e6:.2f} us); "
        f"thread-pool start/join {par * 1e6:.2f} us, each further parallel loop "
        f"{par_next * 1e6:.2f} us ({len(probe.first)} probe rounds)")
    effs = refit(measured, spec, call) if measured else []
    trans_peak = None
    if effs:
        trans_peak = transcendental_peak(effs, call, aggregate(effs).get("elementwise", 1.0))
        say(f"transcendental throughput {(trans_peak or 0) / 1e9:.3f} GFLOP/s "
            f"({'used' if transcendental else 'recorded only'})")
    if effs and transcendental and trans_peak:
        # Two fixed-point steps: the transcendental peak depends on the elementwise rule's
        # efficiency, and every efficiency on the peaks (exp in softmax, erf in epilogues).
        for _ in range(2):
            peak = transcendental_peak(effs, call, aggregate(effs).get("elementwise", 1.0))
            flops = dict(spec.peak_flops)
            flops[OpClass.TRANSCENDENTAL] = peak
            spec = replace(spec, peak_flops=flops)
            effs = refit(measured, spec, call)
    if effs:
        spec = spec.with_efficiency(aggregate(effs, classes=True))
        say("efficiency: " + ", ".join(f"{k}={v:.3f}" for k, v in spec.efficiency.items()))
    return CalibrationResult(spec, bw, launch, chain, call, effs, par, trans_peak,
                             probe.summary())
