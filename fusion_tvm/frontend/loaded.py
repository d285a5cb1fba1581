"""A model converted to Relax, described for its callers (names, shapes, dtypes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
        embedded as constants.
    input_names : tuple of str
        Model input names in parameter order (the ONNX names, before any sanitizing).
    input_shapes : tuple of tuple of (int or str)
        Static dims as ints, symbolic dims by name (``"batch"``, ``"sequence"``).
    input_dtypes : tuple of str
        ``""`` where the model leaves an input's element type open (any dtype is accepted).
    output_names : tuple of str
    source : {"onnx", "irmodule", "torch", "library"}
        ``"library"``: read back by :func:`fusion_tvm.load` (``mod`` is None).
    """

    mod: IRModule
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[Dim, ...], ...]
    input_dtypes: tuple[str, ...]
    output_names: tuple[str, ...]
    source: Source


def from_irmodule(mod: IRModule, source: Source) -> LoadedModel:
    """Describe a Relax module whose ``main`` is the entry point."""
    main = _main_function(mod)
    _check_well_formed(mod)
    names = [p.name for p in _user_params(main)]
    num_outputs = len(main.ret_ty.fields) if isinstance(main.ret_ty, relax.TupleType) else 1
    outputs = ["output"] if num_outputs == 1 else [f"output_{i}" for i in range(num_outputs)]
    return describe(mod, source, names, outputs)


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
    # Modules that take weights as parameters mark how many leading ones are real inputs.
    num_inputs = int(main.attrs["num_input"]) if main.attrs and "num_input" in main.attrs else None
    return list(main.params)[:num_inputs]


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
