"""TIR -> HLS C++: one C++ function per (fused, annotated) PrimFunc.

Each PrimFunc parameter becomes a *port* chosen by the design (:mod:`.emitter`):

* ``stream_in``  -- an ``hls::stream`` read in order. When the parameter is loaded once,
  by an identity-indexed elementwise block, it is read *directly* (``s.read()`` in the
  pipeline); otherwise it is first copied into a local buffer.
* ``stream_out`` -- written to one stream per consumer, directly from an identity-indexed
  store, or from a local buffer after the computation.
* ``rom``        -- a ``static const`` weight array (on-chip ROM), indexed in its shape.
* ``offchip``    -- a ``const data_t*`` in DDR behind an ``m_axi`` port, indexed flat.

Float tensors are ``data_t`` (float or ``ap_fixed``); integer tensors (token ids, masks)
keep their C integer type, in streams as in arrays.

Loops carry the schedule rule's ``hls.pipeline_ii`` / ``hls.unroll`` annotations, printed
as ``#pragma HLS PIPELINE`` / ``UNROLL``; arrays indexed by an unrolled loop are
partitioned cyclically on that dimension so the unrolled accesses hit separate banks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tvm import s_tir, tirx

from ...errors import UnsupportedOperatorError
from .analysis import (
    PIPELINE_ATTR,
    UNROLL_ATTR,
    alloc_buffers,
    buffer_accesses,
    children,
    dtype_of,
    int_value,
    leaf_blocks,
    loop_annotation,
)

_UNARY = {
    "tirx.exp": "exp", "tirx.log": "log", "tirx.sqrt": "sqrt", "tirx.rsqrt": "rsqrt",
    "tirx.tanh": "tanh", "tirx.erf": "erf", "tirx.sigmoid": "sigmoid", "tirx.fabs": "fabs",
    "tirx.floor": "floor", "tirx.ceil": "ceil", "tirx.round": "round",
    "tirx.nearbyint": "round", "tirx.trunc": "trunc", "tirx.sin": "sin", "tirx.cos": "cos",
}
_BINOP = {
    tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.EQ: "==", tirx.NE: "!=", tirx.LT: "<",
    tirx.LE: "<=", tirx.GT: ">", tirx.GE: ">=", tirx.And: "&&", tirx.Or: "||",
    tirx.LShift: "<<", tirx.RShift: ">>", tirx.BitwiseAnd: "&", tirx.BitwiseOr: "|",
    tirx.BitwiseXor: "^",
}
_BIT_CALLS = {"shift_left": "<<", "shift_right": ">>", "bitwise_and": "&", "bitwise_or": "|",
              "bitwise_xor": "^"}
_INT_CTYPES = {"int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
               "uint8": "uint8_t", "uint32": "uint32_t", "uint64": "uint64_t", "bool": "bool"}


def elem_ctype(dtype: str) -> str:
    """C type of one element of a tensor of ``dtype`` (floats are ``data_t``)."""
    if dtype.startswith(("float", "bfloat")):
        return "data_t"
    if dtype in _INT_CTYPES:
        return _INT_CTYPES[dtype]
    raise UnsupportedOperatorError(f"dtype {dtype}", "", "no C++ type in the HLS emitter")


def cident(name: str) -> str:
    """A valid C identifier for ``name``."""
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"_{s}"


@dataclass(frozen=True)
class DataType:
    """The element type of float tensors in the design."""

    ctype: str = "float"  # the C++ spelling of data_t
    width: int = 32
    int_bits: int | None = None  # fixed point only

    @property
    def is_fixed(self) -> bool:
        return self.int_bits is not None

    @classmethod
    def parse(cls, precision: str | None) -> DataType:
        """``"float"`` or ``"ap_fixed<W,I>"`` / ``"ap_fixed<W,I,AP_RND,AP_SAT>"``."""
        if precision in (None, "", "float", "float32"):
            return cls()
        m = re.fullmatch(r"\s*ap_fixed\s*<\s*(\d+)\s*,\s*(-?\d+)\s*(,[\w\s,]+)?>\s*", precision)
        if not m:
            raise ValueError(f"precision must be 'float' or 'ap_fixed<W,I[,Q,O]>', got "
                             f"{precision!r}")
        w, i = int(m.group(1)), int(m.group(2))
        if not 2 <= w <= 32:
            raise ValueError(f"ap_fixed width must be 2..32, got {w}")
        modes = m.group(3) or ", AP_RND, AP_SAT"
        return cls(f"ap_fixed<{w}, {i}{modes.replace(' ', '').replace(',', ', ')}>", w, i)

    @property
    def accum_ctype(self) -> str:
        """Accumulators: 6 more integer bits (sums of up to 64 terms) and up to 8 more
        fractional bits, within the 32 bits the C-simulation type supports."""
        if not self.is_fixed:
            return self.ctype
        frac = self.width - self.int_bits
        ib = self.int_bits + 6
        frac_a = max(frac, min(frac + 8, 32 - ib))
        if ib + frac_a > 32:  # keep the fraction, give up integer headroom
            ib = max(self.int_bits, 32 - frac_a)
        w = min(ib + frac_a, 32)
        tail = self.ctype[self.ctype.index(",", self.ctype.index(",") + 1):] \
            if self.ctype.count(",") >= 2 else ">"
        return f"ap_fixed<{w}, {ib}{tail}"

    def literal(self, value: float) -> str:
        """A C++ literal of this type (clamped into a fixed-point range)."""
        if self.is_fixed:
            frac = self.width - self.int_bits
            hi = 2.0 ** (self.int_bits - 1) - 2.0 ** -frac
            lo = -(2.0 ** (self.int_bits - 1))
            v = min(max(value, lo), hi) if math.isfinite(value) else (hi if value > 0 else lo)
            return f"data_t({v!r})"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "-INFINITY"
        if math.isnan(value):
            return "NAN"
        return f"{float(value)!r}f"


@dataclass
class Port:
    """How one PrimFunc parameter is connected."""

    kind: str  # "stream_in" | "stream_out" | "rom" | "offchip"
    cname: str
    streams: list[str] = field(default_factory=list)  # stream_out fan-out
    direct: bool = False


# ------------------------------------------------------------------------ printer
class KernelPrinter:
    """Print one PrimFunc as an HLS C++ function.

    Parameters
    ----------
    func : PrimFunc
        Scheduled (annotated) function.
    cname : str
        Name of the C++ function.
    ports : dict
        Parameter index -> :class:`Port`.
    dtype : DataType
        The element type of float tensors.
    unroll : dict, optional
        Leaf block name -> unroll factor, overriding the annotations (design-level fit).
    """

    def __init__(self, func, cname: str, ports: dict[int, Port], dtype: DataType,
                 unroll: dict[str, int] | None = None):
        self.func = func
        self.cname = cname
        self.ports = ports
        self.dt = dtype
        self.unroll = dict(unroll or {})
        self.lines: list[str] = []
        self.buf: list[tuple] = []  # (buffer var, mode, cname, shape)
        self.partitions: dict[tuple[str, int], int] = {}
        self.labels = 0
        self.direct_reads: dict = {}  # leaf block name -> [(cname, value name)]

    # ------------------------------------------------------------------ types
    def ctype(self, dtype: str) -> str:
        if dtype.startswith("float") or dtype.startswith("bfloat"):
            return "float" if self._fctx else "data_t"
        if dtype in _INT_CTYPES:
            return _INT_CTYPES[dtype]
        raise UnsupportedOperatorError(f"dtype {dtype}", self.func_name,
                                       "no C++ type for it in the HLS emitter")

    @property
    def func_name(self) -> str:
        return self.cname

    # ---------------------------------------------------------------- buffers
    def _lookup(self, buf):
        for b, mode, cname, shape in self.buf:
            if b.same_as(buf):
                return mode, cname, shape
        raise UnsupportedOperatorError("buffer", self.cname, f"unknown buffer {buf.name}")

    def _index(self, buf, indices) -> str:
        mode, cname, shape = self._lookup(buf)
        idx = [self.expr(i) for i in indices]
        if mode == "direct_in":
            return f"{cname}_v"
        if mode == "ptr":
            flat = "0"
            for i, d in zip(idx, shape, strict=True):
                flat = f"({flat} * {d} + {i})"
            return f"{cname}[{flat}]"
        if not idx:
            return f"{cname}[0]"
        return cname + "".join(f"[{i}]" for i in idx)

    # ------------------------------------------------------------ expressions
    _fctx = False  # printing in float, whatever data_t is

    def _in_float(self, e) -> str:
        saved, self._fctx = self._fctx, True
        try:
            return self.expr(e)
        finally:
            self._fctx = saved

    def ftype(self, e) -> str:
        """C type of a float expression: ``accum_t`` when it reads an accumulator."""
        if self._fctx and dtype_of(e).startswith("float"):
            return "float"
        if not self.dt.is_fixed or not dtype_of(e).startswith("float"):
            return "data_t"
        kind = type(e).__name__
        if kind in ("TensorLoad", "BufferLoad"):
            _, cname, _ = self._lookup(e.source if hasattr(e, "source") else e.buffer)
            return "accum_t" if cname in self.accum else "data_t"
        if isinstance(e, tirx.Cast):
            return "data_t"
        subs = [c for c in children(e) if dtype_of(c).startswith("float")]
        return "accum_t" if any(self.ftype(c) == "accum_t" for c in subs) else "data_t"

    def _as(self, e, ctype: str) -> str:
        """``e`` printed, converted to ``ctype`` when its own type differs."""
        code = self.expr(e)
        if self._fctx:
            return code
        if self.dt.is_fixed and dtype_of(e).startswith("float") and self.ftype(e) != ctype:
            return f"{ctype}({code})"
        return code

    def expr(self, e) -> str:  # noqa: C901 - one branch per node kind
        kind = type(e).__name__
        if isinstance(e, tirx.IntImm):
            dt = dtype_of(e)
            if dt == "bool":
                return "true" if e.value else "false"
            return f"{self.ctype(dt)}({int(e.value)})"
        if isinstance(e, tirx.FloatImm):
            return (DataType() if self._fctx else self.dt).literal(float(e.value))
        if kind == "Var":
            return cident(e.name)
        if kind in ("TensorLoad", "BufferLoad"):
            code = self._index(e.source if hasattr(e, "source") else e.buffer, e.indices)
            if self._fctx and dtype_of(e).startswith("float"):
                return f"ft::to_float({code})"
            return code
        if type(e) in _BINOP:
            ft = self.ftype(e.a) if dtype_of(e.a).startswith("float") else None
            if ft is not None and self.ftype(e.b) != ft:
                ft = "accum_t"
            if ft is not None:
                return f"({self._as(e.a, ft)} {_BINOP[type(e)]} {self._as(e.b, ft)})"
            return f"({self.expr(e.a)} {_BINOP[type(e)]} {self.expr(e.b)})"
        is_f = dtype_of(e).startswith("float")
        t = self.ftype(e) if is_f else self.ctype(dtype_of(e))
        if isinstance(e, tirx.Div):
            if is_f:
                return f"({self._as(e.a, t)} / {self._as(e.b, t)})"
            return f"({self.expr(e.a)} / {self.expr(e.b)})"
        if isinstance(e, tirx.Mod):
            return f"({self.expr(e.a)} % {self.expr(e.b)})"
        if isinstance(e, tirx.FloorDiv):
            if is_f:
                return f"ft::floor({self.expr(e.a)} / {self.expr(e.b)})"
            return f"ft::floordiv<{t}>({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, tirx.FloorMod):
            a, b = self.expr(e.a), self.expr(e.b)
            if is_f:
                return f"({a} - ft::floor({a} / {b}) * {b})"
            return f"ft::floormod<{t}>({a}, {b})"
        if isinstance(e, (tirx.Min, tirx.Max)):
            fn = "min" if isinstance(e, tirx.Min) else "max"
            if is_f:
                return f"ft::{fn}<{t}>({self._as(e.a, t)}, {self._as(e.b, t)})"
            return f"ft::{fn}<{t}>({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, tirx.Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, tirx.BitwiseNot):
            return f"(~{self.expr(e.a)})"
        if isinstance(e, tirx.Select):
            return (f"({self.expr(e.condition)} ? {t}({self.expr(e.true_value)}) : "
                    f"{t}({self.expr(e.false_value)}))")
        if isinstance(e, tirx.Cast):
            if self.dt.is_fixed and not is_f and dtype_of(e.value).startswith("float"):
                # float -> int (exponent tricks, index math): evaluate the operand in float,
                # fixed point would clamp its constants (e.g. 127 in ap_fixed<16,6>)
                return f"static_cast<{self.ctype(dtype_of(e))}>({self._in_float(e.value)})"
            return f"static_cast<{self.ctype(dtype_of(e))}>({self.expr(e.value)})"
        if kind == "Call":
            name = "tirx." + getattr(e.op, "name", "").split(".")[-1]
            args = [self.expr(a) for a in e.args]
            if name == "tirx.if_then_else":
                return f"({args[0]} ? {t}({args[1]}) : {t}({args[2]}))"
            if name in _UNARY:
                return f"ft::{_UNARY[name]}({args[0]})"
            if name == "tirx.pow":
                return f"ft::pow({self._as(e.args[0], t)}, {self._as(e.args[1], t)})"
            if name[5:] in _BIT_CALLS and len(args) == 2:
                return f"({args[0]} {_BIT_CALLS[name[5:]]} {args[1]})"
            if name == "tirx.bitwise_not":
                return f"(~{args[0]})"
            if name == "tirx.reinterpret":
                src = dtype_of(e.args[0])
                if dtype_of(e) == "float32" and src in ("int32", "uint32"):
                    return f"{t}(ft::bits_to_float(static_cast<int32_t>({args[0]})))"
                if dtype_of(e) in ("int32", "uint32") and src == "float32":
                    return (f"static_cast<{t}>(ft::float_to_bits("
                            f"ft::to_float({self._in_float(e.args[0])})))")
                raise UnsupportedOperatorError(name, self.cname, f"reinterpret {src} as "
                                               f"{dtype_of(e)}")
            if name == "tirx.isnan":
                return f"({args[0]} != {args[0]})"
            raise UnsupportedOperatorError(name, self.cname, "no HLS C++ translation")
        raise UnsupportedOperatorError(kind, self.cname, "TIR expression the HLS emitter "
                                       "cannot print")

    # ------------------------------------------------------------- statements
    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def stmt(self, s, depth: int) -> None:  # noqa: C901 - one branch per node kind
        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.stmt(x, depth)
        elif isinstance(s, tirx.For):
            self._for(s, depth)
        elif isinstance(s, s_tir.SBlockRealize):
            self._block(s, depth)
        elif isinstance(s, tirx.BufferStore):
            self._store(s, depth)
        elif isinstance(s, tirx.IfThenElse):
            self.emit(f"if ({self.expr(s.condition)}) {{", depth)
            self.stmt(s.then_case, depth + 1)
            if s.else_case is not None:
                self.emit("} else {", depth)
                self.stmt(s.else_case, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, tirx.Evaluate):
            if not isinstance(s.value, (tirx.IntImm,)):
                self.emit(f"(void)({self.expr(s.value)});", depth)
        elif isinstance(s, tirx.LetStmt):
            self.emit("{", depth)
            self.emit(f"const {self.ctype(dtype_of(s.var))} {cident(s.var.name)} = "
                      f"{self.expr(s.value)};", depth + 1)
            self.stmt(s.body, depth + 1)
            self.emit("}", depth)
        else:
            raise UnsupportedOperatorError(type(s).__name__, self.cname,
                                           "TIR statement the HLS emitter cannot print")

    def _for(self, loop: tirx.For, depth: int) -> None:
        v = cident(loop.loop_var.name)
        t = self.ctype(dtype_of(loop.loop_var))
        if isinstance(loop.min, tirx.IntImm) and isinstance(loop.extent, tirx.IntImm):
            lo = int(loop.min.value)
            lo, hi = str(lo), str(lo + int(loop.extent.value))
        else:
            lo = self.expr(loop.min)
            hi = f"{lo} + {self.expr(loop.extent)}"
        self.labels += 1
        self.emit(f"L{self.labels}_{v}: for ({t} {v} = {lo}; {v} < {hi}; ++{v}) {{", depth)
        ii = loop_annotation(loop, PIPELINE_ATTR)
        unroll = loop_annotation(loop, UNROLL_ATTR)
        leaf = loop.body.block.name_hint if isinstance(loop.body, s_tir.SBlockRealize) else None
        if leaf is not None and leaf in self.unroll:
            unroll = self.unroll[leaf]
        if ii is not None:
            self.emit(f"#pragma HLS PIPELINE II={ii}", 0)
        if unroll is not None and unroll > 1:
            self.emit(f"#pragma HLS UNROLL factor={unroll}", 0)
            if leaf is not None:
                self._partition_for(loop, loop.body, unroll)
        elif int(getattr(loop.kind, "value", loop.kind)) == 2:  # ForKind.UNROLLED
            self.emit("#pragma HLS UNROLL", 0)
        self.stmt(loop.body, depth + 1)
        self.emit("}", depth)

    def _partition_for(self, loop, realize, factor: int) -> None:
        """Partition arrays indexed by ``loop``'s variable (through block bindings)."""
        bound = {iv.var.name for iv, val in zip(realize.block.iter_vars, realize.iter_values,
                                                strict=True)
                 if loop.loop_var.name in _var_names(val)}
        accesses = []
        st = realize.block.body

        def visit(e):
            if type(e).__name__ in ("TensorLoad", "BufferLoad"):
                accesses.append((e.source if hasattr(e, "source") else e.buffer, e.indices))
            for c in children(e):
                visit(c)

        accesses.append((st.buffer, st.indices))
        visit(st.value)
        for buf, indices in accesses:
            mode, cname, shape = self._lookup(buf)
            if mode not in ("local", "rom"):
                continue
            for d, idx in enumerate(indices):
                if _var_names(idx) & bound and int(shape[d]) > 1:
                    key = (cname, d + 1)
                    f = min(factor, int(shape[d]))
                    self.partitions[key] = max(self.partitions.get(key, 1), f)

    def _block(self, rz: s_tir.SBlockRealize, depth: int) -> None:
        blk = rz.block
        if not len(blk.iter_vars):
            self.stmt(blk.body, depth)
            return
        self.emit(f"{{  // {blk.name_hint}", depth)
        d = depth + 1
        for iv, val in zip(blk.iter_vars, rz.iter_values, strict=True):
            self.emit(f"const {self.ctype(dtype_of(iv.var))} {cident(iv.var.name)} = "
                      f"{self.expr(val)};", d)
        pred = rz.predicate
        guarded = not (isinstance(pred, tirx.IntImm) and int(pred.value) == 1)
        if guarded:
            self.emit(f"if ({self.expr(pred)}) {{", d)
            d += 1
        for cname, ctype in self.direct_reads.get(blk.name_hint, []):
            self.emit(f"const {ctype} {cname}_v = {cname}.read();", d)
        if blk.init is not None:
            conds = [f"{cident(iv.var.name)} == {self.expr(iv.dom.min)}"
                     for iv in blk.iter_vars if int(iv.iter_type) == 2]
            self.emit(f"if ({' && '.join(conds) or 'true'}) {{", d)
            self.stmt(blk.init, d + 1)
            self.emit("}", d)
        self.stmt(blk.body, d)
        if guarded:
            self.emit("}", d - 1)
        self.emit("}", depth)

    def _store(self, st: tirx.BufferStore, depth: int) -> None:
        mode, cname, _ = self._lookup(st.buffer)
        if dtype_of(st.value).startswith("float"):
            value = self._as(st.value, "accum_t" if cname in self.accum else "data_t")
        else:
            value = self.expr(st.value)
        if mode == "direct_out":
            streams, ctype = self._direct_out[cname]
            if len(streams) == 1:
                self.emit(f"{streams[0]}.write({ctype}({value}));", depth)
            else:
                self.emit(f"const {ctype} {cname}_o = {value};", depth)
                for s in streams:
                    self.emit(f"{s}.write({cname}_o);", depth)
            return
        self.emit(f"{self._index(st.buffer, st.indices)} = {value};", depth)

    # --------------------------------------------------------------- function
    def print(self) -> tuple[str, str]:
        """(prototype, definition) of the C++ function."""
        func = self.func
        params: list[str] = []
        prologue: list[str] = []
        epilogue: list[str] = []
        self._direct_out: dict[str, tuple[list[str], str]] = {}
        acc = buffer_accesses(func)
        # Buffers written by reductions accumulate in the wider accum_t (fixed point).
        reduced = {lb.block.body.buffer.name for lb in leaf_blocks(func) if lb.has_reduce}
        self.accum: set[str] = set()
        for k, p in enumerate(func.params):
            port = self.ports[k]
            shape = [int_value(d) for d in p.shape]
            dims = "".join(f"[{d}]" for d in shape) or "[1]"
            st = self.ctype(str(p.dtype))  # element type of the stream / array
            if port.kind == "rom":
                self.buf.append((p, "rom", port.cname, shape))
            elif port.kind == "offchip":
                params.append(f"const {st}* {port.cname}")
                self.buf.append((p, "ptr", port.cname, shape))
            elif port.kind == "stream_in":
                params.append(f"hls::stream<{st}>& {port.cname}")
                if port.direct:
                    self.buf.append((p, "direct_in", port.cname, shape))
                    (lb, *_), = acc[p.name]
                    self.direct_reads.setdefault(lb.name, []).append((port.cname, st))
                else:
                    local = f"{port.cname}_buf"
                    self.buf.append((p, "local", local, shape))
                    prologue.append(f"static {st} {local}{dims};")
                    prologue.extend(_copy_loops(local, shape, f"{local}{{}} = {port.cname}"
                                                ".read();", f"rd_{port.cname}"))
            else:  # stream_out
                params.extend(f"hls::stream<{st}>& {s}" for s in port.streams)
                if port.direct:
                    self.buf.append((p, "direct_out", port.cname, shape))
                    self._direct_out[port.cname] = (list(port.streams), st)
                else:
                    local = f"{port.cname}_buf"
                    self.buf.append((p, "local", local, shape))
                    atype = st
                    if self.dt.is_fixed and p.name in reduced:
                        self.accum.add(local)
                        atype = "accum_t"
                    prologue.insert(0, f"static {atype} {local}{dims};")
                    for s in port.streams:
                        epilogue.extend(_copy_loops(local, shape,
                                                    f"{s}.write({st}({local}{{}}));",
                                                    f"wr_{s}"))
        decls = []
        for b in alloc_buffers(func):
            cname = f"b_{cident(b.name)}"
            while any(c == cname for _, _, c, _ in self.buf):
                cname += "_"
            shape = [int_value(d) for d in b.shape]
            self.buf.append((b, "local", cname, shape))
            dims = "".join(f"[{d}]" for d in shape) or "[1]"
            ctype = self.ctype(str(b.dtype))
            if self.dt.is_fixed and b.name in reduced and ctype == "data_t":
                self.accum.add(cname)
                ctype = "accum_t"
            decls.append(f"static {ctype} {cname}{dims};")
        self.stmt(func.body, 1)
        body = self.lines
        proto = f"void {self.cname}({', '.join(params)})"
        out = [proto + " {", "#pragma HLS INLINE off"]
        out += ["  " + d for d in decls + [x for x in prologue if x.startswith("static")]]
        for (cname, dim), f in sorted(self.partitions.items()):
            out.append(f"#pragma HLS ARRAY_PARTITION variable={cname} cyclic factor={f} "
                       f"dim={dim}")
        out += ["  " + x if not x.startswith("#") else x
                for x in prologue if not x.startswith("static")]
        out += body
        out += ["  " + x if not x.startswith("#") else x for x in epilogue]
        out.append("}")
        return proto + ";", "\n".join(out)


def _var_names(e) -> set[str]:
    names: set[str] = set()

    def visit(x):
        if type(x).__name__ == "Var":
            names.add(x.name)
        for c in children(x):
            visit(c)

    visit(e)
    return names


def _copy_loops(array: str, shape: list[int], body_fmt: str, label: str) -> list[str]:
    """A pipelined loop nest over ``shape``; ``body_fmt`` gets the ``[i0][i1]`` suffix."""
    if not shape:
        return [body_fmt.format("[0]")]
    lines = []
    idx = ""
    for d, n in enumerate(shape):
        lines.append("  " * d + f"{label}_{d}: for (int i{d} = 0; i{d} < {n}; ++i{d}) {{"
                     if d == 0 else "  " * d + f"for (int i{d} = 0; i{d} < {n}; ++i{d}) {{")
        idx += f"[i{d}]"
    lines.append("#pragma HLS PIPELINE II=1")
    lines.append("  " * len(shape) + body_fmt.format(idx))
    for d in reversed(range(len(shape))):
        lines.append("  " * d + "}")
    return lines
