"""A model converted to Relax, described for its callers (names, shapes, dtypes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import tvm
from tvm import IRModule, relax, tirx

from ..errors import UserInputError

Dim = int | str
Source = Literal["onnx", "irmodule", "torch", "library"]


@dataclass(frozen=True)
class LoadedModel:
    """A model converted to Relax, with what a caller needs to feed and read it.

    Attributes
    ----------
    mod : tvm.IRModule
        Relax module whose ``main`` takes the inputs in ``input_names`` order. Weights are
        embedded as constants (ONNX, torch) or are parameters of ``main``.
    input_names : tuple of str
        Model input names in parameter order (the ONNX names, before any sanitizing). For
        a Relax module whose ``main`` takes its weights as parameters (``num_input``
        attribute, as mlc-llm and TVM's frontends write them): every parameter, the real
        inputs first, then the weights not bound by ``compile(..., params=...)``.
    input_shapes : tuple of tuple of (int or str)
        Static dims as ints, symbolic dims by name (``"batch"``, ``"sequence"``).
    input_dtypes : tuple of str
        ``""`` where the model leaves an input's element type open (any dtype is accepted).
    output_names : tuple of str
    source : {"onnx", "irmodule", "torch", "library"}
        ``"library"``: read back by :func:`fusion_tvm.load` (``mod`` is None).
    origins : dict of relax.Var to tuple of str
        ONNX models: the ONNX node(s) each binding of ``main`` came from
        (:mod:`fusion_tvm.origins`); empty for other sources.
    """

    mod: IRModule
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[Dim, ...], ...]
    input_dtypes: tuple[str, ...]
    output_names: tuple[str, ...]
    source: Source
    origins: Mapping[relax.Var, tuple[str, ...]] = field(default_factory=dict, compare=False,
                                                         repr=False)


def from_irmodule(mod: IRModule, source: Source) -> LoadedModel:
    """Describe a Relax module whose ``main`` is the entry point."""
    main = _main_function(mod)
    _check_well_formed(mod)
    names = [p.name for p in _user_params(main)]
    num_outputs = len(main.ret_ty.fields) if isinstance(main.ret_ty, relax.TupleType) else 1
    outputs = ["output"] if num_outputs == 1 else [f"output_{i}" for i in range(num_outputs)]
    return describe(mod, source, names, outputs)


def bind_params(mod: IRModule, params: Mapping[str, Any]) -> IRModule:
    """``mod`` with the named parameters of ``main`` bound to constants (weights bound at
    compile time: folded and packed by the pipeline, no longer fed at run time).

    ``params`` maps parameter names to arrays (numpy or TVM tensors); a name ``main`` does
    not take, or an array whose shape or dtype disagrees with the parameter, is refused.
    """
    if not isinstance(mod, IRModule):
        raise UserInputError("params= binds parameters of a Relax IRModule's main; "
                             f"got a {type(mod).__name__}")
    main = _main_function(mod)
    by_name = {p.name: p for p in main.params}
    unknown = sorted(set(params) - set(by_name))
    if unknown:
        raise UserInputError(f"params {unknown} are not parameters of main; it takes "
                             f"{list(by_name)}")
    arrays = {}
    for name, value in params.items():
        arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        ty = by_name[name].ty
        want = _dims(ty) if isinstance(ty, relax.TensorType) else ()
        if (isinstance(ty, relax.TensorType) and ty.dtype is not None
                and str(arr.dtype) != str(ty.dtype)):
            raise UserInputError(f"param '{name}' has dtype {arr.dtype}, main expects "
                                 f"{ty.dtype}")
        if want and (len(want) != arr.ndim or any(
                isinstance(w, int) and w != g for w, g in zip(want, arr.shape, strict=False))):
            raise UserInputError(f"param '{name}' has shape {arr.shape}, main expects "
                                 f"{tuple(want)}")
        arrays[name] = tvm.runtime.tensor(np.ascontiguousarray(arr))
    return relax.transform.BindParams("main", arrays)(mod)


def _main_function(mod: IRModule) -> relax.Function:
    if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
        raise UserInputError("the IRModule has no function 'main'")
    main = mod["main"]
    if not isinstance(main, relax.Function):
        raise UserInputError(f"the IRModule's 'main' is a {type(main).__name__}, not Relax")
    return main


def _check_well_formed(mod: IRModule) -> None:
    try:
        relax.analysis.well_formed(mod)  # raises on the first violation
    except Exception as err:  # noqa: BLE001 - TVM reports defects as assorted error types
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise UserInputError(f"the IRModule is not well-formed Relax: {lines[-1]}") from None


def _user_params(main: relax.Function) -> list[relax.Var]:
    # Modules that take weights as parameters mark how many leading ones are real inputs
    # (``num_input``); the VM's ``main`` still takes them all, so a run feeds them all.
    return list(main.params)


def describe(mod: IRModule, source: Source, input_names, output_names) -> LoadedModel:
    shapes, dtypes = [], []
    for param in _user_params(_main_function(mod)):
        ty = param.ty
        if not isinstance(ty, relax.TensorType):
            shapes.append(())
            dtypes.append(str(ty))
            continue
        shapes.append(_dims(ty))
        # An input of unknown element type (an ONNX optional, say) accepts any dtype.
        dtypes.append("" if ty.dtype is None else str(ty.dtype))
    return LoadedModel(
        mod=mod,
        input_names=tuple(input_names),
        input_shapes=tuple(shapes),
        input_dtypes=tuple(dtypes),
        output_names=tuple(output_names),
        source=source,
    )


def _dims(ty: relax.TensorType) -> tuple[Dim, ...]:
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return ()
    return tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in ty.shape.values)
