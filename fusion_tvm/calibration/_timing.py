"""Where kernels run: the local CPU or a device behind a TVM RPC session.

A :class:`Runner` builds a module for its target, uploads it when remote, and times one entry
point with ``time_evaluator``. Every figure is a statistic of ``repeat`` short repetitions,
each a loop of many calls lasting ``min_repeat_ms``: the *median* (a neighbour's burst
spoils a few repetitions, not the median) or the *min* (the least disturbed repetition:
on a shared machine the median of a kernel that wakes the thread pool follows the load of
the moment, the minimum much less, so calibration and prediction runs agree).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax


@dataclass(frozen=True)
class TimingConfig:
    """How long and how often to time one kernel.

    ``min_repeat_ms`` sizes one repetition (``number`` grows until it lasts that long);
    the reported figure is ``statistic`` (median or min) over ``repeat`` repetitions.
    Calibration and the prediction report use the min (see the module docstring).
    """

    repeat: int = 7
    min_repeat_ms: float = 4.0
    number: int = 1
    statistic: str = "median"  # or "min"

    def reduce(self, results) -> float:
        """The figure of a list of per-repetition seconds."""
        values = [float(x) for x in results]
        return float(np.min(values) if self.statistic == "min" else np.median(values))

    @classmethod
    def quick(cls) -> TimingConfig:
        return cls(repeat=7, min_repeat_ms=3.0, statistic="min")

    @classmethod
    def thorough(cls) -> TimingConfig:
        return cls(repeat=21, min_repeat_ms=10.0, statistic="min")


class Runner:
    """Build and time kernels on the local CPU.

    Parameters
    ----------
    target : tvm.target.Target
        The compilation target.
    timing : TimingConfig
        Repetitions and their length.
    """

    def __init__(self, target: tvm.target.Target, timing: TimingConfig | None = None):
        from ..threads import use_all_cores

        self.target = target
        self.timing = timing or TimingConfig()
        use_all_cores()

    # ------------------------------------------------------------------ device
    @property
    def device(self):
        return tvm.cpu(0)

    def tensor(self, array: np.ndarray):
        """``array`` on the runner's device."""
        return tvm.runtime.tensor(array, self.device)

    def load(self, executable) -> tvm.runtime.Module:
        """A runnable module from ``tvm.compile``'s result."""
        return executable.jit() if hasattr(executable, "jit") else executable

    # --------------------------------------------------------------- building
    def build_prim(self, mod: tvm.IRModule) -> tvm.runtime.Module:
        """Compile an IRModule of PrimFuncs and load it."""
        return self.load(tvm.compile(mod, target=self.target))

    def build_vm(self, mod: tvm.IRModule, relax_pipeline=None):
        """Compile a Relax module and return its VirtualMachine on the device."""
        kwargs = {} if relax_pipeline is None else {"relax_pipeline": relax_pipeline}
        exe = tvm.compile(mod, target=self.target, **kwargs)
        return self.vm(exe)

    def vm(self, executable) -> relax.VirtualMachine:
        """The VirtualMachine of a compiled Relax executable on the device."""
        return relax.VirtualMachine(self.load(executable), self.device)

    # ----------------------------------------------------------------- timing
    def _evaluate(self, module, entry: str, args, repeat: int | None = None) -> list[float]:
        t = self.timing
        timer = module.time_evaluator(
            entry, self.device, number=t.number, repeat=repeat or t.repeat,
            min_repeat_ms=int(t.min_repeat_ms),
        )
        return [float(x) for x in timer(*args).results]

    def time_prim(self, module, args, entry: str = "main", repeat: int | None = None) -> float:
        """Seconds of one call of ``entry`` (the configured statistic)."""
        return self.timing.reduce(self._evaluate(module, entry, args, repeat))

    def time_vm(self, vm: relax.VirtualMachine, args, func: str = "main",
                repeat: int | None = None) -> float:
        """Seconds of one call of the VM function ``func`` (inputs set beforehand)."""
        vm.set_input(func, *args)
        t = self.timing
        timer = vm.module.time_evaluator(
            "invoke_stateful", self.device, number=t.number, repeat=repeat or t.repeat,
            min_repeat_ms=int(t.min_repeat_ms),
        )
        return self.timing.reduce(timer(func).results)


class RemoteRunner(Runner):
    """Build locally, upload through an RPC session, time on the remote device.

    Parameters
    ----------
    session : tvm.rpc.RPCSession
        From ``tvm.rpc.connect`` (or a tracker's ``request``).
    target : tvm.target.Target
        The remote device's target (cross-compilation target).
    """

    def __init__(self, session, target, timing: TimingConfig | None = None):
        super().__init__(target, timing)
        self.session = session
        self._tmp = tempfile.TemporaryDirectory(prefix="fusion_tvm_rpc_")
        self._count = 0
        self._tag = uuid.uuid4().hex[:12]

    @property
    def device(self):
        return self.session.cpu(0)

    def load(self, executable) -> tvm.runtime.Module:
        # Unique per upload: overwriting a library the server has loaded crashes it.
        self._count += 1
        name = f"kernel_{self._tag}_{self._count}.so"
        path = os.path.join(self._tmp.name, name)
        executable.export_library(path)
        self.session.upload(path)
        return self.session.load_module(name)

    def close(self) -> None:
        self._tmp.cleanup()
