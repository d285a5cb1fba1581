"""Named hardware presets and host-CPU detection.

``get_hardware("host")`` reads the machine (cores, SIMD width, cache sizes); the
other presets are frozen datasheet figures used by tests and cross-compilation.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path

from .errors import InvalidHardwareSpecError, UnknownNameError
from .hardware import DeviceKind, FpgaResources, GpuLimits, HardwareSpec, MemoryLevel, OpClass

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_PRESETS: dict[str, Callable[[], HardwareSpec]] = {}


def register_hardware(name: str):
    """Decorator registering a zero-argument factory of a :class:`HardwareSpec`."""

    def deco(fn: Callable[[], HardwareSpec]):
        if name in _PRESETS:
            raise ValueError(f"hardware preset '{name}' is already registered")
        _PRESETS[name] = fn
        return fn

    return deco


def list_hardware() -> list[str]:
    """Names of all registered presets."""
    return sorted(_PRESETS)


def get_hardware(name_or_spec: str | HardwareSpec | os.PathLike) -> HardwareSpec:
    """Resolve a preset name, a JSON file path or a spec into a :class:`HardwareSpec`."""
    if isinstance(name_or_spec, HardwareSpec):
        return name_or_spec
    name = str(name_or_spec)
    if name in _PRESETS:
        return _PRESETS[name]()
    if name.endswith(".json") or Path(name).is_file():
        return HardwareSpec.from_json(name)
    raise UnknownNameError(f"unknown hardware preset '{name}'; known: {', '.join(list_hardware())}")


# ---------------------------------------------------------------------------- CPU
def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cache_sizes() -> dict[int, int]:
    """Per-instance data/unified cache sizes by level, from sysfs (bytes)."""
    sizes: dict[int, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            kind = (idx / "type").read_text().strip()
            level = int((idx / "level").read_text().strip())
            text = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1], 1)
        sizes[level] = int(text.rstrip("KMG")) * mult
    return sizes


def _cpu_mhz() -> float:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("cpu mhz"):
                return float(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return 2500.0


def host_cpu_name() -> str:
    """LLVM's name for the host CPU (never ``native``)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


#: Widest vector register per x86 feature flag, widest first.
_X86_SIMD = (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128))


def host_simd_bits(llvm_bits: int) -> int:
    """Vector register width of the host CPU in bits.

    On x86 it is read off the CPU's feature flags: LLVM's vector width for a named CPU is
    not it (TVM 0.27 answers 512 for ``znver3`` and ``haswell``, AVX2 parts with 16
    256-bit registers). Elsewhere (or without ``/proc/cpuinfo``) LLVM's answer stands.
    """
    flags = _cpu_flags()
    for flag, bits in _X86_SIMD:
        if flag in flags:
            return bits
    return llvm_bits


def host_num_cores() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


#: Floats per thread of the fork/join probe: about a microsecond of work, as in the small
#: kernels of a model (an empty parallel loop under-reports a busy machine's stragglers).
FORK_JOIN_PROBE_COLS = 4096
#: The fork/join figure assumed where none is measured (and the most a measurement may
#: give: a probe run while the machine is busy must not make every later compile of this
#: machine keep small kernels serial).
DEFAULT_PARALLEL_US = 10.0
#: The fork/join probe's kernels: (rows in parallel, loop nests) by name.
FORK_JOIN_PROBES = {"serial": (False, 1), "parallel": (True, 1), "parallel_x2": (True, 2)}


def fork_join_split(times: dict[str, float], cores: int) -> tuple[float, float]:
    """``(first, each further)`` parallel loop's cost from one round of the probe's
    times: the parallel kernel beyond its ideal share ``serial / cores``, and a second
    parallel loop beyond the first."""
    share = times["serial"] / cores
    return times["parallel"] - share, times["parallel_x2"] - times["parallel"] - share


