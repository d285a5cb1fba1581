"""Hardware descriptions consumed by cost models, legality and schedule rules.

A :class:`HardwareSpec` is frozen: tests use fixed presets so fusion decisions are
deterministic, and calibration produces a new spec rather than mutating one.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import InvalidHardwareSpecError
from .ops import OpClass


class DeviceKind(str, enum.Enum):
    """Broad kind of device; selects the backend family."""

    CPU = "cpu"
    GPU = "gpu"
    FPGA = "fpga"


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy.

    Parameters
    ----------
    name : str
        ``"reg"``, ``"L1"``, ``"L2"``, ``"L3"``, ``"smem"``, ``"BRAM"``, ``"DRAM"``, ...
    capacity_bytes : int
        Capacity of one instance (per core for private levels).
    bandwidth_bytes_per_s : float
        Sustained bandwidth of the whole device at this level.
    shared : bool
        Whether one instance is shared by all cores (L3, DRAM) or private (L1, L2).
    """

    name: str
    capacity_bytes: int
    bandwidth_bytes_per_s: float
    shared: bool = False


@dataclass(frozen=True)
class GpuLimits:
    """Per-SM / per-block limits of a GPU."""

    sm_count: int
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    shared_memory_per_sm: int = 228 * 1024
    shared_memory_per_block: int = 227 * 1024
    warp_size: int = 32
    arch: str = "sm_80"


@dataclass(frozen=True)
class FpgaResources:
    """Resources of an FPGA device."""

    dsp: int
    bram_18k: int
    uram: int
    lut: int
    ff: int
    clock_hz: float = 300e6


