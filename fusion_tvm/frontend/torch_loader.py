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

    from . import from_irmodule

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
    return from_irmodule(mod, source="torch")


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
