"""The CUDA backend: NVIDIA GPUs through TVM's CUDA code generator and nvcc / NVRTC."""

from __future__ import annotations

from collections.abc import Sequence

import tvm

from ...errors import InvalidHardwareSpecError
from ...hardware import DeviceKind, HardwareSpec
from ...kernel_model import table_efficiency
from ..base import Backend, ScheduleRule, register_backend
from . import dlight_rules as dr
from .contraction import SimtContraction
from .cost_model import is_true_contraction, reduction_blocks, template_kind
from .efficiency import EFFICIENCY
from .fallback import BindThreads
from .flash_attention import FlashAttention, flash_group, flash_kernel
from .limits import STATIC_SMEM_BYTES
from .reduction import RowReduction


def cuda_target(hw: HardwareSpec) -> tvm.target.Target:
    """The TVM CUDA target for ``hw``: the tag's attributes, the spec's arch and limits.

    The preset's ``tag`` (``nvidia/nvidia-h100``) supplies what TVM knows of the card; the
    spec's ``arch`` wins (the h100 tag says ``sm_90a``, we emit portable ``sm_90``) and the
    thread limits come from :class:`~fusion_tvm.hardware.GpuLimits`. The host
    is LLVM, as in TVM's own CUDA builds.
    """
    if hw.kind is not DeviceKind.GPU:
        raise InvalidHardwareSpecError(
            f"target 'cuda' needs a GPU hardware spec; '{hw.name}' is a {hw.kind.value} "
            "(try --hw a100, h100 or h200)")
    spec = dict(hw.target)
    tag = spec.pop("tag", None)
    config: dict = {}
    if tag and tag in tvm.target.list_tags():
        config = {k: v for k, v in dict(tvm.target.Target(tag).export()).items()
                  if k not in ("tag", "keys", "host", "kind", "id")}
    config.update(spec)
    config["kind"] = "cuda"
    limits = hw.gpu
    if limits is not None:
        config.setdefault("arch", limits.arch)
        config["max_num_threads"] = limits.max_threads_per_block
        config["max_threads_per_block"] = limits.max_threads_per_block
        config["thread_warp_size"] = limits.warp_size
        config["max_shared_memory_per_block"] = min(
            STATIC_SMEM_BYTES, limits.shared_memory_per_block
        )
    config.pop("registers_per_block", None)
    config["host"] = {"kind": "llvm"}
    return tvm.target.Target(config)


@register_backend("cuda")
class CUDABackend(Backend):
    """NVIDIA GPUs: dlight's GPU templates plus rules for our fused groups."""

    default_hardware = "h100"
    default_cost_model = "gpu"

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.GPU

    def target(self, hw: HardwareSpec) -> tvm.target.Target:
        return cuda_target(hw)

    def device(self) -> tvm.runtime.Device:
        return tvm.cuda(0)

    def rule_efficiency(self, rule: str, shape_class: str | None = None) -> float | None:
        """Fraction of the roofline each rule reaches (see ``efficiency.py``)."""
        return table_efficiency(EFFICIENCY, rule, shape_class)

    @property
    def template_limits(self):
        """One contraction per kernel (dlight's matmul takes prologue / epilogue only);
        reductions never join a contraction, except in the whole float32 attention chain
        (``flash_attention.py``, any row count; parts of the chain are refused by legality,
        ``attention_parts=False``, and a whole chain the template declines is made
        infeasible by :meth:`gpu_kernel`); groups stay small enough for registers."""
        from ...legality import TemplateLimits

        return TemplateLimits(max_contractions=1, contraction_with_reduction=False,
                              max_nodes=32, attention=True, online_softmax=True,
                              attention_parts=False)

    def rule_for_group(self, graph, group) -> str | None:
        """The rule the list below will pick for the fused PrimFunc of ``group``."""
        return gpu_rule_for_group(graph, group)

    def gpu_kernel(self, graph, group, rule: str, hw: HardwareSpec):
        """The flash kernel's launch for the ``gpu`` cost model (``flash_attention.py``);
        infeasible for a part of an attention chain; None (the generic guess) otherwise."""
        return flash_kernel(graph, group, rule, hw)

    def schedule_rules(self, hw: HardwareSpec) -> Sequence[ScheduleRule]:
        """Most specific first; :class:`BindThreads` matches anything."""
        return (
            FlashAttention(),
            dr.dlight_matmul(),
            dr.dlight_gemv(),
            dr.dlight_reduction(),
            dr.dlight_general_reduction(),
            SimtContraction(),
            RowReduction(),
            dr.dlight_transpose(),
            dr.elementwise(),
            dr.dlight_fallback(),
            BindThreads(),
        )


def gpu_rule_for_group(graph, group) -> str:
    """Rule name for ``group``: what the rule list takes, from the graph alone.

    * the whole float32 attention chain with head dims that fit one thread is the
      online-softmax kernel (:func:`~.flash_attention.flash_group`);
    * a contraction whose output is one row (batch-1 fully connected) is a matrix-vector
      product, which dlight's Matmul declines and its Reduction rule schedules;
    * a contraction group publishing several tensors (a fused QKV projection sliced into
      three) is declined by dlight's Matmul: :class:`SimtContraction` takes it;
    * reductions: one reduction block with at most an epilogue is dlight's Reduction,
      chains (softmax, layer_norm, with prologues) the row template.
    """
    from ...legality import GroupKind
    from ...tir_analysis import shape_elems

    kind = template_kind(graph, group)
    nodes = [graph.nodes[i] for i in sorted(group)]
    if kind is GroupKind.CONTRACTION and flash_group(graph, group) is not None:
        return FlashAttention.name
    if kind is GroupKind.CONTRACTION:
        anchor = next(n for n in nodes if is_true_contraction(n))
        shape = graph.tensors[anchor.outputs[0]].shape
        rows = shape_elems(shape[:-1], graph.dims) if len(shape) > 1 else 1
        if rows <= 1:
            return "reduction"
        return "contraction" if published_outputs(graph, group) > 1 else "matmul"
    if kind is GroupKind.REDUCTION:
        return "reduction" if reduction_blocks(graph, group) == 1 and len(nodes) <= 2 \
            else "row_reduction"
    if kind is GroupKind.ELEMENTWISE:
        return "elementwise"
    return "fallback"


def published_outputs(graph, group) -> int:
    """Tensors of ``group`` read outside it (or returned)."""
    count = 0
    for n in group:
        t = graph.tensors[graph.nodes[n].outputs[0]]
        if t.escapes or any(c not in group for c in t.consumers) or not t.consumers:
            count += 1
    return count
