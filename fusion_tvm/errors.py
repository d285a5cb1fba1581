"""Exception types raised by fusion_tvm.

Every error a user can cause (bad model, bad shapes, bad hardware spec) is a
:class:`FusionTVMError` subclass with a message that names what and where.
"""


class FusionTVMError(Exception):
    """Base class of all fusion_tvm errors."""


class UserInputError(FusionTVMError):
    """The input given by the user is wrong (file, model, shapes, options)."""


class ModelLoadError(UserInputError):
    """A model file could not be read or parsed."""


class UnsupportedOperatorError(UserInputError):
    """The model uses an operator the importer cannot convert."""

    def __init__(self, op_type: str, node_name: str = "", detail: str = ""):
        self.op_type = op_type
        self.node_name = node_name
        where = f" at node '{node_name}'" if node_name else ""
        msg = f"unsupported operator '{op_type}'{where}"
        super().__init__(msg + (f": {detail}" if detail else ""))


class InvalidHardwareSpecError(UserInputError):
    """A hardware specification is impossible or incomplete."""


class UnknownNameError(UserInputError):
    """An unknown target, preset, cost model or backend name was given."""


class InvalidTargetError(UserInputError):
    """A target cannot be used: a malformed TVM target or JSON dict, or a kind with no
    fusion_tvm backend."""


class UnknownTargetError(UnknownNameError, InvalidTargetError):
    """A target name no backend is registered for (both an unknown name and a bad target)."""


class InputMismatchError(UserInputError):
    """Run-time inputs do not match the model (count, name, shape or dtype)."""


class CapacityError(UserInputError):
    """The model cannot fit the chosen hardware (e.g. FPGA resources)."""


class InternalError(FusionTVMError):
    """A bug in fusion_tvm or TVM; please report it."""