def cpu_spec(
    name: str,
    mcpu: str,
    cores: int,
    ghz: float,
    simd_bits: int,
    l1: int,
    l2: int,
    l3: int,
    dram_gbps: float,
    launch_us: float = 1.0,
    parallel_us: float | None = None,
    fma_lanes: int | None = None,
    dram_bytes: int = 64 * GiB,
    fma_pipe_bits: int | None = None,
    parallel_next_us: float | None = None,
) -> HardwareSpec:
    """Build a CPU spec from a few datasheet numbers.

    ``fma_lanes`` is the fp32 FMA lanes a core issues per cycle (two pipes times their width);
    None assumes two pipes of at most 256 bits, as AVX-512 runs on many cores;
    ``fma_pipe_bits`` the width of one pipe (None: the same assumption, min(SIMD, 256)).
    ``parallel_us`` is a kernel's first thread-pool fork/join (None:
    :data:`DEFAULT_PARALLEL_US`), ``parallel_next_us`` each further one in the same kernel
    (None: the same).
    """
    lanes = simd_bits // 32
    fma_lanes = fma_lanes or 2 * min(lanes, 8)
    peak_fma = cores * ghz * 1e9 * fma_lanes * 2
    core_bw = ghz * 1e9 * 64  # one 64-byte line per cycle from L1
    return HardwareSpec(
        name=name,
        kind=DeviceKind.CPU,
        target={"kind": "llvm", "mcpu": mcpu, "num-cores": cores},
        num_cores=cores,
        simd_width_bits=simd_bits,
        num_vector_registers=32 if simd_bits >= 512 else 16,
        peak_flops={
            OpClass.MATMUL: peak_fma,
            OpClass.CONV: peak_fma,
            OpClass.ELEMENTWISE: peak_fma / 2,
            OpClass.REDUCTION: peak_fma / 4,
            OpClass.TRANSCENDENTAL: peak_fma / 16,
        },
        memory=(
            MemoryLevel("L1", l1, cores * core_bw, shared=False),
            MemoryLevel("L2", l2, cores * core_bw / 2, shared=False),
            MemoryLevel("L3", l3, min(cores * core_bw / 4, 4 * dram_gbps * 1e9), shared=True),
            MemoryLevel("DRAM", dram_bytes, dram_gbps * 1e9, shared=True),
        ),
        launch_overhead_s=launch_us * 1e-6,
        parallel_overhead_s=(parallel_us if parallel_us is not None else DEFAULT_PARALLEL_US)
        * 1e-6 if cores > 1 else 0.0,
        parallel_region_s=(parallel_next_us * 1e-6 if cores > 1 else 0.0)
        if parallel_next_us is not None else None,
        fma_pipe_bits=fma_pipe_bits or min(simd_bits, 256),
        efficiency={},
        default_efficiency=0.5,
    )


#: fp32 FMA lanes a core issues per cycle where it is not two pipes of min(SIMD, 256) bits:
#: two full 512-bit pipes (Zen 5, Intel server cores since Skylake-SP), one 512-bit pipe
#: (Intel client cores with AVX-512), two 128-bit pipes (Zen 1).
FMA_LANES = {
    **dict.fromkeys(("znver5", "skylake-avx512", "cascadelake", "cooperlake",
                     "icelake-server", "sapphirerapids", "emeraldrapids", "graniterapids",
                     "graniterapids-d", "diamondrapids"), 32),
    **dict.fromkeys(("icelake-client", "tigerlake", "rocketlake", "cannonlake"), 16),
    "znver1": 8,
}
#: Width of one fp32 FMA pipe where it is not min(SIMD, 256): the 512-bit parts above.
FMA_PIPE_BITS = {
    **dict.fromkeys((k for k, v in FMA_LANES.items() if v >= 16), 512),
    "znver1": 128,
}


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cache_dir() -> Path:
    base = os.environ.get("FUSION_TVM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusion_tvm")
    return Path(base)


def measure_dram_gbps(cores: int, mib: int = 96, repeats: int = 5) -> float:
    """Sustained copy bandwidth (read + write, GB/s) of ``cores`` threads, each copying its
    own ``mib`` MiB buffer (larger than any last-level cache slice here); best of
    ``repeats``. About a second."""
    import threading
    import time

    import numpy as np

    n = mib * MiB // 4
    bufs = [(np.ones(n, np.float32), np.empty(n, np.float32)) for _ in range(cores)]
    best = 0.0
    for _ in range(repeats):
        barrier = threading.Barrier(cores + 1)

        def work(src, dst, barrier=barrier):
            barrier.wait()
            np.copyto(dst, src)  # releases the GIL: the threads copy at once

        threads = [threading.Thread(target=work, args=b) for b in bufs]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        best = max(best, 2 * n * 4 * cores / dt / 1e9)
    return best


