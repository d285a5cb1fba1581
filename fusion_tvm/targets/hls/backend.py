"""The HLS backend: fused groups -> a Vitis-HLS-style C++ dataflow project.

No HLS tool is needed to use it: the project is verified by C simulation with g++
(``HLSModel.run``), and latency and resources are estimated analytically
(``HLSModel.report``) with the same model that guided fusion
(:mod:`fusion_tvm.targets.hls.cost_model`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...errors import InputMismatchError, InternalError
from ...hardware import DeviceKind, HardwareSpec
from ..base import Backend, ScheduleRule, register_backend
from .cgen import DataType
from .cost_model import FpgaConfig
from .emitter import Design, design_summary, plan_design, write_project, write_report
from .program import extract_program
from .rules import HlsAnnotateOnly, HlsPipeline

#: Compiler used for the C simulation; overridable with $FUSION_TVM_CXX.
CXX = os.environ.get("FUSION_TVM_CXX", "g++")
CXXFLAGS = ("-std=c++14", "-O1", "-Wno-unknown-pragmas", "-Iinclude")


@register_backend("hls")
class HLSBackend(Backend):
    """FPGA backend emitting HLS C++ (one dataflow process per fused group).

    Parameters
    ----------
    precision : str
        ``"float"`` or a fixed-point type such as ``"ap_fixed<16,6>"`` (round to nearest,
        saturate unless the quantisation / overflow modes are given).
    dsp_share : float
        Fraction of the board's DSPs one group may use when choosing unroll factors.
    """

    default_hardware = "zcu104"
    default_cost_model = "fpga"
    fast_math = False  # polynomial exp/erf would cost many DSPs

    def __init__(self, precision: str = "float", dsp_share: float = 0.25):
        self.dtype = DataType.parse(precision)
        self.precision = precision
        self.fpga_config = FpgaConfig(
            fixed_bits=self.dtype.width if self.dtype.is_fixed else None, dsp_share=dsp_share
        )

    @property
    def device_kind(self) -> DeviceKind:
        return DeviceKind.FPGA

    @property
    def template_limits(self):
        """HLS prints any TIR: several contractions and reductions may share a group.

        What bounds a group is on-chip memory and DSPs, which the cost model checks.
        """
        from ...legality import TemplateLimits

        return TemplateLimits(max_contractions=4, contraction_with_reduction=True, max_nodes=24)

    def rule_for_group(self, graph, group) -> str | None:
        from ...legality import classify

        return f"hls.{classify(graph, group).value}"

    def model_options(self, cost_model: str) -> FpgaConfig | None:
        """The FPGA model prices groups in this backend's precision and DSP budget."""
        return self.fpga_config if cost_model == "fpga" else None

    def schedule_rules(self, hw: HardwareSpec) -> Sequence[ScheduleRule]:
        return (HlsPipeline(self.fpga_config), HlsAnnotateOnly(self.fpga_config))

    def build_model(self, mod, loaded, parts, plan):
        start = time.perf_counter()
        program = extract_program(mod)
        design = plan_design(program, parts.hw, self.dtype)
        return HLSModel(design, loaded, plan, mod, time.perf_counter() - start)


