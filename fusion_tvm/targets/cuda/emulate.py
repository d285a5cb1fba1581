"""Check a CUDA schedule's arithmetic on the CPU, without a GPU.

A scheduled kernel is the unscheduled one with loops split, reordered, bound to threads
and staged through shared / local buffers. Turning every thread binding back into a
serial loop and every GPU storage scope into global memory gives a sequential program
that must compute exactly what the original PrimFunc computes; built with LLVM, the two
are compared on random inputs. This catches wrong index arithmetic, padding, inlining
and staging — what nvcc cannot see — though not races or missing barriers (one
"thread" at a time cannot race).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from ...tir_expr import free_vars, substitute

_THREAD = re.compile(r', thread="[^"]+"')
_GPU_SCOPE = re.compile(r'scope="(?:shared|shared\.dyn|local|warp)"')


def serialize(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with thread bindings as serial loops and GPU scopes as global buffers."""
    text = tvm.IRModule({"main": func}).script()
    text = _THREAD.sub("", text).replace("T.thread_binding(", "T.serial(")
    text = _GPU_SCOPE.sub('scope="global"', text)
    return tvm.script.from_source(text)["main"]


def _build_cpu(func: tirx.PrimFunc):
    func = func.with_attr("global_symbol", "main")
    if func.attrs is not None and "target" in func.attrs:
        func = func.without_attr("target")
    return tvm.tirx.build(tvm.IRModule({"main": func}), target="llvm")["main"]


def _static_shape(param, dims: dict[str, int] | None) -> tuple[int, ...] | None:
    """The shape of ``param`` with the symbolic vars named in ``dims`` bound; None when a
    dim stays symbolic."""
    shape = []
    for d in param.shape:
        if not isinstance(d, tirx.IntImm) and dims:
            bound = {v: tirx.IntImm(v.ty, dims[v.name]) for v in free_vars(d) if v.name in dims}
            d = tvm.sym.Analyzer().simplify(substitute(d, bound))
        if not isinstance(d, tirx.IntImm):
            return None
        shape.append(int(d))
    return tuple(shape)


def random_args(func: tirx.PrimFunc, seed: int = 0,
                dims: dict[str, int] | None = None) -> list[np.ndarray] | None:
    """Random arrays for the parameters of ``func`` (None when a shape is symbolic and
    ``dims``, symbolic var name -> value, does not bind it)."""
    rng = np.random.default_rng(seed)
    args = []
    for param in func.params:
        shape = _static_shape(param, dims)
        if shape is None:
            return None
        dtype = str(param.dtype)
        if "float" in dtype:
            args.append(rng.standard_normal(shape).astype(dtype))
        else:  # indices (take, gather): small non-negative values stay in range
            args.append(rng.integers(0, 2, shape).astype(dtype))
    return args


@dataclass
class ScheduleCheck:
    """Result of :func:`check_schedule`."""

    ok: bool
    max_abs_err: float = 0.0
    skipped: str = ""


def check_schedule(original: tirx.PrimFunc, scheduled: tirx.PrimFunc, seed: int = 0,
                   rtol: float = 1e-4, atol: float = 1e-4,
                   dims: dict[str, int] | None = None) -> ScheduleCheck:
    """Run ``original`` and the serialised ``scheduled`` on the CPU; compare every buffer.

    A function with symbolic shapes runs at ``dims`` (symbolic var name -> value); without
    them it is skipped."""
    args = random_args(original, seed, dims)
    if args is None:
        return ScheduleCheck(True, skipped="symbolic shape")
    ref = [tvm.runtime.tensor(a.copy()) for a in args]
    got = [tvm.runtime.tensor(a.copy()) for a in args]
    _build_cpu(original)(*ref)
    _build_cpu(serialize(scheduled))(*got)
    worst, ok = 0.0, True
    for r, g in zip(ref, got, strict=True):
        r, g = r.numpy(), g.numpy()
        if r.size:
            finite = np.isfinite(r) & np.isfinite(g)
            if finite.any():
                worst = max(worst, float(np.max(np.abs(r[finite] - g[finite]))))
        ok = ok and np.allclose(r, g, rtol=rtol, atol=atol, equal_nan=True)
    return ScheduleCheck(ok, worst)
