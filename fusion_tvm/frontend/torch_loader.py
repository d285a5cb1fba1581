"""``torch.nn.Module`` → Relax IRModule through ``torch.export`` (optional; needs torch)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import InternalError, ModelLoadError, UnsupportedOperatorError, UserInputError


def load_torch(module: Any, example_inputs: Sequence[Any], dynamic_shapes: Any = None):
    """Export ``module`` with ``torch.export`` and convert it to Relax.

    Parameters
    ----------
    module : torch.nn.Module
        Put in eval mode by the caller if it has dropout or batch norm.
    example_inputs : sequence of torch.Tensor
        Positional inputs to trace with.
    dynamic_shapes : optional
        Passed to ``torch.export.export`` (e.g. ``{"x": {0: torch.export.Dim("batch")}}``);
        those dims stay symbolic in the Relax module.

    Returns
    -------
    LoadedModel
        ``source`` is ``"torch"``; inputs are named after the ``forward`` arguments.

    Raises
    ------
    UserInputError
        torch is missing or ``module`` is not a ``torch.nn.Module``.
    ModelLoadError
        ``torch.export`` cannot trace the module.
    UnsupportedOperatorError
        The Relax torch importer has no converter for an exported op.
    """
    try:
        import torch
    except ImportError:
        raise UserInputError(
            "loading a torch module needs torch: pip install 'fusion_tvm[torch]'"
        ) from None
    from tvm.relax.frontend.torch import from_exported_program

    from .loaded import from_irmodule

    if not isinstance(module, torch.nn.Module):
        raise UserInputError(f"expected a torch.nn.Module, got {type(module).__name__}")
    name = type(module).__name__
    try:
        program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises many unrelated types
        raise ModelLoadError(f"torch.export failed on {name}: {_first_line(err)}") from None
    try:
        mod = from_exported_program(
            program, keep_params_as_input=False, unwrap_unit_return_tuple=True
        )
    except AssertionError as err:
        # The importer asserts "Unsupported function types ['op.overload', ...]" up front.
        ops = re.findall(r"'([^']+)'", str(err))
        if not ops:
            raise InternalError(f"torch importer failed on {name}: {_first_line(err)}") from None
        raise UnsupportedOperatorError(
            ops[0], _node_calling(program, ops[0]), f"in {name} (all unsupported: {ops})"
        ) from None
    except Exception as err:  # noqa: BLE001 - reported, not swallowed
        raise InternalError(f"torch importer failed on {name}: {_first_line(err)}") from None
    if dynamic_shapes:
        mod = _name_dims_after_torch_dims(mod, dynamic_shapes, program)
    return from_irmodule(mod, source="torch")


def _name_dims_after_torch_dims(mod: Any, dynamic_shapes: Any, program: Any) -> Any:
    """Rename torch's symbols (``s17``) to the ``torch.export.Dim`` names the user gave.

    Shape hints and reports refer to dims by name, as for ONNX ``dim_param``s.
    """
    from tvm import tirx

    main = mod["main"]
    specs = _specs_by_position(dynamic_shapes, program)
    rename: dict[Any, Any] = {}
    by_name: dict[str, Any] = {}
    for param, spec in zip(main.params, specs, strict=False):
        shape = getattr(param.ty, "shape", None)
        if not isinstance(spec, dict) or shape is None or not hasattr(shape, "values"):
            continue
        for axis, dim in spec.items():
            name = getattr(dim, "__name__", None)
            var = shape.values[axis] if axis < len(shape.values) else None
            if name and isinstance(var, tirx.Var) and var.name != name and var not in rename:
                rename[var] = by_name.setdefault(name, tirx.Var(name, "int64"))
    if not rename:
        return mod
    old_to_new = {old.name: new.name for old, new in rename.items()}
    main = main.bind_symbolic_vars(rename)
    for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
        if main.attrs and key in main.attrs:
            bounds = {old_to_new.get(k, k): v for k, v in main.attrs[key].items()}
            main = main.with_attr(key, bounds)
    mod[mod.get_global_var("main")] = main
    return mod


def _specs_by_position(dynamic_shapes: Any, program: Any) -> list[Any]:
    if isinstance(dynamic_shapes, dict):
        import torch

        names = [
            spec.arg.name
            for spec in program.graph_signature.input_specs
            if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
        ]
        return [dynamic_shapes.get(name) for name in names]
    return list(dynamic_shapes)


def _node_calling(program: Any, op_name: str) -> str:
    """Name of the first FX node in ``program`` calling ``op_name`` ("" if not found)."""
    for node in program.graph.nodes:
        target = getattr(node.target, "__name__", str(node.target))
        if node.op == "call_function" and target == op_name:
            return node.name
    return ""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