def _host_key(cores: int) -> str:
    import platform

    return f"{platform.node()}-{host_cpu_name()}-{cores}c"


def _cached(key: str, measure: Callable[[], object], valid: Callable[[object], bool]):
    """``measure()``, once per machine: read from / written to ``host.json`` in the cache
    directory (``$FUSION_TVM_CACHE`` or ``~/.cache/fusion_tvm``) under ``key``."""
    import json

    path = _cache_dir() / "host.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if valid(cached.get(key)):
        return cached[key]
    value = measure()
    cached[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=1) + "\n")
    except OSError:
        pass  # a read-only home: measured again next process
    return value


def _env_floats(name: str, positive: bool = False) -> list[float]:
    """The comma-separated numbers of environment variable ``name``; a clear error naming
    it where one is not a (non-negative, or with ``positive`` a positive) number."""
    text = os.environ[name]
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and (v > 0 if positive else v >= 0)
                             for v in values):
        kind = "positive" if positive else "non-negative"
        raise InvalidHardwareSpecError(
            f"environment variable {name}={text!r}: expected {kind} numbers separated by commas")
    return values


def host_dram_gbps(cores: int) -> float:
    """The host's copy bandwidth, measured once per machine and cached
    (``$FUSION_TVM_CACHE`` or ``~/.cache/fusion_tvm``; ``FUSION_TVM_DRAM_GBPS`` overrides)."""
    if os.environ.get("FUSION_TVM_DRAM_GBPS"):
        return _env_floats("FUSION_TVM_DRAM_GBPS", positive=True)[0]
    return float(_cached(_host_key(cores), lambda: round(measure_dram_gbps(cores), 2),
                         lambda v: isinstance(v, (int, float)) and v > 0))


def row_add_kernel(rows: int, cols: int, parallel: bool, loops: int = 1):
    """``loops`` passes of ``B = A + 1`` (each reading the last) on ``rows x cols`` floats,
    one loop nest each, rows in parallel or not, columns vectorised: the thread-pool probe
    (here and in ``calibration``)."""
    import tvm
    from tvm import s_tir, te

    one = tvm.tirx.const(1, "float32")
    stages = [te.placeholder((rows, cols), "float32", name="A")]

    def plus_one(prev):
        return lambda i, j: prev[i, j] + one

    for k in range(loops):
        stages.append(te.compute((rows, cols), plus_one(stages[-1]), name=f"B{k}"))
    sch = s_tir.Schedule(te.create_prim_func([stages[0], stages[-1]]))
    for k in range(loops):
        outer, inner = sch.get_loops(sch.get_sblock(f"B{k}"))
        if parallel:
            sch.parallel(outer)
        sch.vectorize(inner)
    return sch.mod["main"].with_attr("global_symbol", "main")


def measure_fork_join_us(cores: int, rounds: int = 9) -> list[float]:
    """``[first, each further]`` microseconds a parallel loop adds to a kernel on ``cores``
    threads of TVM's pool: a kernel with its rows in parallel against the same one run
    serially (its share ``serial / cores``), and one of two parallel loops against one.
    Lower quartiles over ``rounds`` rounds of ``time_evaluator`` loops (~0.1 s in all,
    after a second of compiling): a busy machine only adds time, so the quiet rounds tell."""
    import numpy as np
    import tvm

    from .threads import use_all_cores

    use_all_cores()
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu_name()})
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.zeros((cores, FORK_JOIN_PROBE_COLS), "float32"), dev)
            for _ in range(2)]
    timers = {}
    for name, (par, loops) in FORK_JOIN_PROBES.items():
        kernel = row_add_kernel(cores, FORK_JOIN_PROBE_COLS, par, loops)
        lib = tvm.compile(tvm.IRModule({"main": kernel}), target).jit()
        timers[name] = lib.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=2)
    splits = [fork_join_split({name: timer(*args).mean for name, timer in timers.items()},
                              cores) for _ in range(rounds)]
    return [round(min(max(float(np.percentile(v, 25)) * 1e6, 0.0), DEFAULT_PARALLEL_US), 2)
            for v in zip(*splits, strict=True)]


