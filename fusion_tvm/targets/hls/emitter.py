"""Emit a Vitis-HLS-style project from a fused, scheduled module.

The design is one ``DATAFLOW`` top function: a *load* process per model input (``m_axi``
pointer -> streams), one process per fused group (:mod:`.cgen`), and a *store* process
per output. Every tensor travels between processes through ``hls::stream`` FIFOs, one
per consumer, so each FIFO has one producer and one consumer as DATAFLOW requires. A
FIFO is 2 deep when it is its consumer's only stream input (read first and in order);
when the consumer reads several streams it holds the whole tensor, which keeps
reconvergent paths (residuals) free of deadlock.

Weights are ``static const`` ROM arrays while the BRAM budget allows (smallest first);
the rest stay in DDR behind ``m_axi`` ports and the testbench loads them from files.
Resources are accounted with :mod:`fusion_tvm.targets.hls.cost_model`; a design that cannot
fit the board raises :class:`~fusion_tvm.errors.CapacityError` naming the group and the
resource, after unroll factors have been lowered and weights moved off chip.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import CapacityError
from ...hardware import HardwareSpec
from .analysis import (
    UNROLL_ATTR,
    alloc_buffers,
    direct_ports,
    int_value,
    leaf_blocks,
    loop_annotation,
    stream_bound_blocks,
)
from .cgen import DataType, KernelPrinter, Port, cident, elem_ctype
from .cost_model import PROCESS_OVERHEAD, NestCost, bram_blocks, price_nest
from .program import Program

INCLUDE_DIR = Path(__file__).parent / "include"
TOP = "ft_top"


@dataclass
class Fifo:
    """One stream between two processes."""

    name: str
    tensor: int
    consumer: str  # kernel C name or the store process
    depth: int
    bram: int = 0


@dataclass
class KernelDesign:
    """One group's process, its ports and its resources."""

    index: int
    cname: str
    func_name: str
    func: object
    ports: dict[int, Port]
    nests: list[NestCost] = field(default_factory=list)
    unroll: dict[str, int] = field(default_factory=dict)
    io_cycles: float = 0.0
    bram_buffers: int = 0
    bram_rom: int = 0
    offchip_bytes: float = 0.0
    partitions: dict = field(default_factory=dict)
    code: str = ""
    proto: str = ""

    @property
    def dsp(self) -> float:
        return sum(n.dsp for n in self.nests)

    @property
    def ii(self) -> int:
        return max((n.ii for n in self.nests), default=1)

    @property
    def compute_cycles(self) -> float:
        return sum(n.cycles for n in self.nests)

    @property
    def cycles(self) -> float:
        return PROCESS_OVERHEAD + self.io_cycles + self.compute_cycles

    @property
    def bram(self) -> int:
        return self.bram_buffers + self.bram_rom


@dataclass
class Design:
    """A whole HLS design and its estimate."""

    program: Program
    hw: HardwareSpec
    dtype: DataType
    kernels: list[KernelDesign]
    fifos: list[Fifo]
    rom: list[int]  # tensor ids of on-chip weights
    offchip: list[int]  # tensor ids of off-chip weights
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------ estimates
    @property
    def dsp(self) -> float:
        return sum(k.dsp for k in self.kernels)

    @property
    def bram(self) -> int:
        return sum(k.bram for k in self.kernels) + sum(f.bram for f in self.fifos)

    def io_cycles(self) -> float:
        """Cycles of the load and store processes."""
        p = self.program
        return sum(p.tensors[t].elems for t in p.inputs) + \
            sum(p.tensors[t].elems for t in p.outputs)

    @property
    def latency_cycles(self) -> float:
        """One inference, processes one after another (buffered hand-offs): an upper bound."""
        return self.io_cycles() + sum(k.cycles for k in self.kernels) + \
            self.offchip_bytes() / self.hw.dram.bandwidth_bytes_per_s * self.hw.fpga.clock_hz

    @property
    def interval_cycles(self) -> float:
        """Initiation interval of the dataflow pipeline (the slowest process)."""
        p = self.program
        io = [p.tensors[t].elems for t in p.inputs + p.outputs]
        return max([k.cycles for k in self.kernels] + io + [1])

    def offchip_bytes(self) -> float:
        return sum(self.program.tensors[t].elems for t in self.offchip) * self.dtype.width / 8

    def resources(self) -> dict:
        """Estimated use and the board's budget."""
        f = self.hw.fpga
        return {
            "dsp": self.dsp, "dsp_budget": f.dsp, "bram_18k": self.bram,
            "bram_budget": f.bram_18k,
            "dsp_util": self.dsp / f.dsp, "bram_util": self.bram / f.bram_18k,
        }


