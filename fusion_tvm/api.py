"""One call from a model to a runnable, fused build: :func:`compile`."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax

from .errors import InputMismatchError, UserInputError
from .frontend import LoadedModel, load_model, load_torch
from .frontend.index_checks import IndexRange, gather_index_ranges
from .frontend.loaded import bind_params
from .graph import default_dims, is_kernel_call
from .hardware import HardwareSpec
from .pipeline import FusionMode, fusion_mode, resolve, run_phases
from .plan import FusionPlan
from .search import SearchConfig
from .shape_hints import check_names, sample_values
from .threads import use_all_cores
from .tuning_db import TuningDatabase
from .verify import check_verify, measure_uncertain

if TYPE_CHECKING:
    from .profile import ModelProfile

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def kernel_calls(mod: tvm.IRModule) -> list[str]:
    """The PrimFunc of every ``call_tir`` / ``call_tir_inplace`` left in the Relax
    functions of ``mod`` (views excluded), in call order within each function: the kernels
    one run launches."""
    mod = relax.transform.RewriteDataflowReshape()(mod)
    calls: list[str] = []

    def visit(e):
        if is_kernel_call(e):
            calls.append(e.args[0].name_hint)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return calls


def count_kernels(mod: tvm.IRModule) -> int:
    """Kernel calls left in the Relax functions of ``mod`` (views excluded)."""
    return len(kernel_calls(mod))


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, shape (symbolic dims by name) and dtype.

    ``shape`` is None where the model does not say (a tuple output's unknown shape);
    ``dtype`` is ``""`` where the model leaves the element type open.
    """

    name: str
    shape: tuple[int | str, ...] | None
    dtype: str

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join(map(str, self.shape))
        return f"{self.name}: {self.dtype or 'any'}[{dims}]"

    def to_json(self) -> dict:
        """JSON-ready form (the ``inputs`` / ``outputs`` entries of the plan JSON)."""
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict | str) -> TensorSpec:
        """Read an entry written by :meth:`to_json` (a bare name: shape and dtype unknown)."""
        if isinstance(data, str):
            return cls(data, None, "")
        shape = data.get("shape")
        return cls(str(data["name"]), None if shape is None else tuple(shape),
                   str(data.get("dtype") or ""))


def _type_specs(ty, names: Sequence[str]) -> list[TensorSpec]:
    """Specs of a Relax return type, tuples flattened in order, named by ``names``."""
    flat = []

    def walk(t):
        if isinstance(t, relax.TupleType):
            for f in t.fields:
                walk(f)
        else:
            flat.append(t)

    walk(ty)
    specs = []
    for i, t in enumerate(flat):
        name = names[i] if i < len(names) else f"output_{i}"
        shape = dtype = None
        if isinstance(t, relax.TensorType):
            dtype = "" if t.dtype is None else str(t.dtype)
            if isinstance(t.shape, relax.ShapeExpr):
                shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                              for d in t.shape.values)
        specs.append(TensorSpec(name, shape, dtype or ""))
    return specs


def model_signature(loaded: LoadedModel) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """A loaded model's inputs and outputs (names, shapes with symbolic dims, dtypes)."""
    inputs = [TensorSpec(n, tuple(s), d) for n, s, d in zip(
        loaded.input_names, loaded.input_shapes, loaded.input_dtypes, strict=True)]
    return inputs, _type_specs(loaded.mod["main"].ret_ty, loaded.output_names)


def companion_json(artifact: str | os.PathLike) -> Path:
    """``model.so`` -> ``model.plan.json``: the signature and plan written beside a library
    by :meth:`CompiledModel.export` (and ``fusion-tvm compile``)."""
    p = Path(artifact)
    return p.with_name(p.stem + ".plan.json") if p.suffix else p.with_name(p.name + ".plan.json")


#: Lines TVM's C++ side logs on every build or export that tell a user nothing they can act
#: on: a warning per constant with a memory scope on export / load, and topi's take in
#: "fast" mode (our index checks range-check lookups before each run).
TVM_NOISE = re.compile(r"(Warning: Scope (Saving|Loaded):|Warning: Fast mode segfaults when)")


