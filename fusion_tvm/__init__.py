"""fusion_tvm: cost-model-driven operator fusion for Apache TVM Relax.

>>> import fusion_tvm
>>> cm = fusion_tvm.compile("model.onnx")            # host CPU, our fusion and schedules
>>> outputs = cm.run({"input": x})
>>> print(cm.plan.table())
"""

# targets registers the backends; the others are named in the README as
# fusion_tvm.<module>.<function> and work after one `import fusion_tvm`.
from . import explain, profile, report, targets, threads  # noqa: F401
from .api import CompiledModel, TensorSpec, compile, load
from .cost_models import (
    CostModel,
    HardwareSpec,
    get_cost_model,
    get_hardware,
    list_cost_models,
    list_hardware,
    register_cost_model,
    register_hardware,
)
from .errors import FusionTVMError, UserInputError
from .frontend import load_model
from .passes.fuse_by_cost_model import FuseByCostModel
from .pipeline import build_pipeline, host_target, make_pipeline
from .plan import FusionPlan
from .search import SearchConfig
from .targets.base import get_backend, list_backends, register_backend
from .tuning import TuningDatabase, tune

__version__ = "0.1.0"

__all__ = [
    "CompiledModel",
    "CostModel",
    "FuseByCostModel",
    "FusionPlan",
    "FusionTVMError",
    "HardwareSpec",
    "SearchConfig",
    "TensorSpec",
    "TuningDatabase",
    "UserInputError",
    "build_pipeline",
    "compile",
    "get_backend",
    "get_cost_model",
    "get_hardware",
    "host_target",
    "list_backends",
    "list_cost_models",
    "list_hardware",
    "load",
    "load_model",
    "make_pipeline",
    "register_backend",
    "register_cost_model",
    "register_hardware",
    "tune",
]