# ------------------------------------------------------------------------ planning
def _bits(dtype: DataType, tensor_dtype: str) -> int:
    if tensor_dtype.startswith("float"):
        return dtype.width
    return 64 if "64" in tensor_dtype else 32


def plan_design(program: Program, hw: HardwareSpec, dtype: DataType) -> Design:
    """Ports, FIFOs, unroll factors and weight placement for ``program`` on ``hw``."""
    if hw.fpga is None:
        raise CapacityError(f"hardware '{hw.name}' is not an FPGA (no FpgaResources)")
    t = program.tensors
    kernels: list[KernelDesign] = []
    streams: dict[int, list[tuple[str, str, int]]] = {}  # tensor -> (fifo, consumer, param)
    uses: dict[int, int] = {}
    for kc in program.kernels:
        for tid in kc.args:
            uses[tid] = uses.get(tid, 0) + 1
    for kc in program.kernels:
        cname = cident(f"g{kc.index}_{kc.func_name}")[:60]
        ports = {}
        direct_in, direct_out = direct_ports(kc.func)
        for i, tid in enumerate(kc.args):
            if t[tid].kind == "weight":
                # a weight read by several processes gets one ROM (or m_axi port) each
                ports[i] = Port("rom", _weight_name("W", t[tid].name, kc.index, uses[tid]))
                continue
            name = f"s{tid}_g{kc.index}_{i}"
            ports[i] = Port("stream_in", name, direct=i in direct_in)
            streams.setdefault(tid, []).append((name, cname, i))
        kernels.append(KernelDesign(kc.index, cname, kc.func_name, kc.func, ports))
    for j, tid in enumerate(program.outputs):
        if t[tid].kind == "weight":
            raise CapacityError(f"output {j} is a constant; the HLS backend streams computed "
                                "tensors only")
        streams.setdefault(tid, []).append((f"s{tid}_out{j}", f"store_{j}", -1))
    for kd, kc in zip(kernels, program.kernels, strict=True):
        _, direct_out = direct_ports(kc.func)
        for j, tid in enumerate(kc.outs):
            p = len(kc.args) + j
            names = [s[0] for s in streams.get(tid, [])]
            kd.ports[p] = Port("stream_out", f"o{j}", streams=names, direct=p in direct_out)
    fifos = []
    for tid, uses in streams.items():
        for name, consumer, param in uses:
            depth = t[tid].elems
            if param >= 0:
                kd = next(k for k in kernels if k.cname == consumer)
                n_streams = sum(1 for p in kd.ports.values() if p.kind == "stream_in")
                # A process with one stream input reads it first and in order (directly or
                # into its buffer), so the FIFO never fills while the producer waits on it.
                if n_streams == 1:
                    depth = 2
            else:
                depth = 2
            fifos.append(Fifo(name, tid, consumer, depth,
                              bram_blocks(depth, _bits(dtype, t[tid].dtype))))
    design = Design(program, hw, dtype, kernels, fifos, [], [])
    _price(design, unroll_from_annotations=True)
    _fit(design)
    return design


def _weight_name(prefix: str, name: str, kernel: int, uses: int) -> str:
    return f"{prefix}_{cident(name)}" + (f"_g{kernel}" if uses > 1 else "")