@contextlib.contextmanager
def tvm_noise_filtered() -> Iterator[None]:
    """Hold what is written to file descriptor 2 meanwhile (TVM's C++ log goes there, not
    through ``sys.stderr``) and write it back afterwards without :data:`TVM_NOISE` lines.
    Anything else, Python's own warnings included, still reaches stderr. A no-op where fd 2
    cannot be redirected."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [ln for ln in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not TVM_NOISE.search(ln)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


class CompiledModel:
    """A built model: run it, read its plan, export it.

    Attributes
    ----------
    plan : FusionPlan or None
        The fusion plan (None unless ``fusion="cost"``).
    num_kernels : int
        Kernels launched per run (reshape views excluded).
    fused_mod : IRModule
        The module after fusion and scheduling, before VM lowering.
    compile_time_s : float
    """

    def __init__(self, executable, loaded: LoadedModel, fused_mod, plan, target, hw, device,
                 compile_time_s: float):
        self.executable = executable
        self.loaded = loaded
        self.fused_mod = fused_mod
        self.plan: FusionPlan | None = plan
        self.target = target
        self.hw: HardwareSpec = hw
        self.device = device
        self.compile_time_s = compile_time_s
        # A library read back by :func:`load` has no module: its count comes from the JSON.
        self.num_kernels = count_kernels(fused_mod) if fused_mod is not None else 0
        self._outputs: tuple[TensorSpec, ...] | None = None
        self._vm = None
        #: The plan JSON a :func:`load`-ed model was exported with (None otherwise).
        self.plan_json: dict | None = None
        self._bound: dict[str, int] = {}
        #: Static builds for hot sizes, keyed by the sorted (dim, value) pairs.
        self.variants: dict[tuple, CompiledModel] = {}
        #: Inputs used as lookup indices, range-checked before each run (an out-of-range
        #: index would read outside the table: a crash, not an error).
        self.index_ranges = (gather_index_ranges(loaded.mod, loaded.input_names)
                             if loaded.mod is not None else [])

    @property
    def input_names(self) -> tuple[str, ...]:
        """Input names in feed order."""
        return self.loaded.input_names

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's inputs in feed order: name, shape (symbolic dims by name), dtype."""
        return tuple(TensorSpec(n, tuple(s), d) for n, s, d in zip(
            self.loaded.input_names, self.loaded.input_shapes, self.loaded.input_dtypes,
            strict=True))

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The model's outputs in :meth:`run`'s order: name, shape, dtype."""
        if self._outputs is None:
            self._outputs = tuple(_type_specs(self.loaded.mod["main"].ret_ty,
                                              self.loaded.output_names))
        return self._outputs

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        target = _target_kind(self.target)
        kernels = f"{self.num_kernels} kernel{'s' if self.num_kernels != 1 else ''}"
        return (f"<CompiledModel ({ins}) -> ({outs}); {kernels}, "
                f"target {target}, hw {getattr(self.hw, 'name', self.hw)}>")

    @property
    def vm(self) -> relax.VirtualMachine:
        """The Relax VM (created on first use)."""
        if self._vm is None:
            if self.device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
                use_all_cores()
            self._vm = relax.VirtualMachine(self.executable, self.device)
        return self._vm

    def _check_feeds(self, feeds) -> list[np.ndarray]:
        names = self.loaded.input_names
        if isinstance(feeds, (np.ndarray, tvm.runtime.Tensor)) or np.isscalar(feeds):
            if len(names) != 1:  # iterating it would feed its rows as inputs
                raise InputMismatchError(
                    f"got one array; the model takes {len(names)} inputs {list(names)}: "
                    f"pass a dict {{name: array}} or a list in that order")
            feeds = [feeds]
        if isinstance(feeds, Mapping):
            unknown = sorted(set(feeds) - set(names))
            missing = [n for n in names if n not in feeds]
            if unknown or missing:
                raise InputMismatchError(
                    f"inputs do not match the model: missing {missing}, unknown {unknown}; "
                    f"expected {list(names)}"
                )
            arrays = [feeds[n] for n in names]
        else:
            arrays = list(feeds)
            if len(arrays) != len(names):
                raise InputMismatchError(
                    f"the model takes {len(names)} inputs {list(names)}, got {len(arrays)}"
                )
        out = []
        bound: dict[str, int] = {}
        for name, arr, shape, dtype in zip(
            names, arrays, self.loaded.input_shapes, self.loaded.input_dtypes, strict=True
        ):
            arr = arr.numpy() if isinstance(arr, tvm.runtime.Tensor) else np.asarray(arr)
            if dtype and str(arr.dtype) != dtype:
                raise InputMismatchError(
                    f"input '{name}' has dtype {arr.dtype}, the model expects {dtype}"
                )
            if shape and len(arr.shape) != len(shape):
                raise InputMismatchError(
                    f"input '{name}' has rank {arr.ndim} (shape {arr.shape}), the model "
                    f"expects rank {len(shape)} {tuple(shape)}"
                )
            for axis, (want, got) in enumerate(zip(shape, arr.shape, strict=False)):
                if isinstance(want, int) and want != got:
                    raise InputMismatchError(
                        f"input '{name}' axis {axis} is {got}, the model expects {want} "
                        f"(shape {tuple(shape)})"
                    )
                if isinstance(want, str):
                    if bound.setdefault(want, got) != got:
                        raise InputMismatchError(
                            f"symbolic dim '{want}' is {bound[want]} in an earlier input but "
                            f"{got} in input '{name}' axis {axis}"
                        )
            out.append(np.require(arr, requirements="C"))  # keeps rank 0 (ascontiguous: 1)
        by_name = dict(zip(names, out, strict=True))
        for rng in self.index_ranges:
            message = rng.check(by_name[rng.name]) if rng.name in by_name else None
            if message:
                raise InputMismatchError(message)
        self._bound = bound
        return out

    def run(self, feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray
            | None = None, /, **named: np.ndarray) -> list[np.ndarray]:
        """Run once and return the outputs as numpy arrays, in :attr:`outputs` order.

        ``feeds`` maps input names to arrays, lists them in order, or is one array for a
        one-input model; inputs may also be given by keyword: ``cm.run(input=x)``.
        When specialised variants were built (``compile(..., specialize=...)``) and the
        feeds' symbolic dims match one, that variant runs; otherwise the generic build.
        """
        return flatten_outputs(self.bind(_feeds_of(feeds, named))())

    def _variant(self) -> CompiledModel:
        """The specialised variant matching the last checked feeds' dims, else self."""
        if not self.variants:
            return self
        dims = {d for key in self.variants for d, _ in key}
        key = tuple(sorted((d, v) for d, v in self._bound.items() if d in dims))
        return self.variants.get(key, self)

    def bind(self, feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray
             | None = None, /, **named: np.ndarray):
        """A zero-argument callable that runs the model on ``feeds`` copied to the device
        once and returns the VM's result (device tensors): times the compiled code without
        :meth:`run`'s numpy copies (~90 us for TVM #20342's 512 KB fp16 case). ``feeds``
        as for :meth:`run`."""
        arrays = self._check_feeds(_feeds_of(feeds, named))
        variant = self._variant()
        if variant is not self:
            return variant.bind(arrays)
        args = [tvm.runtime.tensor(a, self.device) for a in arrays]
        main = self.vm["main"]
        return lambda: main(*args)

    def kernel_calls(self) -> list[str]:
        """The PrimFunc of every kernel one run launches, in call order (views excluded;
        ``len`` is :attr:`num_kernels`)."""
        return kernel_calls(self.fused_mod)

    def profile(self, feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
                repeat: int = 7, seed: int = 0, model: str = "") -> ModelProfile:
        """Time every kernel of one run and the whole run; set them against the plan.

        Parameters
        ----------
        feeds : mapping or sequence, optional
            The inputs (as for :meth:`run`); random arrays shaped like the model's inputs
            when None, symbolic dims at the plan's values.
        repeat : int
            Timing rounds (each kernel and the whole run loop for a few ms a round); the
            minimum is kept.
        seed : int
            Seed of the random inputs.
        model : str
            Name shown in the table.

        Returns
        -------
        ModelProfile
            ``table()``, ``to_json()``; kernels slowest first.
        """
        from .profile import profile_model, random_feeds

        if feeds is None:
            dims = dict(self.plan.dims) if self.plan is not None \
                else default_dims(self.loaded.mod)
            feeds = random_feeds(self.loaded, dims, seed)
        arrays = self._check_feeds(feeds)
        dims = {**(self.plan.dims if self.plan is not None else {}), **self._bound}
        variant = self._variant()
        return profile_model(variant, arrays, dims, repeat=repeat, seed=seed, model=model)

    def signature_json(self) -> dict:
        """Inputs, outputs and kernel count as written beside an exported library."""
        data = {"inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.name for t in self.outputs],
                "output_specs": [t.to_json() for t in self.outputs],
                "kernels_built": self.num_kernels,
                "target_kind": _target_kind(self.target),
                # load() restores the lookup checks: without them an out-of-range index
                # reads outside the table (a crash)
                "index_ranges": [r.to_json() for r in self.index_ranges]}
        if self.plan is not None:
            data = {**self.plan.to_json(), **data}
        return data

    def export(self, path: str | os.PathLike) -> str:
        """Export the VM executable as a shared library loadable by ``tvm.runtime.load_module``,
        and its signature and plan as ``<name>.plan.json`` beside it (what :func:`load`
        reads back)."""
        path = os.fspath(path)
        with tvm_noise_filtered():  # a "Scope Saving:" warning per constant otherwise
            self.executable.export_library(path)
        companion_json(path).write_text(
            json.dumps(self.signature_json(), indent=2, default=_json_default))
        return path


