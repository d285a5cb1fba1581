"""The per-target backend interface and the schedule-rule protocol.

Every target (LLVM-CPU, CUDA, HLS) is one :class:`Backend` registered by name. What
differs between targets lives behind this interface: the TVM target, the schedule
rules (first match wins), what groups the templates can handle, what the templates make
of a group (the :class:`~fusion_tvm.kernel_model.KernelModel` it implements), and how to
build.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import tvm

from ..errors import UnknownTargetError
from ..kernel_model import KernelModel

if TYPE_CHECKING:
    from tvm import s_tir, tirx

    from ..hardware import DeviceKind, HardwareSpec


class ScheduleRule(abc.ABC):
    """A schedule template for one class of (fused) PrimFunc.

    ``apply`` returns a scheduled :class:`tvm.s_tir.Schedule` when the function is
    this rule's workload, or None meaning "not mine"; it must not mutate ``func``.

    A rule may expose tuning knobs: ``knobs`` names each knob with its candidate values
    for one function (derived default first), and ``apply(..., knobs={name: value})``
    schedules with those values in place of the derived ones. The default path never
    needs them; :mod:`fusion_tvm.tuning` measures candidates into a database.
    """

    #: Stable name, unique within a backend: the key of calibrated efficiencies in
    #: ``HardwareSpec.efficiency`` and of tuning records.
    name: str = "rule"
    #: The last resort that takes any function, unoptimised: a fused group that only such
    #: a rule scheduled is split again by the phase runner.
    catch_all: bool = False

    @abc.abstractmethod
    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        """Schedule ``func`` or return None."""

    def knobs(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> dict[str, tuple]:
        """Tunable knobs of ``func`` under this rule: name -> candidate values, the value
        the rule derives on its own first. Empty when the rule has none or ``func`` is not
        its workload; ``apply`` then takes no ``knobs`` argument."""
        return {}


class Backend(KernelModel, abc.ABC):
    """One compilation target family.

    A backend is also the :class:`~fusion_tvm.kernel_model.KernelModel` of its rules: the
    cost models ask it what its templates make of a group (rule, parallel loops, kernel
    traits, efficiency, GPU launch); every answer defaults to None (generic estimate).
    """

    #: Registry name (``"llvm"``, ``"cuda"``, ``"hls"``).
    name: str = ""
    #: Hardware preset used when the user names none.
    default_hardware: str = ""
    #: Cost model used when the user names none.
    default_cost_model: str = "roofline"
    #: Replace exp / erf / tanh by vectorisable polynomials (FastMathTransform). Pays on
    #: CPUs and GPUs; an FPGA backend may prefer its own math cores.
    fast_math: bool = True

    @property
    def template_limits(self):
        """What one group may contain for this backend's templates (legality)."""
        from ..legality import TemplateLimits

        return TemplateLimits()

    def layout_passes(self, hw: HardwareSpec | None = None) -> list:
        """Relax passes run before legalization (e.g. a blocked layout); none by default."""
        return []

    def build_model(self, mod, loaded, parts, plan):
        """Build a fused, scheduled module into a runnable model.

        Returns None to use the default Relax VM build (``tvm.compile``); a backend with
        its own artifact (e.g. an HLS project) returns an object with ``run(feeds)``,
        ``export(path)``, ``plan`` and ``num_kernels``.
        """
        return None

    @property
    @abc.abstractmethod
    def device_kind(self) -> DeviceKind:
        """The device family this backend compiles for."""

    def target(self, hw: HardwareSpec) -> tvm.target.Target:
        """The TVM target for ``hw``."""
        return tvm.target.Target(dict(hw.target))

    @abc.abstractmethod
    def schedule_rules(self, hw: HardwareSpec) -> Sequence[ScheduleRule]:
        """Rules tried in order on every PrimFunc; the last should always match."""

    def device(self) -> tvm.runtime.Device:
        """The runtime device to run on."""
        return tvm.cpu(0)


def catch_all_names(rules: Sequence[ScheduleRule]) -> frozenset[str]:
    """Names of the catch-all rules among ``rules``."""
    return frozenset(r.name for r in rules if r.catch_all)


_BACKENDS: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str):
    """Class decorator registering a backend under ``name``; duplicates are refused."""

    def deco(cls):
        if name in _BACKENDS:
            raise ValueError(f"backend '{name}' is already registered")
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return deco


def get_backend(name: str | Backend) -> Backend:
    """The backend registered as ``name`` (``"llvm"``, ``"cuda"``, ``"hls"``)."""
    if isinstance(name, Backend):
        return name
    key = {"cpu": "llvm", "c": "hls", "fpga": "hls", "gpu": "cuda"}.get(name, name)
    if key not in _BACKENDS:
        known = ", ".join(sorted(_BACKENDS))
        hint = ""
        if isinstance(name, str) and " -" in name:  # a CLI-style string, refused by TVM 0.27
            kind = name.split()[0]
            hint = (f" (options go in a JSON target dict, e.g. {{\"kind\": \"{kind}\", "
                    f"\"mcpu\": \"znver4\"}}, or a tvm.target.Target of one)")
        raise UnknownTargetError(f"unknown target '{name}'; known targets: {known}{hint}")
    return _BACKENDS[key]()


def list_backends() -> list[str]:
    """Names of the registered backends."""
    return sorted(_BACKENDS)