@dataclass(frozen=True)
class HardwareSpec:
    """A frozen description of one device.

    Parameters
    ----------
    name : str
        Preset name (``"host"``, ``"h100"``, ``"zcu104"``...).
    kind : DeviceKind
        Device family.
    target : dict
        TVM target configuration (``tvm.target.Target(spec.target)``).
    num_cores : int
        CPU cores, GPU SMs or FPGA compute units.
    simd_width_bits : int
        Vector width (CPU), warp-wide vector (GPU: 32 * 32), datapath width (FPGA).
    num_vector_registers : int
        Architectural vector registers per core (CPU) or per thread (GPU).
    peak_flops : Mapping[OpClass, float]
        Peak FLOP/s of the whole device per op class, as the best schedule reaches it.
    memory : tuple of MemoryLevel
        Innermost level first; the last level is off-chip memory (DRAM / HBM / DDR).
    launch_overhead_s : float
        Fixed cost of one kernel launch (VM call on CPU, CUDA launch on GPU).
    parallel_overhead_s : float
        Extra cost of a kernel that runs on several cores (thread-pool start and join of its
        first parallel loop).
    parallel_region_s : float or None
        Extra cost of each further parallel loop of the same kernel (the workers are
        awake by then); None: the same as ``parallel_overhead_s``.
    fma_pipe_bits : int or None
        Width of one fp32 FMA pipe (CPU): a vector up to this wide issues at the full rate
        (Zen 4 splits a 512-bit FMA over two 256-bit pipes, so 8 lanes compute as fast as
        16); None: ``simd_width_bits``.
    efficiency : Mapping[str, float]
        Measured fraction of peak each schedule rule reaches, by rule name (``"matmul"``)
        or by rule and shape class (``"matmul:small"``, ``"elementwise:transcendental"``;
        see ``roofline.shape_class``), the class figure taking precedence; filled in by
        calibration. Missing names use ``default_efficiency``.
    """

    name: str
    kind: DeviceKind
    target: Mapping[str, Any]
    num_cores: int
    simd_width_bits: int
    num_vector_registers: int
    peak_flops: Mapping[OpClass, float]
    memory: tuple[MemoryLevel, ...]
    launch_overhead_s: float
    efficiency: Mapping[str, float] = field(default_factory=dict)
    default_efficiency: float = 0.5
    #: Start/join cost of the thread pool, paid by every kernel that runs in parallel.
    parallel_overhead_s: float = 0.0
    #: Fork/join of each further parallel loop in one kernel (None: parallel_overhead_s).
    parallel_region_s: float | None = None
    #: Width of one fp32 FMA pipe (None: simd_width_bits).
    fma_pipe_bits: int | None = None
    gpu: GpuLimits | None = None
    fpga: FpgaResources | None = None

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`InvalidHardwareSpecError` naming the first impossible field."""

        def bad(what: str, why: str):
            raise InvalidHardwareSpecError(f"hardware spec '{self.name}': {what} {why}")

        def positive(what: str, v: float):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                bad(what, f"must be a positive finite number, got {v!r}")

        if not isinstance(self.kind, DeviceKind):
            bad("kind", f"must be one of {[k.value for k in DeviceKind]}, got {self.kind!r}")
        positive("num_cores", self.num_cores)
        positive("simd_width_bits", self.simd_width_bits)
        positive("num_vector_registers", self.num_vector_registers)
        if self.fma_pipe_bits is not None:
            positive("fma_pipe_bits", self.fma_pipe_bits)
        for what in ("launch_overhead_s", "parallel_overhead_s", "parallel_region_s"):
            v = getattr(self, what)
            if v is None and what == "parallel_region_s":
                continue
            if not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v):
                bad(what, f"must be >= 0, got {v!r}")
        if not self.memory:
            bad("memory", "must list at least one level (the off-chip memory)")
        for lvl in self.memory:
            positive(f"memory level '{lvl.name}' capacity_bytes", lvl.capacity_bytes)
            positive(f"memory level '{lvl.name}' bandwidth_bytes_per_s", lvl.bandwidth_bytes_per_s)
        for cls in OpClass:
            if cls not in self.peak_flops:
                bad("peak_flops", f"lacks op class '{cls.value}'")
            positive(f"peak_flops[{cls.value}]", self.peak_flops[cls])
        for rule, eff in self.efficiency.items():
            if not 0 < eff <= 1.5:
                bad(f"efficiency[{rule}]", f"must be in (0, 1.5], got {eff!r}")
        if self.kind == DeviceKind.GPU and self.gpu is None:
            bad("gpu", "limits are required for a GPU spec")
        if self.kind == DeviceKind.FPGA and self.fpga is None:
            bad("fpga", "resources are required for an FPGA spec")
        for extra in (self.gpu, self.fpga):
            if extra is not None:
                for f in fields(extra):
                    v = getattr(extra, f.name)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        if f.name == "uram" and v == 0:
                            continue
                        positive(f"{type(extra).__name__}.{f.name}", v)

    # ----------------------------------------------------------------- helpers
    def parallel_cost(self, regions: int) -> float:
        """Thread-pool seconds of a kernel with ``regions`` parallel loops."""
        if regions <= 0:
            return 0.0
        extra = self.parallel_overhead_s if self.parallel_region_s is None \
            else self.parallel_region_s
        return self.parallel_overhead_s + (regions - 1) * extra

    @property
    def dram(self) -> MemoryLevel:
        """The off-chip level."""
        return self.memory[-1]

    @property
    def on_chip(self) -> tuple[MemoryLevel, ...]:
        """All levels but the off-chip one, innermost first."""
        return self.memory[:-1]

    def level(self, name: str) -> MemoryLevel | None:
        """The memory level called ``name`` or None."""
        return next((lvl for lvl in self.memory if lvl.name == name), None)

    @property
    def simd_lanes_fp32(self) -> int:
        """fp32 lanes per vector register."""
        return max(1, self.simd_width_bits // 32)

    @property
    def full_rate_lanes_fp32(self) -> int:
        """fp32 lanes of the narrowest vector that still computes at the full FMA rate."""
        bits = min(self.fma_pipe_bits or self.simd_width_bits, self.simd_width_bits)
        return max(1, bits // 32)

    def rule_efficiency(self, rule: str, shape_class: str | None = None) -> float:
        """Fraction of peak reached by schedule rule ``rule`` (on ``shape_class`` groups)."""
        if shape_class and f"{rule}:{shape_class}" in self.efficiency:
            return float(self.efficiency[f"{rule}:{shape_class}"])
        return float(self.efficiency.get(rule, self.default_efficiency))

    def with_efficiency(self, efficiency: Mapping[str, float]) -> HardwareSpec:
        """A copy with calibrated efficiencies merged in."""
        merged = dict(self.efficiency)
        merged.update(efficiency)
        return replace(self, efficiency=merged)

    # ------------------------------------------------------------ (de)serialise
    def to_json(self) -> dict:
        """A JSON-ready dict (inverse of :meth:`from_json`)."""
        d = asdict(self)
        d["kind"] = self.kind.value
        d["peak_flops"] = {k.value: v for k, v in self.peak_flops.items()}
        d["target"] = dict(self.target)
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | Path) -> HardwareSpec:
        """Build a spec from a dict or a JSON file, with clear errors."""
        if isinstance(data, (str, Path)):
            path = Path(data)
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as err:
                msg = f"cannot read hardware spec '{path}': {err}"
                raise InvalidHardwareSpecError(msg) from err
        if not isinstance(data, Mapping):
            raise InvalidHardwareSpecError("hardware spec must be a JSON object")
        d = dict(data)
        name = d.get("name", "<unnamed>")
        try:
            d["kind"] = DeviceKind(d["kind"])
            d["peak_flops"] = {OpClass(k): float(v) for k, v in d["peak_flops"].items()}
            d["memory"] = tuple(MemoryLevel(**m) for m in d["memory"])
            if d.get("gpu") is not None:
                d["gpu"] = GpuLimits(**d["gpu"])
            if d.get("fpga") is not None:
                d["fpga"] = FpgaResources(**d["fpga"])
            return cls(**d)
        except InvalidHardwareSpecError:
            raise
        except KeyError as err:
            raise InvalidHardwareSpecError(f"hardware spec '{name}': missing field {err}") from err
        except (TypeError, ValueError) as err:
            raise InvalidHardwareSpecError(f"hardware spec '{name}': {err}") from err