def _target_kind(target) -> str:
    """``llvm`` / ``cuda`` of a TVM target; a plain name (``hls``, a loaded library's) as is."""
    return str(target.kind.name) if hasattr(target, "kind") else str(target)


def _json_default(obj):
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


def _feeds_of(feeds, named: Mapping[str, Any]):
    """``run`` / ``bind``'s positional feeds or keyword inputs, not both."""
    if named:
        if feeds is not None:
            raise InputMismatchError("pass the inputs either positionally or by keyword, "
                                     "not both")
        return dict(named)
    if feeds is None:
        raise InputMismatchError("no inputs given")
    return feeds


def load(path: str | os.PathLike, device=None) -> CompiledModel:
    """Read back a library written by :meth:`CompiledModel.export` (or ``fusion-tvm
    compile``) as a :class:`CompiledModel` with the same :meth:`~CompiledModel.run` and
    :meth:`~CompiledModel.bind`.

    The input and output signature comes from ``<name>.plan.json`` beside the library;
    ``plan`` is None (the plan's JSON is in ``plan_json``) and ``fused_mod`` is None.

    Parameters
    ----------
    path : str or os.PathLike
        The exported library.
    device : tvm.runtime.Device, optional
        Where to run; the CPU unless the JSON says the library was built for CUDA.
    """
    from .frontend.loaded import LoadedModel

    path = Path(path)
    meta_path = companion_json(path)
    if not path.is_file():
        raise UserInputError(f"cannot load '{path}': no such file")
    if not meta_path.is_file():
        raise UserInputError(f"cannot load '{path}': its signature '{meta_path.name}' is not "
                             "beside it (export() writes both; plain TVM can still load the "
                             "library: tvm.runtime.load_module + relax.VirtualMachine)")
    try:
        meta = json.loads(meta_path.read_text())
        inputs = [TensorSpec.from_json(d) for d in meta["inputs"]]
        outputs = [TensorSpec.from_json(d)
                   for d in meta.get("output_specs") or meta.get("outputs", [])]
        index_ranges = [IndexRange.from_json(d) for d in meta.get("index_ranges", [])]
    except (ValueError, KeyError, TypeError) as err:
        raise UserInputError(f"'{meta_path}' is not a plan JSON written by export(): "
                             f"{err}") from None
    try:
        with tvm_noise_filtered():  # "Scope Loaded:" otherwise
            lib = tvm.runtime.load_module(str(path))
    except Exception as err:  # noqa: BLE001 - TVM reports a bad file as assorted errors
        raise UserInputError(f"cannot load '{path}': {str(err).strip().splitlines()[-1]}") \
            from None
    kind = str(meta.get("target_kind") or "llvm")
    if device is None:
        device = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    loaded = LoadedModel(mod=None, input_names=tuple(t.name for t in inputs),
                         input_shapes=tuple(tuple(t.shape or ()) for t in inputs),
                         input_dtypes=tuple(t.dtype for t in inputs),
                         output_names=tuple(t.name for t in outputs), source="library")
    model = CompiledModel(lib, loaded, None, None, kind, meta.get("hardware", ""), device,
                          float(meta.get("compile_time_s", 0.0)))
    model.num_kernels = int(meta.get("kernels_built", meta.get("num_kernels", 0)))
    model._outputs = tuple(outputs)
    model.index_ranges = index_ranges
    model.plan_json = meta
    return model


