"""The cost-model interface and its registry.

A cost model is injected into the fusion search; it is never global. It answers, for a
candidate group of nodes of a :class:`~fusion_tvm.graph.FusionGraph`, the predicted
run time as one kernel, the DRAM traffic, the on-chip footprint and whether the group
is feasible at all on the hardware (with the reason when it is not).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import UnknownNameError
from ..hardware import HardwareSpec
from ..kernel_model import KernelModel

if TYPE_CHECKING:
    from ..graph import FusionGraph


@dataclass(frozen=True)
class Cost:
    """Prediction for one kernel (one group).

    Attributes
    ----------
    time_s : float
        Predicted run time in seconds, launch overhead included.
    dram_bytes : float
        Off-chip bytes moved.
    onchip_bytes : float
        Peak on-chip footprint of the group's intermediates.
    flops : float
        Arithmetic work including recomputation.
    feasible : bool
        False when the group cannot be built on the hardware (``reason`` says why).
    reason : str
        Why infeasible, or a short note on what bounds the kernel.
    detail : dict
        Model-specific breakdown (compute / memory / overhead times, rule name...).
    """

    time_s: float
    dram_bytes: float = 0.0
    onchip_bytes: float = 0.0
    flops: float = 0.0
    feasible: bool = True
    reason: str = ""
    detail: dict = field(default_factory=dict, compare=False, hash=False)


class CostModel(abc.ABC):
    """Interface of every cost model.

    Parameters
    ----------
    hw : HardwareSpec
        The device the model predicts for.
    backend : Backend, optional
        The target backend. The model asks it what its rules make of a group through
        :class:`~fusion_tvm.kernel_model.KernelModel` (``self.kernels``; with no backend, a
        model that answers None everywhere: the generic estimate).
    """

    name: str = ""

    def __init__(self, hw: HardwareSpec, backend: KernelModel | None = None):
        self.hw = hw
        self.backend = backend
        self.kernels: KernelModel = backend if backend is not None else KernelModel()

    @abc.abstractmethod
    def estimate(self, graph: FusionGraph, group: frozenset[int]) -> Cost:
        """Predict the cost of running ``group`` (node ids of ``graph``) as one kernel."""

    def estimate_plan(self, graph: FusionGraph, groups: Iterable[frozenset[int]]) -> float:
        """Total predicted time of a partition (groups run one after another)."""
        return sum(self.estimate(graph, g).time_s for g in groups)


_COST_MODELS: dict[str, Callable[..., CostModel]] = {}


def register_cost_model(name: str):
    """Class decorator registering a cost model under ``name``; duplicates are refused."""

    def deco(cls):
        if name in _COST_MODELS:
            raise ValueError(f"cost model '{name}' is already registered")
        cls.name = name
        _COST_MODELS[name] = cls
        return cls

    return deco


def get_cost_model(name: str | CostModel, hw: HardwareSpec, backend=None) -> CostModel:
    """Instantiate the cost model registered as ``name`` for ``hw``."""
    if isinstance(name, CostModel):
        return name
    if name not in _COST_MODELS:
        known = ", ".join(sorted(_COST_MODELS))
        raise UnknownNameError(f"unknown cost model '{name}'; known: {known}")
    return _COST_MODELS[name](hw, backend)


def list_cost_models() -> list[str]:
    """Names of the registered cost models."""
    return sorted(_COST_MODELS)