def weight_ports(design: Design, kind: str) -> list[tuple[str, int]]:
    """(C name, tensor id) of every ROM (``kind="rom"``) or m_axi weight port."""
    out: dict[str, int] = {}
    for kd in design.kernels:
        args = design.program.kernels[kd.index].args
        for i, port in kd.ports.items():
            if port.kind == kind:
                out[port.cname] = args[i]
    return sorted(out.items())


def _price(design: Design, unroll_from_annotations: bool = False) -> None:
    """Nests, BRAM and I/O cycles of every kernel (prints it to learn its partitions)."""
    dt = design.dtype
    fixed = dt.is_fixed
    for kd in design.kernels:
        leaves = leaf_blocks(kd.func)
        if unroll_from_annotations:
            for lb in leaves:
                u = loop_annotation(lb.loops[-1], UNROLL_ATTR) if lb.loops else None
                kd.unroll[lb.name] = u or 1
        bound = stream_bound_blocks(kd.func)
        kd.nests = [price_nest(lb.nest(lb.name in bound), fixed, kd.unroll.get(lb.name, 1))
                    for lb in leaves]
        printer = KernelPrinter(kd.func, kd.cname, kd.ports, dt, kd.unroll)
        kd.proto, kd.code = printer.print()
        kd.partitions = printer.partitions
        part = {name: f for (name, _), f in printer.partitions.items()}
        blocks = 0
        io = 0.0
        acc_bits = 32 if dt.is_fixed else dt.width
        for b in alloc_buffers(kd.func):
            elems = math.prod(int_value(d) for d in b.shape)
            cname = f"b_{cident(b.name)}"
            bits = acc_bits if cname in printer.accum else _bits(dt, str(b.dtype))
            blocks += bram_blocks(elems, bits, part.get(cname, 1))
        rom = 0
        offchip = 0.0
        for i, p in enumerate(kd.func.params):
            port = kd.ports[i]
            elems = math.prod(int_value(d) for d in p.shape)
            if port.kind == "stream_in" and not port.direct:
                blocks += bram_blocks(elems, dt.width, part.get(f"{port.cname}_buf", 1))
                io += elems
            elif port.kind == "stream_out" and not port.direct:
                local = f"{port.cname}_buf"
                bits = acc_bits if local in printer.accum else dt.width
                blocks += bram_blocks(elems, bits, part.get(local, 1))
                io += elems * len(port.streams)
            elif port.kind == "rom":
                rom += bram_blocks(elems, dt.width, part.get(port.cname, 1))
            elif port.kind == "offchip":
                offchip += elems * dt.width / 8
        kd.bram_buffers, kd.bram_rom, kd.offchip_bytes, kd.io_cycles = blocks, rom, offchip, io