def _fork_join_settled(cores: int, tries: int = 3, pause_s: float = 0.2) -> list[float]:
    """:func:`measure_fork_join_us`, measured again (after a pause, up to ``tries`` times)
    while a figure sits at the :data:`DEFAULT_PARALLEL_US` clamp, keeping each figure's
    least: another runtime's threads still spinning in this process (onnxruntime's do,
    after each run) or a burst of load must not be cached as this machine's fork/join."""
    import time

    best = measure_fork_join_us(cores)
    for _ in range(tries - 1):
        if max(best) < DEFAULT_PARALLEL_US:
            break
        time.sleep(pause_s)
        best = [min(a, b) for a, b in zip(best, measure_fork_join_us(cores), strict=True)]
    return best


def host_fork_join_us(cores: int) -> tuple[float, float]:
    """The host's thread-pool fork/join (``[first, each further]`` loop of a kernel, us),
    measured once per machine and cached like :func:`host_dram_gbps`;
    ``FUSION_TVM_PARALLEL_US`` (``first`` or ``first,further``) overrides."""
    if cores <= 1:
        return 0.0, 0.0
    env = os.environ.get("FUSION_TVM_PARALLEL_US")
    if env:
        parts = _env_floats("FUSION_TVM_PARALLEL_US")
        return parts[0], parts[-1]
    value = _cached(f"{_host_key(cores)}-fork-join-us", lambda: _fork_join_settled(cores),
                    lambda v: isinstance(v, list) and len(v) == 2
                    and all(isinstance(x, (int, float)) and x >= 0 for x in v))
    return float(value[0]), float(value[1])


@register_hardware("host")
@functools.cache
def host_cpu() -> HardwareSpec:
    """The machine this process runs on: cores, SIMD width and FMA pipes of its CPU, cache
    sizes from sysfs, memory size from /proc/meminfo, DRAM bandwidth and the thread pool's
    fork/join measured (cached)."""
    from tvm.target import Target, codegen

    mcpu = host_cpu_name()
    cores = host_num_cores()
    tgt = Target({"kind": "llvm", "mcpu": mcpu})
    simd = host_simd_bits(int(codegen.llvm_get_vector_width(tgt)) or 128)
    caches = _cache_sizes()
    fork, fork_next = host_fork_join_us(cores)
    return cpu_spec(
        "host",
        mcpu,
        cores,
        _cpu_mhz() / 1000.0,
        simd,
        caches.get(1, 32 * KiB),
        caches.get(2, 1 * MiB),
        caches.get(3, 8 * MiB),
        dram_gbps=host_dram_gbps(cores),
        fma_lanes=FMA_LANES.get(mcpu),
        dram_bytes=_mem_total() or 64 * GiB,
        fma_pipe_bits=FMA_PIPE_BITS.get(mcpu),
        parallel_us=fork,
        parallel_next_us=fork_next,
    )


@register_hardware("ci-x86-avx2")
def ci_cpu() -> HardwareSpec:
    """A frozen 2-core AVX2 machine: tests use it so decisions never depend on the host."""
    return cpu_spec("ci-x86-avx2", "haswell", 2, 3.0, 256, 32 * KiB, 1 * MiB, 32 * MiB, 20.0)


@register_hardware("epyc-znver4-2c")
def epyc2() -> HardwareSpec:
    """Two Zen 4 cores, as in this project's CI machine."""
    return cpu_spec("epyc-znver4-2c", "znver4", 2, 3.0, 512, 32 * KiB, 1 * MiB, 32 * MiB, 20.0)


