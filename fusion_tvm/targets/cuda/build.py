"""Building for CUDA without a GPU: generate the module, compile its source with nvcc.

This TVM keeps a CUDA module as source and compiles it when the runtime loads it
(``tvm_callback_cuda_compile``: NVRTC by default, nvcc with
``TVM_CUDA_COMPILE_MODE=nvcc``), so ``tvm.compile`` alone never proves the kernels
compile. :func:`nvcc_compile` runs nvcc on the generated source for a given ``sm_XY``,
which needs the toolkit but no device. :func:`fusion_tvm.api.build_cuda` builds a model
into a :class:`CudaBuild` through the one phase runner.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ...errors import FusionTVMError
from ..schedule import applied_rules


class NvccError(FusionTVMError):
    """nvcc rejected generated CUDA source (the message holds its diagnostics)."""


@dataclass
class CudaBuild:
    """A model built for CUDA: the scheduled module, the VM executable, its CUDA source.

    Attributes
    ----------
    mod : IRModule
        After fusion and scheduling, before VM lowering.
    executable : relax.VMExecutable
    source : str
        The generated CUDA C++ of every kernel.
    plan : FusionPlan or None
    rules : dict
        Scheduled PrimFunc name -> schedule rule that handled it.
    """

    mod: tvm.IRModule
    executable: object
    source: str
    plan: object = None
    rules: dict = field(default_factory=dict)

    @property
    def num_kernels(self) -> int:
        """``__global__`` functions in the source (a PrimFunc may launch several)."""
        return count_global_kernels(self.source)


def nvcc_path() -> str | None:
    """The nvcc executable, or None when the CUDA toolkit is not installed."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = os.path.join(home, "bin", "nvcc")
    return cand if os.path.exists(cand) else None


def count_global_kernels(source: str) -> int:
    """Kernels (``__global__`` definitions) in CUDA source."""
    return len(re.findall(r"extern \"C\" __global__", source)) or source.count("__global__ ")


def cuda_modules(runtime_mod) -> list:
    """The CUDA runtime modules imported (transitively) by ``runtime_mod``."""
    found = []
    stack = [runtime_mod]
    while stack:
        m = stack.pop()
        if m.kind == "cuda":
            found.append(m)
        stack.extend(m.imports)
    return found


def cuda_source(executable) -> str:
    """The CUDA source of every kernel of a VM executable (or runtime module)."""
    mod = executable.mod if hasattr(executable, "mod") else executable
    return "\n".join(m.inspect_source() for m in cuda_modules(mod))


def nvcc_compile(source: str, arch: str, workdir: str | None = None,
                 timeout_s: float = 600.0) -> str:
    """Compile CUDA ``source`` for ``arch`` (``"sm_80"``) to an object file; return its path.

    Raises
    ------
    NvccError
        When nvcc is missing or rejects the source (its diagnostics are in the message).
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise NvccError("nvcc not found (install the CUDA toolkit or set CUDA_HOME)")
    workdir = workdir or tempfile.mkdtemp(prefix="fusion_tvm_nvcc_")
    os.makedirs(workdir, exist_ok=True)
    src = os.path.join(workdir, f"kernels_{arch}.cu")
    obj = os.path.join(workdir, f"kernels_{arch}.o")
    with open(src, "w") as f:
        f.write(source)
    cmd = [nvcc, f"-arch={arch}", "-O3", "-c", src, "-o", obj]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise NvccError(f"nvcc timed out after {timeout_s:.0f}s on {src}") from err
    if proc.returncode != 0:
        raise NvccError(f"nvcc -arch={arch} failed on {src}:\n{proc.stderr[-4000:]}")
    return obj


def scheduled_rules(mod: tvm.IRModule) -> dict[str, str]:
    """PrimFunc name -> ``fusion_tvm.rule`` attribute (``"-"`` when unscheduled)."""
    applied = applied_rules(mod)
    return {gvar.name_hint: applied.get(gvar.name_hint, "-")
            for gvar, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)}