class HLSModel:
    """An emitted HLS design: export it, simulate it with g++, read its estimate.

    Attributes
    ----------
    design : Design
        Ports, FIFOs, weights placement and per-group estimates.
    plan : FusionPlan or None
    num_kernels : int
        Dataflow processes computing groups (load / store processes excluded).
    fused_mod : IRModule
    """

    def __init__(self, design: Design, loaded, plan, fused_mod, build_time_s: float = 0.0):
        self.design = design
        self.loaded = loaded
        self.plan = plan
        self.fused_mod = fused_mod
        self.hw = design.hw
        self.compile_time_s = build_time_s
        self.num_kernels = len(design.kernels)
        self._build_dir: Path | None = None
        self._binary: Path | None = None

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.loaded.input_names

    # ------------------------------------------------------------------ export
    def export(self, path: str | os.PathLike, feeds=None) -> str:
        """Write the project folder (C++ sources, header, weights, TCL, report.json).

        With ``feeds``, ``io/in<k>.bin`` are written too, so ``vitis_hls -f run_hls.tcl``
        (or ``csim io weights`` after a g++ build) simulates on them.
        """
        path = Path(path)
        write_project(self.design, path)
        write_report(self.design, path)
        if feeds is not None:
            for k, a in enumerate(self._check_feeds(feeds)):
                np.ascontiguousarray(a).tofile(path / "io" / f"in{k}.bin")
        return os.fspath(path)

    # ------------------------------------------------------------------ C sim
    def compile_csim(self) -> Path:
        """Build the C simulation binary once (cached for this model)."""
        if self._binary is not None and self._binary.exists():
            return self._binary
        self._build_dir = Path(tempfile.mkdtemp(prefix="fusion_tvm_hls_"))
        self.export(self._build_dir)
        exe = self._build_dir / "csim"
        cmd = [CXX, *CXXFLAGS, "model.cpp", "tb.cpp", "-o", str(exe)]
        proc = subprocess.run(cmd, cwd=self._build_dir, capture_output=True, text=True)
        if proc.returncode != 0:
            raise InternalError(
                f"g++ failed on the emitted HLS project in {self._build_dir}:\n"
                f"{proc.stderr[-4000:]}"
            )
        self._binary = exe
        return exe

    def run(self, feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the C simulation on ``feeds``; returns the outputs as float32 arrays."""
        arrays = self._check_feeds(feeds)
        exe = self.compile_csim()
        io = Path(tempfile.mkdtemp(prefix="io_", dir=self._build_dir))
        try:
            for k, a in enumerate(arrays):
                np.ascontiguousarray(a).tofile(io / f"in{k}.bin")
            proc = subprocess.run([str(exe), str(io), str(self._build_dir / "weights")],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise InternalError(f"C simulation failed ({proc.returncode}): "
                                    f"{proc.stderr[-2000:]}")
            p = self.design.program
            return [np.fromfile(io / f"out{j}.bin", dtype=p.tensors[tid].dtype).reshape(s)
                    for j, (tid, s) in enumerate(zip(p.outputs, p.output_shapes, strict=True))]
        finally:
            shutil.rmtree(io, ignore_errors=True)

    def _check_feeds(self, feeds) -> list[np.ndarray]:
        names = list(self.loaded.input_names)
        if isinstance(feeds, Mapping):
            missing = [n for n in names if n not in feeds]
            unknown = sorted(set(feeds) - set(names))
            if missing or unknown:
                raise InputMismatchError(f"inputs do not match the model: missing {missing}, "
                                         f"unknown {unknown}; expected {names}")
            arrays = [np.asarray(feeds[n]) for n in names]
        else:
            arrays = [np.asarray(a) for a in feeds]
            if len(arrays) != len(names):
                raise InputMismatchError(f"the model takes {len(names)} inputs {names}, got "
                                         f"{len(arrays)}")
        p = self.design.program
        for name, a, tid in zip(names, arrays, p.inputs, strict=True):
            want = p.tensors[tid].shape
            if tuple(a.shape) != tuple(want):
                raise InputMismatchError(f"input '{name}' has shape {a.shape}, the design "
                                         f"expects {want}")
            if str(a.dtype) != p.tensors[tid].dtype:
                raise InputMismatchError(f"input '{name}' has dtype {a.dtype}, the design "
                                         f"expects {p.tensors[tid].dtype}")
        return arrays

    # ----------------------------------------------------------------- report
    def summary(self) -> dict:
        """The estimate as a dict (also written to ``report.json`` by :meth:`export`)."""
        return design_summary(self.design)

    def report(self) -> str:
        """Per-group cycles, II, DSP, BRAM; end-to-end latency; resources vs the board."""
        s = self.summary()
        r = s["resources"]
        lines = [
            f"HLS design for {s['board']} at {s['clock_mhz']:.0f} MHz, data type "
            f"{s['precision']}",
            "",
            f"{'#':>3}  {'group':<44} {'cycles':>9} {'II':>3} {'DSP':>6} {'BRAM18K':>8}",
        ]
        for g in s["groups"]:
            lines.append(f"{g['index']:>3}  {g['prim_func'][:44]:<44} {g['cycles']:>9.0f} "
                         f"{g['ii']:>3} {g['dsp']:>6.0f} {g['bram_18k']:>8}")
        fifo_bram = sum(f["bram_18k"] for f in s["fifos"])
        lines += [
            f"     {'FIFOs (' + str(len(s['fifos'])) + ')':<44} {'':>9} {'':>3} {'':>6} "
            f"{fifo_bram:>8}",
            "",
            f"end-to-end latency: {s['latency_cycles']:.0f} cycles = {s['latency_us']:.2f} us "
            f"(dataflow interval {s['interval_cycles']:.0f} cycles)",
            f"DSP  {r['dsp']:.0f} / {r['dsp_budget']} ({r['dsp_util']:.1%})",
            f"BRAM {r['bram_18k']} / {r['bram_budget']} ({r['bram_util']:.1%})",
            f"weights on chip: {len(s['weights_on_chip'])}, off chip (m_axi): "
            f"{len(s['weights_off_chip'])}",
        ]
        lines += [f"note: {n}" for n in s["notes"]]
        return "\n".join(lines)

    def with_precision(self, precision: str) -> HLSModel:
        """The same fused design re-emitted with another data type (e.g. float vs fixed)."""
        design = plan_design(self.design.program, self.hw, DataType.parse(precision))
        return HLSModel(design, self.loaded, self.plan, self.fused_mod)

    def precision_error(self, feeds, reference: Sequence[np.ndarray] | None = None) -> dict:
        """Error of this design's outputs vs ``reference`` (default: its float version)."""
        if reference is None:
            reference = (self if not self.design.dtype.is_fixed
                         else self.with_precision("float")).run(feeds)
        out = self.run(feeds)
        err = [np.abs(o.astype(np.float64) - r) for o, r in zip(out, reference, strict=True)]
        return {
            "precision": self.design.dtype.ctype,
            "max_abs_error": float(max(e.max() for e in err)),
            "mean_abs_error": float(np.mean([e.mean() for e in err])),
            "max_ref": float(max(np.abs(r).max() for r in reference)),
        }

    def __del__(self):
        d = getattr(self, "_build_dir", None)
        if d is not None and os.environ.get("FUSION_TVM_KEEP_HLS") is None:
            shutil.rmtree(d, ignore_errors=True)
