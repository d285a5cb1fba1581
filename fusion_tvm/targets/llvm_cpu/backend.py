"""The LLVM-CPU backend: x86/ARM CPUs through TVM's LLVM code generator."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import UnknownNameError
from ...hardware import DeviceKind, HardwareSpec
from ...kernel_model import KernelTraits, table_efficiency
from ...legality import TemplateLimits
from ..base import Backend, ScheduleRule, register_backend
from ._util import lanes
from .attention import ROW_TILE, Attention
from .conv2d import Conv2d
from .conv2d_nchwc import Conv2dNCHWc
from .efficiency import EFFICIENCY
from .elementwise import Elementwise
from .fallback import Fallback
from .flash_attention import FlashAttention
from .kernel_model import conv_kernel, group_parallel_regions
from .layout import ConvertToNCHWc
from .matmul import Matmul
from .pad_channels import PadChannels
from .pad_conv_channels import PadConvChannels
from .pad_conv_width import PadConvWidth
from .pointwise_conv import PointwiseConvAsMatmul
from .reduction import Reduction
from .staged_chain import StagedChain

#: Activation layouts for convolutions: blocked NCHW[b]c, or the model's own.
LAYOUTS = ("nchwc", "native")
#: Softmax forms of the attention template: online over key blocks, or whole rows.
SOFTMAX_FORMS = ("online", "rowwise")


@register_backend("llvm")
class LLVMCPUBackend(Backend):
    """CPU backend: schedule templates sized from the :class:`HardwareSpec`."""

    default_hardware = "host"

    def __init__(self, layout: str = "nchwc", softmax: str = "online"):
        """``layout="nchwc"`` converts convolutions to a blocked layout
        (:class:`~fusion_tvm.targets.llvm_cpu.layout.ConvertToNCHWc`); ``"native"`` keeps the
        model's NCHW. ``softmax="online"`` runs float32 attention chains with the
        online-softmax template (:class:`.FlashAttention`), ``"rowwise"`` with whole rows
        of scores (:class:`.Attention`) only. Pass e.g.
        ``target=LLVMCPUBackend(layout="native")`` to ``compile``."""
        if layout not in LAYOUTS:
            raise UnknownNameError(f"unknown layout '{layout}'; known: {', '.join(LAYOUTS)}")
        if softmax not in SOFTMAX_FORMS:
            raise UnknownNameError(
                f"unknown softmax form '{softmax}'; known: {', '.join(SOFTMAX_FORMS)}")
        self.layout = layout
        self.softmax = softmax

    def layout_passes(self, hw: HardwareSpec | None = None) -> list:
        """The NCHWc conversion, blocked to the SIMD width of ``hw`` (fp32 lanes), after
        channel counts no 8-lane block divides are padded through chains of convs
        (:mod:`.pad_channels`) and dense convs' output channels to the width
        (:mod:`.pad_conv_channels`); then the
        pointwise convs left in NCHW as matmuls (:mod:`.pointwise_conv`) and the other NCHW
        convs with narrow rows on padded rows (:mod:`.pad_conv_width`)."""
        if hw is None:
            return []
        width = lanes(hw, 32)
        nchw = [PointwiseConvAsMatmul(width), PadConvWidth(width)]
        if self.layout != "nchwc":
            return nchw
        return [PadChannels(width), PadConvChannels(width),
                ConvertToNCHWc(width, full_rate_lanes=hw.full_rate_lanes_fp32), *nchw]

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.CPU

    @property
    def template_limits(self) -> TemplateLimits:
        """One contraction per group (with a norm or softmax before or after it as a staged
        row pass, ``matmul.py``), an attention chain (``flash_attention.py`` for the
        whole float32 chain, any row count; ``attention.py`` otherwise), or a chain of
        weight matmuls as stages of one kernel (``staged_chain.py``)."""
        # Ragged query rows: the row-wise template runs one row at a time, measured 2x slower
        # than three kernels (ViT, S = 197), so such chains are not offered as one group.
        return TemplateLimits(row_stage=True, attention=True,
                              online_softmax=self.softmax == "online", staged_chains=True,
                              attention_row_block=ROW_TILE)

    def rule_efficiency(self, rule: str, shape_class: str | None = None) -> float | None:
        """Measured fraction of the roofline each rule reaches (see ``efficiency.py``)."""
        return table_efficiency(EFFICIENCY, rule, shape_class)

    def parallel_regions(self, graph, group: frozenset[int], rule: str, hw: HardwareSpec) -> int:
        """Parallel loops the rules give ``group``'s kernel: the cost model charges a
        fork/join for each (the same decision as the rules, see ``kernel_model.py``)."""
        return group_parallel_regions(graph, group, rule, hw)

    def kernel_traits(self, graph, group: frozenset[int], rule: str,
                      hw: HardwareSpec) -> KernelTraits | None:
        """Serial main loop, staged padded input and inlined-prologue recompute of the conv
        rules' kernels (``kernel_model.conv_kernel``); None for the other rules."""
        if rule != "conv2d":
            return None
        conv = next((graph.nodes[n] for n in sorted(group)
                     if graph.nodes[n].is_contraction), None)
        kernel = conv_kernel(graph, group, conv, hw) if conv is not None else None
        if kernel is None:
            return None
        return KernelTraits(kernel.rows_parallel, kernel.staged_bytes, dict(kernel.recompute),
                            kernel.regions, kernel.compute_scale)

    def hoists_broadcasts(self, rule: str) -> bool:
        """The contraction rules run their epilogue nests unfused, row-major, innermost
        loop vectorised: LLVM hoists a squeeze-excitation scale computed from a tiny conv
        out of the pixel loops (measured 38 us where per-pixel recompute priced 0.8 ms).
        The elementwise rule fuses its loops into one parallel loop (indices by div/mod):
        nothing is hoisted."""
        return rule in ("conv2d", "matmul")

    def schedule_rules(self, hw: HardwareSpec) -> Sequence[ScheduleRule]:
        """Most specific first; :class:`Fallback` matches anything."""
        online = (FlashAttention(),) if self.softmax == "online" else ()
        single = (Conv2dNCHWc(), Matmul(), Conv2d(), Reduction(), Elementwise(), Fallback())
        return (*online, Attention(), StagedChain(single), *single)
