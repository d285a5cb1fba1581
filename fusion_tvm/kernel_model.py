"""What a target's schedule rules make of a fused group: the questions cost models ask.

A cost model prices a candidate group as the kernel the target's rules will build. It
never guesses at a backend's hooks: it asks this declared interface, which every
:class:`~fusion_tvm.targets.base.Backend` implements. Every answer may be None, meaning
"no account of my own": the model's generic estimate then applies.

The answers are plain data (:class:`KernelTraits` for CPU kernels, :class:`GpuKernel` with
its :class:`LaunchShape` for GPU kernels), so this module sits on the ground floor: the
cost models (above) and the targets (above them) both import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hardware import HardwareSpec


@dataclass(frozen=True)
class KernelTraits:
    """What a CPU rule makes of a group beyond its parallel loops.

    Attributes
    ----------
    main_parallel : bool
        Whether the kernel's main loop (output rows) runs on all cores; a kernel can have
        parallel side passes (padding) around a serial main loop.
    staged_bytes : float
        Bytes of a staging copy the kernel writes and reads back (a padded input).
    recompute : dict
        FLOPs by op class of inlined producers evaluated more than once per element, beyond
        the one evaluation the graph counts.
    parallel_regions : int, optional
        The kernel's parallel loops when the target counted them with the rest (then
        :meth:`KernelModel.parallel_regions` is not asked again).
    compute_scale : float
        How many times longer the kernel's compute takes than the rule's calibrated
        efficiency says (a kernel off the rule's fast path: a grouped conv left in NCHW).
    """

    main_parallel: bool
    staged_bytes: float = 0.0
    recompute: dict = field(default_factory=dict)
    parallel_regions: int | None = None
    compute_scale: float = 1.0


@dataclass(frozen=True)
class LaunchShape:
    """How a GPU template launches one group.

    Attributes
    ----------
    blocks : int
        Thread blocks of the grid.
    threads : int
        Threads per block.
    registers : int
        Registers per thread.
    smem_bytes : int
        Shared memory per block (template tiles plus the group's intermediates).
    """

    blocks: int
    threads: int
    registers: int
    smem_bytes: int


@dataclass(frozen=True)
class GpuKernel:
    """A target's own account of the GPU kernel its rule makes of a group.

    Attributes
    ----------
    shape : LaunchShape or None
        Grid and per-block resources; None when no template of the target runs the group
        as one kernel (the group is infeasible, ``reason`` says why).
    onchip_bytes : float
        The group's intermediates kept on chip, in place of the roofline's figure (an
        online softmax keeps one tile of scores in registers: no rows of scores in cache).
    reread_bytes : float
        Bytes read again from cache beyond the one pass over the inputs the roofline
        counts (K and V, once more per block of query rows).
    launches : int
        Kernel launches.
    reason : str
        Why the group is infeasible (with ``shape`` None).
    """

    shape: LaunchShape | None
    onchip_bytes: float = 0.0
    reread_bytes: float = 0.0
    launches: int = 1
    reason: str = ""


class KernelModel:
    """The kernel a target's rules make of a group, as the cost models ask it.

    The defaults answer None everywhere (the generic estimate); a target overrides what
    its rules know. ``graph`` is a :class:`~fusion_tvm.graph.FusionGraph`, ``group`` a
    frozenset of its node ids, ``rule`` the name :meth:`rule_for_group` (or the model's
    own classification) gave.
    """

    def rule_for_group(self, graph, group: frozenset[int]) -> str | None:
        """Name of the schedule rule expected to run ``group``."""
        return None

    def rule_efficiency(self, rule: str, shape_class: str | None = None) -> float | None:
        """Fraction of the roofline ``rule`` reaches on groups of ``shape_class`` (the
        target's own table; a calibrated spec's figures come first)."""
        return None

    def parallel_regions(self, graph, group: frozenset[int], rule: str,
                         hw: HardwareSpec) -> int | None:
        """Thread-pool fork/joins of the kernel (CPU)."""
        return None

    def kernel_traits(self, graph, group: frozenset[int], rule: str,
                      hw: HardwareSpec) -> KernelTraits | None:
        """Serial main loop, staged copies and recomputation of the kernel (CPU)."""
        return None

    def hoists_broadcasts(self, rule: str) -> bool | None:
        """Whether ``rule``'s kernels keep the loops of their elementwise ops apart, in
        row-major order, so the compiler hoists a broadcast value out of the loops it does
        not vary along (evaluated once per iteration of the outer ones, not per element)."""
        return None

    def gpu_kernel(self, graph, group: frozenset[int], rule: str,
                   hw: HardwareSpec) -> GpuKernel | None:
        """Launch shape and on-chip use of the kernel (GPU)."""
        return None

    def model_options(self, cost_model: str) -> object | None:
        """Options this target gives the cost model registered as ``cost_model`` (the HLS
        target's fixed-point width and DSP budget for ``"fpga"``)."""
        return None


def table_efficiency(table: Mapping[str, float], rule: str,
                     shape_class: str | None = None) -> float | None:
    """``table["rule:class"]``, else ``table["rule"]``, else None."""
    for key in ([f"{rule}:{shape_class}"] if shape_class else []) + [rule]:
        if key in table:
            return table[key]
    return None