def flatten_outputs(value) -> list[np.ndarray]:
    """A VM result (tensor or nested tuples of tensors) as a flat list of numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out.extend(flatten_outputs(v))
    return out


def compile(  # noqa: A001 - the natural name, as in onnxruntime / torch
    model: Any,
    target: str | Mapping | tvm.target.Target | None = None,
    hw: str | HardwareSpec | None = None,
    fusion: str | FusionMode = "cost",
    schedule: bool = True,
    cost_model: str | None = None,
    shape_hints: Mapping[str, int] | None = None,
    shape_dict: Mapping[str, Sequence] | None = None,
    example_inputs: Sequence[Any] | None = None,
    search: SearchConfig | None = None,
    specialize: Mapping[str, Sequence[int]] | None = None,
    tuning_db: str | os.PathLike | TuningDatabase | None = None,
    verify: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> CompiledModel:
    """Compile a model with cost-model-driven fusion.

    Parameters
    ----------
    model : str, os.PathLike, onnx.ModelProto, tvm.IRModule or torch.nn.Module
        The model. A torch module needs ``example_inputs``.
    target : str, mapping or tvm.target.Target, optional
        ``"llvm"`` (default: the host CPU), ``"cuda"`` or ``"hls"``, or a TVM target or its
        JSON dict (``{"kind": "llvm", "mcpu": "znver4"}``: code for that CPU, with its
        preset when there is one; an llvm target without mcpu gets the host's). A bad
        target raises :class:`~fusion_tvm.errors.InvalidTargetError`.
    hw : str or HardwareSpec, optional
        Hardware preset name, JSON file or spec; the backend's default when None.
    fusion : {"cost", "fuseops", "none"}
        Our cost-model partition, TVM's FuseOps partition, or no fusion.
    schedule : bool
        Apply the target's schedule rules (False: stock untuned TIR).
    cost_model : str, optional
        Registered cost model name; the backend's default (``"roofline"``, ``"fpga"``).
    shape_hints : mapping, optional
        Expected values of symbolic dims for the cost model: ``{"N": 8}``, a range
        ``{"N": (1, 64)}`` or a list ``{"S": [16, 128]}``.
    shape_dict : mapping, optional
        ONNX input shapes to override (strings stay symbolic).
    example_inputs : sequence, optional
        For torch modules.
    search : SearchConfig, optional
        Search options.
    specialize : mapping, optional
        Hot sizes of symbolic dims (``{"S": [128]}``): a static build is made for each
        combination and dispatched at run time when the inputs match; other sizes run the
        generic dynamic build.
    tuning_db : str, os.PathLike or TuningDatabase, optional
        Knob values measured by :func:`fusion_tvm.tune`: recorded kernels are scheduled
        with them (the default path needs none). With ``verify``, measured block decisions
        are read from it and written to it (a missing file is created).
    verify : {None, "measure"}
        None (default): the cost model decides alone. ``"measure"``: where a block's kept
        partition is predicted within the model's error band of the runner-up
        (:data:`fusion_tvm.verify.VERIFY_BAND`), build both and keep the one measured
        faster on the device (``plan.verified``); see :mod:`fusion_tvm.verify`. Needs
        ``fusion="cost"`` and a target that runs here (llvm, or cuda with a GPU).
    params : mapping, optional
        Relax modules whose ``main`` takes its weights as parameters (``num_input``):
        arrays bound to those parameters by name at compile time (constants: folded and
        packed, not fed again). Parameters left unbound are fed at run time after the
        inputs, as mlc-llm passes weights; ``input_names`` lists them.

    Returns
    -------
    CompiledModel
    """
    start = time.perf_counter()
    if params:
        model = bind_params(model, params)
    verify = check_verify(verify)
    if hasattr(model, "forward") and hasattr(model, "parameters"):
        if example_inputs is None:
            raise UserInputError("a torch.nn.Module needs example_inputs")
        loaded = load_torch(model, example_inputs)
    else:
        loaded = load_model(model, shape_dict=shape_dict)
    if shape_hints:
        check_names(shape_hints, set(default_dims(loaded.mod)))
        for name, value in shape_hints.items():
            sample_values(value, name)
    if verify is not None and fusion_mode(fusion) is not FusionMode.COST:
        raise UserInputError(f"verify={verify!r} settles the cost model's decisions: it needs "
                             f"fusion='cost', not {fusion!r}")
    database = TuningDatabase.of(tuning_db, create=verify is not None)
    resolved = resolve(target, hw)

    first: dict[str, dict] = {}  # the origins of the first result's prepared module

    def phases(config: SearchConfig | None, prepared: tvm.IRModule | None = None):
        origins = loaded.origins if prepared is None else first.get("origins")
        with tvm_noise_filtered():
            phased = run_phases(loaded.mod, resolved, fusion=fusion_mode(fusion),
                                schedule=schedule, cost_model=cost_model,
                                shape_hints=shape_hints, config=config, database=database,
                                prepared=prepared, origins=origins)
        first.setdefault("origins", phased.origins)
        return phased

    def build(phased):
        with tvm_noise_filtered():
            return tvm.compile(phased.mod, target=phased.parts.target,
                               relax_pipeline=phased.parts.lower)

    result = phases(search)
    if verify is not None:
        result = measure_uncertain(result, phases, build, loaded, database, search)
    parts, mod, plan = result.parts, result.mod, result.plan
    custom = parts.backend.build_model(mod, loaded, parts, plan)
    if custom is not None:
        return custom
    executable = build(result)
    result = CompiledModel(
        executable, loaded, mod, plan, parts.target, parts.hw, parts.backend.device(),
        time.perf_counter() - start,
    )
    if specialize:
        result.variants = _specialized_variants(
            model, loaded, specialize, dict(target=target, hw=hw, fusion=fusion,
                                            schedule=schedule, cost_model=cost_model,
                                            search=search, tuning_db=database, verify=verify)
        )
        result.compile_time_s = time.perf_counter() - start
    return result


def build_cuda(model, hw: str = "h100", fusion: str = "cost", cost_model: str | None = None,
               shape_dict=None):
    """Prepare, fuse, schedule and lower ``model`` for CUDA on ``hw``; no device needed.

    ``model`` is anything :func:`fusion_tvm.frontend.load_model` takes (ONNX path or
    proto, IRModule). Returns a :class:`~fusion_tvm.targets.cuda.build.CudaBuild` (the
    CUDA source, for :func:`~fusion_tvm.targets.cuda.build.nvcc_compile`).
    """
    from .targets.cuda.build import CudaBuild, cuda_source, scheduled_rules

    loaded = load_model(model, shape_dict=shape_dict)
    result = run_phases(loaded.mod, resolve("cuda", hw), fusion=fusion_mode(fusion),
                        cost_model=cost_model, origins=loaded.origins)
    executable = tvm.compile(result.mod, target=result.parts.target,
                             relax_pipeline=result.parts.lower)
    return CudaBuild(result.mod, executable, cuda_source(executable), result.plan,
                     scheduled_rules(result.mod))


def _specialized_variants(model, loaded: LoadedModel, specialize, options) -> dict:
    """Static builds of ``model`` for every combination of the hot sizes."""
    if loaded.source != "onnx":
        raise UserInputError("specialize= needs an ONNX model (its input shapes are rewritten)")
    names = sorted(specialize)
    known = {d for shape in loaded.input_shapes for d in shape if isinstance(d, str)}
    check_names(dict.fromkeys(names, 1), known)
    variants = {}
    for combo in itertools.product(*(list(specialize[n]) for n in names)):
        dims = dict(zip(names, combo, strict=True))
        shape_dict = {
            name: [dims.get(d, d) if isinstance(d, str) else d for d in shape]
            for name, shape in zip(loaded.input_names, loaded.input_shapes, strict=True)
            if any(isinstance(d, str) and d in dims for d in shape)
        }
        variants[tuple(sorted(dims.items()))] = compile(model, shape_dict=shape_dict, **options)
    return variants