# ---------------------------------------------------------------------------- GPU
def gpu_spec(
    name: str,
    arch: str,
    tag: str,
    sms: int,
    ghz: float,
    fp32_tflops: float,
    fp16_tflops: float,
    l2: int,
    hbm_tbps: float,
    smem_per_sm: int,
    smem_per_block: int,
) -> HardwareSpec:
    """Build a GPU spec from datasheet numbers."""
    del ghz
    return HardwareSpec(
        name=name,
        kind=DeviceKind.GPU,
        target={"kind": "cuda", "arch": arch, "tag": tag},
        num_cores=sms,
        simd_width_bits=32 * 32,
        num_vector_registers=255,
        peak_flops={
            OpClass.MATMUL: fp16_tflops * 1e12,
            OpClass.CONV: fp16_tflops * 1e12,
            OpClass.ELEMENTWISE: fp32_tflops * 1e12 / 2,
            OpClass.REDUCTION: fp32_tflops * 1e12 / 2,
            OpClass.TRANSCENDENTAL: fp32_tflops * 1e12 / 8,
        },
        memory=(
            MemoryLevel("reg", 256 * KiB, sms * 64 * 1e12 / 132, shared=False),
            MemoryLevel("smem", smem_per_sm, sms * 128 * 1.7e9, shared=False),
            MemoryLevel("L2", l2, hbm_tbps * 1e12 * 3, shared=True),
            MemoryLevel("HBM", 80 * GiB, hbm_tbps * 1e12, shared=True),
        ),
        launch_overhead_s=4e-6,
        gpu=GpuLimits(
            sm_count=sms,
            shared_memory_per_sm=smem_per_sm,
            shared_memory_per_block=smem_per_block,
            arch=arch,
        ),
    )


@register_hardware("a100")
def a100() -> HardwareSpec:
    """NVIDIA A100-SXM4-80GB (sm_80)."""
    return gpu_spec(
        "a100", "sm_80", "nvidia/nvidia-a100", 108, 1.41, 19.5, 312, 40 * MiB, 2.0,
        164 * KiB, 163 * KiB,
    )


@register_hardware("h100")
def h100() -> HardwareSpec:
    """NVIDIA H100-SXM5-80GB (sm_90)."""
    return gpu_spec(
        "h100", "sm_90", "nvidia/nvidia-h100", 132, 1.83, 67, 989, 50 * MiB, 3.35,
        228 * KiB, 227 * KiB,
    )


@register_hardware("h200")
def h200() -> HardwareSpec:
    """NVIDIA H200-SXM-141GB (sm_90)."""
    return gpu_spec(
        "h200", "sm_90", "nvidia/nvidia-h100", 132, 1.83, 67, 989, 50 * MiB, 4.8,
        228 * KiB, 227 * KiB,
    )


# --------------------------------------------------------------------------- FPGA
def fpga_spec(
    name: str, part: str, res: FpgaResources, ddr_gbps: float, onchip_bytes: int
) -> HardwareSpec:
    """Build an FPGA spec; compute peaks follow from DSPs and the clock."""
    dsp_flops = res.dsp * res.clock_hz * 2 / 5  # ~5 DSP per fp32 FMA
    return HardwareSpec(
        name=name,
        kind=DeviceKind.FPGA,
        target={"kind": "c", "mcpu": part},
        num_cores=1,
        simd_width_bits=512,
        num_vector_registers=1,
        peak_flops={
            OpClass.MATMUL: dsp_flops,
            OpClass.CONV: dsp_flops,
            OpClass.ELEMENTWISE: dsp_flops / 2,
            OpClass.REDUCTION: dsp_flops / 2,
            OpClass.TRANSCENDENTAL: dsp_flops / 16,
        },
        memory=(
            MemoryLevel("BRAM", onchip_bytes, res.clock_hz * 2 * 4 * res.bram_18k, shared=True),
            MemoryLevel("DDR", 16 * GiB, ddr_gbps * 1e9, shared=True),
        ),
        launch_overhead_s=1e-6,
        fpga=res,
    )


@register_hardware("u250")
def alveo_u250() -> HardwareSpec:
    """AMD Alveo U250 (xcu250), 4 DDR4 channels."""
    res = FpgaResources(dsp=12288, bram_18k=5376, uram=1280, lut=1728000, ff=3456000,
                        clock_hz=300e6)
    return fpga_spec("u250", "xcu250-figd2104-2L-e", res, 77.0, 5376 * 2304 + 1280 * 36864)


@register_hardware("zcu104")
def zcu104() -> HardwareSpec:
    """AMD Zynq UltraScale+ ZCU104 (xczu7ev), PS DDR4."""
    res = FpgaResources(dsp=1728, bram_18k=624, uram=96, lut=230400, ff=460800, clock_hz=200e6)
    return fpga_spec("zcu104", "xczu7ev-ffvc1156-2-e", res, 19.2, 624 * 2304 + 96 * 36864)