def _fit(design: Design) -> None:
    """Lower unroll factors and move weights off chip until the design fits, or raise."""
    f = design.hw.fpga
    fixed = design.dtype.is_fixed
    # DSP: halve the unroll of the nest using most DSPs until the total fits.
    changed = False
    while design.dsp > f.dsp:
        best = None
        for kd in design.kernels:
            for n in kd.nests:
                if n.unroll > 1 and (best is None or n.dsp > best[1].dsp):
                    best = (kd, n)
        if best is None:
            worst = max(design.kernels, key=lambda k: k.dsp)
            raise CapacityError(
                f"group '{worst.func_name}' needs {worst.dsp:.0f} DSP at unroll 1 (design "
                f"total {design.dsp:.0f}); the {design.hw.name} board has {f.dsp} DSP"
            )
        kd, n = best
        kd.unroll[n.name] = n.unroll // 2
        kd.nests = [price_nest(x, fixed, kd.unroll.get(x.name, 1)) for x in kd.nests]
        changed = True
    if changed:
        _price(design)
        design.notes.append("unroll factors lowered to fit the board's DSPs")
    # BRAM: buffers and FIFOs must fit; weights go on chip smallest first while they fit.
    fixed_bram = sum(k.bram_buffers for k in design.kernels) + sum(x.bram for x in design.fifos)
    if fixed_bram > f.bram_18k:
        worst = max(design.kernels, key=lambda k: k.bram_buffers)
        raise CapacityError(
            f"group '{worst.func_name}' needs {worst.bram_buffers} BRAM18K for its on-chip "
            f"buffers (design total {fixed_bram} with FIFOs); the {design.hw.name} board has "
            f"{f.bram_18k} BRAM18K"
        )
    t = design.program.tensors
    weights: dict[int, list[tuple[KernelDesign, int]]] = {}
    for kd in design.kernels:
        for i, port in kd.ports.items():
            if port.kind in ("rom", "offchip"):
                weights.setdefault(design.program.kernels[kd.index].args[i], []).append((kd, i))
    used = fixed_bram
    budget = f.bram_18k
    rom, off = [], []
    for tid in sorted(weights, key=lambda x: t[x].elems):
        blocks = 0
        for kd, i in weights[tid]:
            part = {name: fct for (name, _), fct in kd.partitions.items()}
            blocks += bram_blocks(t[tid].elems, design.dtype.width,
                                  part.get(kd.ports[i].cname, 1))
        if used + blocks <= budget:
            used += blocks
            rom.append(tid)
        else:
            off.append(tid)
            for kd, i in weights[tid]:
                n_uses = len(weights[tid])
                kd.ports[i] = Port("offchip", _weight_name("M", t[tid].name, kd.index, n_uses))
    design.rom, design.offchip = rom, off
    if off:
        design.notes.append(f"{len(off)} weight tensor(s) kept off chip (m_axi): BRAM budget")
    _price(design)


# --------------------------------------------------------------------------- files
def _c_array(values: np.ndarray, per_line: int = 8) -> str:
    if not np.issubdtype(values.dtype, np.floating):
        flat = [str(int(v)) for v in values.reshape(-1)]
    else:
        flat = [f"{float(v)!r}f" if np.isfinite(v) else
                ("NAN" if np.isnan(v) else ("INFINITY" if v > 0 else "-INFINITY"))
                for v in values.reshape(-1)]
    rows = [", ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line)]
    return "{\n  " + ",\n  ".join(rows) + "\n}"


def _weights_header(design: Design) -> str:
    """ROM arrays. Float ROMs are plain initialised arrays. Fixed-point ROMs are
    initialised from float literals for synthesis; for g++ they are filled once from a
    float image, because thousands of class-type initialisers make g++ crawl."""
    t = design.program.tensors
    fixed = design.dtype.is_fixed
    w = ["// On-chip weights (ROM). Generated by fusion_tvm.", "#ifndef FT_WEIGHTS_H_",
         "#define FT_WEIGHTS_H_", '#include "model.h"', ""]
    init = ["void ft_init_roms() {"]
    if fixed:
        init += ["#if !FT_VENDOR", "  static bool done = false;", "  if (done) return;",
                 "  done = true;"]
    for name, tid in weight_ports(design, "rom"):
        dims = "".join(f"[{d}]" for d in t[tid].shape) or "[1]"
        values = _c_array(t[tid].data)
        ctype = elem_ctype(t[tid].dtype)
        if not fixed or ctype != "data_t":
            w.append(f"static const {ctype} {name}{dims} = {values};")
            continue
        macro = values.replace("\n", " \\\n")
        w += [f"#define {name}_INIT {macro}", "#if FT_VENDOR",
              f"static const data_t {name}{dims} = {name}_INIT;", "#else",
              f"static const float {name}_f{dims} = {name}_INIT;", f"static data_t {name}{dims};",
              "#endif"]
        init += [f"  for (int i = 0; i < {t[tid].elems}; ++i) {{",
                 f"    reinterpret_cast<data_t*>({name})[i] = "
                 f"data_t(reinterpret_cast<const float*>({name}_f)[i]);", "  }"]
    if fixed:
        init.append("#endif")
    init.append("}")
    w += ["", *init, "", "#endif", ""]
    return "\n".join(w)


def top_signature(design: Design) -> tuple[list[str], list[tuple[str, int, int]]]:
    """Parameters of the top function and (name, tensor id, elems) of each m_axi port."""
    p = design.program
    params, axi = [], []
    for k, tid in enumerate(p.inputs):
        params.append(f"const {elem_ctype(p.tensors[tid].dtype)}* in{k}")
        axi.append((f"in{k}", tid, p.tensors[tid].elems))
    for j, tid in enumerate(p.outputs):
        params.append(f"{elem_ctype(p.tensors[tid].dtype)}* out{j}")
        axi.append((f"out{j}", tid, p.tensors[tid].elems))
    for name, tid in weight_ports(design, "offchip"):
        params.append(f"const {elem_ctype(p.tensors[tid].dtype)}* {name}")
        axi.append((name, tid, p.tensors[tid].elems))
    return params, axi


def emit_files(design: Design, board_part: str = "") -> dict[str, str]:
    """The project's text files by relative path."""
    p = design.program
    t = p.tensors
    dt = design.dtype
    params, axi = top_signature(design)
    files: dict[str, str] = {}
    files["include/ft_hls.h"] = (INCLUDE_DIR / "ft_hls.h").read_text()
    files["model.h"] = "\n".join([
        "// Generated by fusion_tvm (HLS backend). Do not edit.",
        "#ifndef FT_MODEL_H_", "#define FT_MODEL_H_", '#include "ft_hls.h"', "",
        f"typedef {dt.ctype} data_t;", f"typedef {dt.accum_ctype} accum_t;", "",
        *[f"static const int IN{k}_SIZE = {t[tid].elems};" for k, tid in enumerate(p.inputs)],
        *[f"static const int OUT{j}_SIZE = {t[tid].elems};" for j, tid in enumerate(p.outputs)],
        "", f"void {TOP}({', '.join(params)});",
        "// C simulation only: fills fixed-point ROMs from their float images (no-op else).",
        "void ft_init_roms();", "", "#endif", "",
    ])
    files["weights.h"] = _weights_header(design)

    body = ["// Dataflow design generated by fusion_tvm (HLS backend).", '#include "model.h"',
            '#include "weights.h"', ""]
    streams_by_tensor: dict[int, list[str]] = {}
    for f in design.fifos:
        streams_by_tensor.setdefault(f.tensor, []).append(f.name)
    for k, tid in enumerate(p.inputs):
        outs = streams_by_tensor.get(tid, [])
        ct = elem_ctype(t[tid].dtype)
        sig = ", ".join([f"const {ct}* src"] + [f"hls::stream<{ct}>& {s}" for s in outs])
        body += [f"static void load_in{k}({sig}) {{", "#pragma HLS INLINE off",
                 f"  L_load: for (int i = 0; i < {t[tid].elems}; ++i) {{",
                 "#pragma HLS PIPELINE II=1", f"    const {ct} v = src[i];",
                 *[f"    {s}.write(v);" for s in outs], "  }", "}", ""]
    for j, tid in enumerate(p.outputs):
        s = f"s{tid}_out{j}"
        ct = elem_ctype(t[tid].dtype)
        body += [f"static void store_{j}(hls::stream<{ct}>& {s}, {ct}* dst) {{",
                 "#pragma HLS INLINE off",
                 f"  L_store: for (int i = 0; i < {t[tid].elems}; ++i) {{",
                 "#pragma HLS PIPELINE II=1", f"    dst[i] = {s}.read();", "  }", "}", ""]
    for kd in design.kernels:
        kc = p.kernels[kd.index]
        body += [f"// group {kd.index}: {kc.func_name}  (est. {kd.cycles:.0f} cycles, "
                 f"II={kd.ii}, {kd.dsp:.0f} DSP, {kd.bram} BRAM18K)", "static " + kd.code, ""]
    top = [f"void {TOP}({', '.join(params)}) {{"]
    for name, _, elems in axi:
        bundle = f"gmem_{name}"
        top.append(f"#pragma HLS INTERFACE m_axi port={name} offset=slave bundle={bundle} "
                   f"depth={elems}")
    top += ["#pragma HLS INTERFACE s_axilite port=return", "#pragma HLS DATAFLOW"]
    for f in design.fifos:
        ct = elem_ctype(t[f.tensor].dtype)
        top.append(f'  hls::stream<{ct}> {f.name}("{f.name}");')
        top.append(f"#pragma HLS STREAM variable={f.name} depth={f.depth}")
    for k, tid in enumerate(p.inputs):
        args = [f"in{k}"] + streams_by_tensor.get(tid, [])
        top.append(f"  load_in{k}({', '.join(args)});")
    for kd in design.kernels:
        args = []
        for i in range(len(kd.func.params)):
            port = kd.ports[i]
            if port.kind == "stream_in":
                args.append(port.cname)
            elif port.kind == "stream_out":
                args.extend(port.streams)
            elif port.kind == "offchip":
                args.append(port.cname)
        top.append(f"  {kd.cname}({', '.join(args)});")
    for j, tid in enumerate(p.outputs):
        top.append(f"  store_{j}(s{tid}_out{j}, out{j});")
    top.append("}")
    files["model.cpp"] = "\n".join(body + top) + "\n"
    files["tb.cpp"] = _testbench(design, axi)
    files["run_hls.tcl"] = _tcl(design, board_part)
    return files


def _testbench(design: Design, axi) -> str:
    t = design.program.tensors
    lines = [
        "// C-simulation testbench generated by fusion_tvm: raw binary files in and out",
        "// (float tensors as float32, integer tensors in their own type).",
        "// usage: csim <io dir with in<k>.bin> <weights dir>   (writes out<j>.bin)",
        '#include <memory>', '#include <string>', '#include "model.h"', "",
        "// Read n values of file type F and convert them to T (no std::vector: <bool>).",
        "template <typename F, typename T>",
        "static std::unique_ptr<T[]> load(const std::string& path, int n, bool* ok) {",
        "  std::unique_ptr<F[]> f(new F[n]());",
        '  FILE* fp = std::fopen(path.c_str(), "rb");',
        "  if (!fp || std::fread(f.get(), sizeof(F), n, fp) != static_cast<size_t>(n)) {",
        '    std::fprintf(stderr, "cannot read %d values from %s\\n", n, path.c_str());',
        "    *ok = false;", "  }",
        "  if (fp) std::fclose(fp);",
        "  std::unique_ptr<T[]> v(new T[n]());",
        "  for (int i = 0; i < n; ++i) v[i] = T(f[i]);", "  return v;", "}", "",
        "template <typename F, typename T>",
        "static bool save(const std::string& path, const T* v, int n) {",
        "  std::unique_ptr<F[]> f(new F[n]());",
        "  for (int i = 0; i < n; ++i) f[i] = static_cast<F>(v[i]);",
        '  FILE* fp = std::fopen(path.c_str(), "wb");',
        "  if (!fp) return false;",
        "  const bool ok = std::fwrite(f.get(), sizeof(F), n, fp) == static_cast<size_t>(n);",
        "  std::fclose(fp);", "  return ok;", "}", "",
        "int main(int argc, char** argv) {",
        '  const std::string io = argc > 1 ? argv[1] : ".";',
        '  const std::string wdir = argc > 2 ? argv[2] : "weights";',
        "  bool ok = true;",
    ]
    args = []
    for name, tid, elems in axi:
        ct = elem_ctype(t[tid].dtype)
        ft_ = "float" if ct == "data_t" else ct
        if name.startswith("in"):
            lines.append(f'  std::unique_ptr<{ct}[]> {name} = load<{ft_}, {ct}>(io + '
                         f'"/{name}.bin", {elems}, &ok);')
        elif name.startswith("out"):
            lines.append(f"  std::unique_ptr<{ct}[]> {name}(new {ct}[{elems}]());")
        else:
            lines.append(f'  std::unique_ptr<{ct}[]> {name} = load<{ft_}, {ct}>(wdir + '
                         f'"/{t[tid].name}.bin", {elems}, &ok);')
        args.append(f"{name}.get()")
    lines += ["  if (!ok) return 2;", "  ft_init_roms();", f"  {TOP}({', '.join(args)});"]
    for name, tid, elems in axi:
        if name.startswith("out"):
            ct = elem_ctype(t[tid].dtype)
            ft_ = "float" if ct == "data_t" else ct
            lines.append(f'  if (!save<{ft_}>(io + "/{name}.bin", {name}.get(), {elems})) '
                         "return 3;")
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def _tcl(design: Design, board_part: str) -> str:
    hw = design.hw
    period = 1e9 / hw.fpga.clock_hz
    part = board_part or str(hw.target.get("mcpu", ""))
    return "\n".join([
        "# Vitis HLS script generated by fusion_tvm: C simulation, then synthesis.",
        "# usage: vitis_hls -f run_hls.tcl   (csim reads io/in*.bin, weights/*.bin)",
        "open_project -reset ft_hls_prj",
        f"set_top {TOP}",
        'add_files model.cpp -cflags "-Iinclude -std=c++14 -DFT_USE_VENDOR_HLS"',
        'add_files -tb tb.cpp -cflags "-Iinclude -std=c++14 -DFT_USE_VENDOR_HLS"',
        "add_files -tb io", "add_files -tb weights",
        "open_solution -reset sol1 -flow_target vivado",
        f"set_part {{{part}}}",
        f"create_clock -period {period:.2f} -name default",
        'csim_design -argv "io weights"',
        "csynth_design",
        "exit", "",
    ])


def write_project(design: Design, path: Path) -> Path:
    """Write the project folder (sources, weights, report) at ``path``."""
    path = Path(path)
    (path / "include").mkdir(parents=True, exist_ok=True)
    (path / "weights").mkdir(exist_ok=True)
    (path / "io").mkdir(exist_ok=True)
    for rel, text in emit_files(design).items():
        (path / rel).write_text(text)
    t = design.program.tensors
    for tid in design.offchip:
        data = t[tid].data
        data = data.astype(np.float32) if np.issubdtype(data.dtype, np.floating) else data
        data.tofile(path / "weights" / f"{t[tid].name}.bin")
    return path


def design_summary(design: Design) -> dict:
    """JSON-ready estimate of the design."""
    hw = design.hw
    clk = hw.fpga.clock_hz
    return {
        "board": hw.name,
        "precision": design.dtype.ctype,
        "clock_mhz": clk / 1e6,
        "groups": [
            {
                "index": kd.index, "function": kd.cname, "prim_func": kd.func_name,
                "cycles": kd.cycles, "ii": kd.ii, "dsp": kd.dsp, "bram_18k": kd.bram,
                "bram_rom": kd.bram_rom, "offchip_bytes": kd.offchip_bytes,
                "nests": [{"block": n.name, "trips": n.trips, "unroll": n.unroll, "ii": n.ii,
                           "depth": n.depth, "cycles": n.cycles, "dsp": n.dsp}
                          for n in kd.nests],
            }
            for kd in design.kernels
        ],
        "fifos": [{"name": f.name, "depth": f.depth, "bram_18k": f.bram} for f in design.fifos],
        "weights_on_chip": [t_.name for t_ in (design.program.tensors[i] for i in design.rom)],
        "weights_off_chip": [t_.name for t_ in
                             (design.program.tensors[i] for i in design.offchip)],
        "latency_cycles": design.latency_cycles,
        "latency_us": design.latency_cycles / clk * 1e6,
        "interval_cycles": design.interval_cycles,
        "resources": design.resources(),
        "notes": list(design.notes),
    }


def write_report(design: Design, path: Path) -> None:
    """``report.json`` next to the sources."""
    (Path(path) / "report.json").write_text(json.dumps(design_summary(design), indent=2))
