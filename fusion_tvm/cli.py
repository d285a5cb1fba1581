"""``fusion-tvm``: a thin command line over fusion_tvm's API.

    fusion-tvm plan model.onnx --shape N=1..64 --html plan.html
    fusion-tvm compile model.onnx -o model.so        # also writes model.plan.json
    fusion-tvm run model.so --out outputs/           # plain TVM runtime, random inputs
    fusion-tvm bench model.onnx --repeat 50 --threads 2
    fusion-tvm profile model.onnx --json profile.json --html report.html
    fusion-tvm explain model.onnx --ops conv2d tir_sigmoid
    fusion-tvm hw list | hw show h100 --json

Exit status: 0 success, 2 bad input (a :class:`~fusion_tvm.errors.UserInputError` or a bad
command line), 3 not implemented, 1 internal error. User errors print one line, no traceback
unless ``--debug``. Progress goes to stderr (``--quiet`` silences it); results go to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputMismatchError, ModelLoadError, UserInputError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_NOT_IMPLEMENTED = 3
PROG = "fusion-tvm"


# ------------------------------------------------------------------------------- progress
class Progress:
    """One line per step on stderr: ``[fusion-tvm] importing model.onnx ... 0.4 s``."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr

    def note(self, msg: str) -> None:
        """A line of progress (not an error)."""
        if not self.quiet:
            print(f"[{PROG}] {msg}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Time one step; say how it ended."""
        if self.quiet:
            yield
            return
        print(f"[{PROG}] {what} ...", end="", file=self.stream, flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            print(" failed", file=self.stream, flush=True)
            raise
        print(f" {time.perf_counter() - start:.1f} s", file=self.stream, flush=True)


# ---------------------------------------------------------------------------- shape hints
@dataclass(frozen=True)
class ShapeHint:
    """``N=8`` or ``N=1..64``: the value a symbolic dim takes for the cost model.

    ``value`` is the geometric midpoint of a range; the cost model evaluates the plan over
    the whole range (:meth:`for_cost_model`).
    """

    name: str
    value: int
    low: int | None = None
    high: int | None = None
    text: str = ""

    def for_cost_model(self) -> int | tuple[int, int]:
        """What the search gets: the range itself, or the single value."""
        return (self.low, self.high) if self.low is not None else self.value

    def to_json(self) -> dict:
        """``{"value": 8, "range": [1, 64]}`` (range null for a single value)."""
        rng = [self.low, self.high] if self.low is not None else None
        return {"value": self.value, "range": rng, "hint": self.text}


_HINT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*(\S+?)\s*$")


def parse_shape_hint(text: str) -> ShapeHint:
    """Parse ``NAME=INT`` or ``NAME=LOW..HIGH``; a bad hint is a user error naming it."""

    def bad(why: str) -> UserInputError:
        return UserInputError(f"bad shape hint '{text}': {why} (expected NAME=8 or NAME=1..64)")

    m = _HINT.match(text)
    if not m:
        raise bad("not of the form NAME=VALUE")
    name, value = m.groups()

    def integer(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise bad(f"'{s}' is not an integer") from None
        if v < 1:
            raise bad(f"{v} is not a positive size")
        return v

    if ".." in value:
        lo_s, _, hi_s = value.partition("..")
        lo, hi = integer(lo_s), integer(hi_s)
        if lo > hi:
            raise bad(f"empty range {lo}..{hi}")
        mid = int(round(math.sqrt(lo * hi)))
        return ShapeHint(name, min(max(mid, lo), hi), lo, hi, text)
    return ShapeHint(name, integer(value), text=text)


def parse_shape_hints(texts: Sequence[str] | None) -> list[ShapeHint]:
    """Parse every ``--shape``; a dim given twice is an error."""
    hints = [parse_shape_hint(t) for t in texts or []]
    seen: dict[str, str] = {}
    for h in hints:
        if h.name in seen:
            raise UserInputError(f"shape hint '{h.text}': dim '{h.name}' is already given by "
                                 f"'{seen[h.name]}'")
        seen[h.name] = h.text
    return hints


def symbolic_dims(loaded) -> list[str]:
    """Names of the symbolic dims a model's inputs use, in order of appearance."""
    from .graph import default_dims

    names = [d for shape in loaded.input_shapes for d in shape if isinstance(d, str)]
    names += list(default_dims(loaded.mod))
    return list(dict.fromkeys(names))


def check_hints(hints: Sequence[ShapeHint], loaded) -> dict[str, int]:
    """Hints as ``{dim: value}`` after checking that the model has each dim."""
    known = symbolic_dims(loaded)
    for h in hints:
        if h.name not in known:
            dims = ", ".join(known) if known else "none (all its dims are static)"
            raise UserInputError(f"shape hint '{h.text}': the model has no symbolic dim "
                                 f"'{h.name}'; its symbolic dims: {dims}")
    return {h.name: h.value for h in hints}


def cost_hints(hints: Sequence[ShapeHint]) -> dict[str, int | tuple[int, int]]:
    """Hints for the cost model: ranges stay ranges."""
    return {h.name: h.for_cost_model() for h in hints}


# ---------------------------------------------------------------------------------- helpers
def _load(path: str, progress: Progress):
    from .frontend import load_model

    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file '{path}' does not exist")
    if p.is_dir():
        raise ModelLoadError(f"model path '{path}' is a directory, not an ONNX file")
    with progress.step(f"importing {p.name}"):
        return load_model(str(p))


def _emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=_json_default))


def _json_default(obj):
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


def _inputs_json(loaded) -> list[dict]:
    return [
        {"name": n, "shape": list(s), "dtype": d}
        for n, s, d in zip(loaded.input_names, loaded.input_shapes, loaded.input_dtypes,
                           strict=True)
    ]


def _check_out_dir(path: str | os.PathLike) -> None:
    """Fail before the slow work when an output cannot be written."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise UserInputError(f"cannot write '{path}': directory '{parent}' does not exist")


def _write_text(path: str, text: str, what: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise UserInputError(f"cannot write {what} '{path}': {err.strerror or err}") from err


def search_plan(loaded, target: str, hw: str | None, shape_hints: dict,
                progress: Progress):
    """The plan of the partition ``compile`` builds: the phases up to scheduling (with its
    feedback), no code generated."""
    from .api import tvm_noise_filtered
    from .pipeline import resolve, run_phases

    resolved = resolve(target, hw)
    with progress.step(f"searching fusion plan ({resolved.hw.name})"), tvm_noise_filtered():
        return run_phases(loaded.mod, resolved, shape_hints=shape_hints,
                          origins=loaded.origins).plan


def _plan_json(plan, loaded, model: str, hints: Sequence[ShapeHint]) -> dict:
    data = plan.to_json()
    data["model"] = model
    data["shape_hints"] = {h.name: h.to_json() for h in hints}
    data["inputs"] = _inputs_json(loaded)
    data["outputs"] = list(loaded.output_names)
    return data


# --------------------------------------------------------------------------------- commands
def cmd_plan(args, progress: Progress) -> int:
    """Search and print the plan (nothing is built)."""
    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    if args.html:
        _check_out_dir(args.html)
    loaded = _load(args.model, progress)
    check_hints(hints, loaded)
    if args.verify:
        import fusion_tvm

        with progress.step(f"searching, building and timing uncertain blocks ({args.verify})"):
            plan = fusion_tvm.compile(loaded.mod, target=args.target, hw=args.hw,
                                      shape_hints=cost_hints(hints), verify=args.verify,
                                      tuning_db=args.tuning_db).plan
    else:
        plan = search_plan(loaded, args.target, args.hw, cost_hints(hints), progress)
    if args.html:
        from .api import model_signature
        from .report import render_html

        ins, outs = model_signature(loaded)
        with progress.step(f"writing {args.html}"):
            _write_text(args.html, render_html(plan, title=Path(args.model).name, inputs=ins,
                                               outputs=outs), "report")
    if args.json:
        data = _plan_json(plan, loaded, args.model, hints)
        if args.why:
            import dataclasses

            from .report import boundaries

            data["boundaries"] = [dataclasses.asdict(b) for b in boundaries(plan)]
        _emit_json(data)
        return EXIT_OK
    if args.why:
        from .report import render_text

        print(render_text(plan))
    else:
        print(plan.table())
    if hints:
        print("shape hints: " + ", ".join(
            f"{h.name}={h.value}" + (f" (range {h.low}..{h.high})" if h.low is not None else "")
            for h in hints))
    if args.html:
        print(f"report: {args.html}")
    return EXIT_OK


def _check_target_hw(args) -> None:
    """Resolve --target / --hw (and --verify) before the (slow) import so their errors come
    first."""
    from .pipeline import backend_name
    from .presets import get_hardware

    backend_name(args.target)
    if args.hw is not None:
        get_hardware(args.hw)
    if getattr(args, "verify", None) is not None:
        from .verify import check_verify

        check_verify(args.verify)


def companion_json(artifact: str | os.PathLike) -> Path:
    """``model.so`` -> ``model.plan.json`` (the plan written by ``compile``)."""
    from .api import companion_json as beside

    return beside(artifact)


def cmd_compile(args, progress: Progress) -> int:
    """Build, export the library and write the plan JSON next to it."""
    import fusion_tvm

    from .pipeline import backend_name

    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    out = Path(args.output)
    _check_out_dir(out)
    loaded = _load(args.model, progress)
    shape_hints = check_hints(hints, loaded)
    model, extra = loaded.mod, {}
    if backend_name(args.target) == "hls":
        # HLS designs are static: --shape fixes symbolic dims instead of just pricing them
        model = str(args.model)
        fixed = {n: [shape_hints.get(d, d) if isinstance(d, str) else d for d in shape]
                 for n, shape in zip(loaded.input_names, loaded.input_shapes, strict=True)
                 if any(isinstance(d, str) for d in shape)}
        extra = {"shape_dict": fixed} if fixed else {}
        fixed_dims = {d for shape in loaded.input_shapes for d in shape if isinstance(d, str)}
        unset = sorted(fixed_dims - set(shape_hints))
        if unset:
            raise UserInputError(f"the hls target builds static designs: fix the symbolic "
                                 f"dim(s) {unset} with --shape (e.g. --shape {unset[0]}=1)")
        hinted = {k: v for k, v in shape_hints.items() if k not in fixed_dims}
    else:
        hinted = cost_hints(hints)
    with progress.step("searching, scheduling and building"):
        cm = fusion_tvm.compile(model, target=args.target, hw=args.hw, shape_hints=hinted,
                                tuning_db=args.tuning_db, verify=args.verify, **extra)
    with progress.step(f"exporting {out}"):
        cm.export(str(out))
    meta = _plan_json(cm.plan, loaded, args.model, hints) if cm.plan is not None else {
        "model": args.model, "inputs": _inputs_json(loaded),
        "outputs": list(loaded.output_names)}
    target = getattr(cm, "target", None)  # an HLS model has no TVM target
    kind = str(target.kind.name) if target is not None else args.target
    meta.update(artifact=out.name, target_kind=kind,
                kernels_built=cm.num_kernels, compile_time_s=cm.compile_time_s)
    plan_path = companion_json(out)
    if hasattr(cm, "signature_json"):  # output shapes, for fusion_tvm.load
        meta["output_specs"] = cm.signature_json()["output_specs"]
    _write_text(str(plan_path), json.dumps(meta, indent=2, default=_json_default), "plan")
    summary = {"artifact": str(out), "plan": str(plan_path), "kernels": cm.num_kernels,
               "compile_time_s": round(cm.compile_time_s, 3)}
    if cm.plan is not None:
        summary["predicted_time_s"] = cm.plan.predicted_time_s
        summary["predicted_speedup_vs_fuseops"] = cm.plan.predicted_speedup
        if cm.plan.verified is not None:
            summary["verified"] = cm.plan.verified
    if args.json:
        _emit_json(summary)
    else:
        what = "project folder, " if out.is_dir() else ""
        print(f"wrote {out} ({what}{cm.num_kernels} kernels, compiled in "
              f"{cm.compile_time_s:.1f} s)")
        if cm.plan is not None and cm.plan.verified:
            from .plan import verified_line

            for v in cm.plan.verified:
                print(verified_line(v))
        print(f"wrote {plan_path}")
    return EXIT_OK


def cmd_tune(args, progress: Progress) -> int:
    """Measure the schedule rules' knobs kernel by kernel into a tuning database."""
    from .tuning import tune

    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    if args.trials < 1:
        raise UserInputError(f"--trials must be at least 1, got {args.trials}")
    db_path = Path(args.db)
    _check_out_dir(db_path)
    loaded = _load(args.model, progress)
    shape_hints = check_hints(hints, loaded)
    dims = {k: v for k, v in shape_hints.items() if isinstance(v, int)}
    with progress.step(f"tuning ({args.trials} candidates a kernel)"):
        report = tune(loaded.mod, str(db_path), target=args.target, hw=args.hw,
                      trials=args.trials, shape_hints=cost_hints(hints), dims=dims,
                      log=None if args.quiet or args.json else progress.note)
    tuned = [k for k in report.kernels if k.status == "tuned"]
    if args.json:
        _emit_json({"database": str(db_path), "seconds": round(report.seconds, 1),
                    "kernels": [dict(name=k.name, rule=k.rule, status=k.status,
                                     default_us=k.default_us, best_us=k.best_us,
                                     knobs=k.knobs, trials=k.trials)
                                for k in report.kernels]})
    else:
        print(report.table())
        before = sum(k.default_us for k in report.kernels)
        after = sum(k.best_us for k in report.kernels)
        print(f"{len(tuned)} of {len(report.kernels)} kernels faster with tuned knobs; "
              f"kernels alone {before / 1e3:.2f} -> {after / 1e3:.2f} ms; "
              f"wrote {db_path} ({report.seconds:.0f} s)")
        print(f"use it: fusion-tvm compile {args.model} --tuning-db {db_path} -o model.so")
    return EXIT_OK


# -- run -----------------------------------------------------------------------------------
_SIG = re.compile(r'param=([^,]+), annotation=R\.Tensor\(\(([^)]*)\), dtype="(\w+)"\)')


def signature_from_stats(stats: str) -> list[dict]:
    """Input names/shapes/dtypes of ``main`` from the VM executable's statistics text.

    The VM checks each parameter against its annotation and keeps that annotation in the
    constant pool (``ErrorContext(fn=main, loc=param[0], param=x, annotation=R.Tensor(...))``).
    """
    seen: dict[str, dict] = {}
    for line in stats.split("ErrorContext(")[1:]:
        if not line.startswith("fn=main,") or "loc=param[" not in line:
            continue
        m = _SIG.search(line)
        if not m:
            continue
        name, dims, dtype = m.groups()
        shape = [int(d) if d.strip().lstrip("-").isdigit() else d.strip()
                 for d in dims.split(",") if d.strip()]
        seen.setdefault(name, {"name": name, "shape": shape, "dtype": dtype})
    return list(seen.values())


def _random_input(spec: dict, dims: dict, rng):
    from .profile import random_array

    shape = tuple(d if isinstance(d, int) else int(dims.get(d, 1)) for d in spec["shape"])
    return random_array(shape, spec["dtype"], rng)


def _load_npy(path: str):
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserInputError(f"input file '{path}' does not exist") from None
    except (OSError, ValueError) as err:
        raise UserInputError(f"cannot read input '{path}' as .npy: {err}") from None


def _check_input(spec: dict, arr, bound: dict) -> None:
    name = spec["name"]
    if spec["dtype"] and str(arr.dtype) != spec["dtype"]:
        raise InputMismatchError(f"input '{name}' has dtype {arr.dtype}, the model expects "
                                 f"{spec['dtype']}")
    if len(arr.shape) != len(spec["shape"]):
        raise InputMismatchError(f"input '{name}' has shape {arr.shape}, the model expects "
                                 f"rank {len(spec['shape'])} {tuple(spec['shape'])}")
    for axis, (want, got) in enumerate(zip(spec["shape"], arr.shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise InputMismatchError(f"input '{name}' axis {axis} is {got}, the model "
                                     f"expects {want} (shape {tuple(spec['shape'])})")
        if isinstance(want, str) and bound.setdefault(want, got) != got:
            raise InputMismatchError(f"dim '{want}' is {bound[want]} in an earlier input but "
                                     f"{got} in input '{name}'")


def _order_inputs(args, signature: list[dict]) -> list:
    arrays = [_load_npy(p) for p in args.inputs]
    if args.input_names:
        if len(args.input_names) != len(arrays):
            raise UserInputError(f"{len(args.inputs)} --inputs but {len(args.input_names)} "
                                 "--input-names")
        if signature:
            known = [s["name"] for s in signature]
            unknown = [n for n in args.input_names if n not in known]
            if unknown:
                raise UserInputError(f"unknown input name(s) {unknown}; the model's inputs: "
                                     f"{known}")
            given = dict(zip(args.input_names, arrays, strict=True))
            missing = [n for n in known if n not in given]
            if missing:
                raise UserInputError(f"missing input(s) {missing}; the model's inputs: {known}")
            arrays = [given[n] for n in known]
    if signature and len(arrays) != len(signature):
        raise UserInputError(f"the model takes {len(signature)} inputs "
                             f"{[s['name'] for s in signature]}, got {len(arrays)}")
    return arrays


def cmd_run(args, progress: Progress) -> int:
    """Run an exported artifact with plain TVM (runtime.load_module + relax.VirtualMachine)."""
    import numpy as np
    import tvm
    from tvm import relax

    art = Path(args.artifact)
    if art.is_dir():
        raise UserInputError(f"'{art}' is a folder (an HLS project?); 'run' loads TVM libraries "
                             "(.so) written by 'compile' for llvm or cuda")
    if not art.is_file():
        raise UserInputError(f"artifact '{art}' does not exist")
    for path in args.inputs:
        if not Path(path).is_file():
            raise UserInputError(f"input file '{path}' does not exist")
    meta_path = companion_json(art)
    meta = {}
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UserInputError(f"cannot read plan '{meta_path}': {err}") from None
    with progress.step(f"loading {art.name}"):
        try:
            lib = tvm.runtime.load_module(str(art))
        except Exception as err:  # noqa: BLE001 - TVM raises plain errors for bad files
            first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise UserInputError(f"cannot load '{art}' as a TVM library: {first}") from None
        device = tvm.cuda() if meta.get("target_kind") == "cuda" else tvm.cpu()
        if meta.get("target_kind") != "cuda":
            from .threads import use_all_cores

            use_all_cores()
        vm = relax.VirtualMachine(lib, device)
    signature = meta.get("inputs") or []
    if not signature:
        with contextlib.suppress(Exception):
            signature = signature_from_stats(lib["stats"]())
    if args.inputs:
        arrays = _order_inputs(args, signature)
    else:
        if not signature:
            raise UserInputError(f"cannot tell the inputs of '{art}': no {meta_path.name} next "
                                 "to it; pass --inputs")
        rng = np.random.default_rng(args.seed)
        dims = meta.get("dims") or {}
        arrays = [_random_input(s, dims, rng) for s in signature]
        progress.note("random inputs: " + ", ".join(
            f"{s['name']}{tuple(a.shape)}:{a.dtype}" for s, a in zip(signature, arrays,
                                                                      strict=True)))
    bound: dict = {}
    for spec, arr in zip(signature, arrays, strict=False):
        _check_input(spec, arr, bound)
    with progress.step("running"):
        t0 = time.perf_counter()
        result = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a), device)
                              for a in arrays])
        elapsed = time.perf_counter() - t0
    from .api import flatten_outputs

    outputs = flatten_outputs(result)
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"cannot create output directory '{out_dir}': {err}") from None
    names = meta.get("outputs") or []
    if len(names) != len(outputs):
        names = [f"output_{i}" for i in range(len(outputs))]
    written = []
    for name, arr in zip(names, outputs, strict=True):
        path = out_dir / (re.sub(r"[^\w.-]", "_", name) + ".npy")
        np.save(path, arr)
        written.append({"name": name, "path": str(path), "shape": list(arr.shape),
                        "dtype": str(arr.dtype)})
    if args.json:
        _emit_json({"artifact": str(art), "time_s": elapsed, "outputs": written})
    else:
        for w in written:
            print(f"{w['name']}: {tuple(w['shape'])} {w['dtype']} -> {w['path']}")
        print(f"ran in {elapsed * 1e3:.2f} ms (first run, includes warm-up)")
    return EXIT_OK


# -- bench ---------------------------------------------------------------------------------
def _feeds_for(loaded, dims: dict, seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {s["name"]: _random_input(s, dims, rng) for s in _inputs_json(loaded)}


def cmd_bench(args, progress: Progress) -> int:
    """Measured latency of ours vs FuseOps vs onnxruntime, interleaved."""
    import numpy as np

    import fusion_tvm

    if args.repeat < 1:
        raise UserInputError(f"--repeat must be at least 1, got {args.repeat}")
    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    loaded = _load(args.model, progress)
    shape_hints = check_hints(hints, loaded)
    from .graph import default_dims

    feeds = _feeds_for(loaded, default_dims(loaded.mod, shape_hints))
    runners: dict[str, Any] = {}
    notes: list[str] = []
    kernels: dict[str, int] = {}
    predicted = None
    for label, fusion in (("ours", "cost"), ("fuseops", "fuseops")):
        with progress.step(f"building {label}"):
            cm = fusion_tvm.compile(loaded.mod, target=args.target, hw=args.hw, fusion=fusion,
                                    shape_hints=cost_hints(hints))
        kernels[label] = cm.num_kernels
        if cm.plan is not None:
            predicted = cm.plan
        arrays = [feeds[n] for n in loaded.input_names]
        runners[label] = (lambda cm=cm, arrays=arrays: cm.run(arrays))
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads or 0
        with progress.step("creating onnxruntime session"):
            sess = ort.InferenceSession(str(args.model), opts,
                                        providers=["CPUExecutionProvider"])
        runners["onnxruntime"] = lambda: sess.run(None, feeds)
    except ImportError:
        notes.append("onnxruntime is not installed: not measured")
    except Exception as err:  # noqa: BLE001 - ORT's own failure is a note, not our error
        notes.append(f"onnxruntime failed: {str(err).splitlines()[0]}")

    reference = [np.asarray(o) for o in runners["onnxruntime"]()] if "onnxruntime" in runners \
        else None
    errors = {}
    for label in list(runners):
        out = [np.asarray(o) for o in runners[label]()]  # warm-up + numerics check
        if reference is not None and label != "onnxruntime":
            errors[label] = max(float(np.max(np.abs(a.astype(np.float64) - b)))
                                if a.size else 0.0 for a, b in zip(out, reference, strict=True))
    times: dict[str, list[float]] = {k: [] for k in runners}
    labels = list(runners)
    with progress.step(f"benchmarking {args.repeat} interleaved rounds"):
        for r in range(args.repeat):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                t0 = time.perf_counter()
                runners[label]()
                times[label].append(time.perf_counter() - t0)
    rows = []
    for label in labels:
        ts = times[label]
        rows.append({"contender": label, "kernels": kernels.get(label),
                     "median_ms": statistics.median(ts) * 1e3, "min_ms": min(ts) * 1e3,
                     "max_ms": max(ts) * 1e3, "max_abs_err_vs_onnxruntime": errors.get(label)})
    result = {"model": args.model, "repeat": args.repeat, "threads": args.threads,
              "rows": rows, "notes": notes}
    if predicted is not None:
        result["predicted_ms"] = predicted.predicted_time_s * 1e3
        result["predicted_fuseops_ms"] = (predicted.fuseops_time_s * 1e3
                                          if predicted.fuseops_time_s else None)
    if args.json:
        _emit_json(result)
        return EXIT_OK
    print(f"{'contender':<12} {'kernels':>7} {'median ms':>10} {'min ms':>9} {'max ms':>9} "
          f"{'max |err|':>10}")
    for row in rows:
        err = row["max_abs_err_vs_onnxruntime"]
        print(f"{row['contender']:<12} {row['kernels'] if row['kernels'] is not None else '-':>7} "
              f"{row['median_ms']:>10.3f} {row['min_ms']:>9.3f} {row['max_ms']:>9.3f} "
              f"{(f'{err:.2e}' if err is not None else '-'):>10}")
    by = {r["contender"]: r["median_ms"] for r in rows}
    if by.get("ours"):
        print(f"speedup vs FuseOps: {by['fuseops'] / by['ours']:.2f}x" + (
            f", vs onnxruntime: {by['onnxruntime'] / by['ours']:.2f}x"
            if "onnxruntime" in by else ""))
    for n in notes:
        print(f"note: {n}")
    return EXIT_OK


# -- profile -------------------------------------------------------------------------------
def cmd_profile(args, progress: Progress) -> int:
    """Every kernel of one run: measured, predicted, rule, GFLOP/s, GB/s, roofline share."""
    import fusion_tvm

    if args.repeat < 1:
        raise UserInputError(f"--repeat must be at least 1, got {args.repeat}")
    from .pipeline import backend_name

    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    if backend_name(args.target) != "llvm":
        raise UserInputError(f"profile times kernels on this CPU: --target llvm, not "
                             f"'{args.target}'")
    to_stdout = args.json or args.json_out == "-"
    for path in (args.html, None if to_stdout else args.json_out):
        if path:
            _check_out_dir(path)
    loaded = _load(args.model, progress)
    check_hints(hints, loaded)
    with progress.step("searching, scheduling and building"):
        cm = fusion_tvm.compile(loaded.mod, target=args.target, hw=args.hw,
                                shape_hints=cost_hints(hints))
    name = Path(args.model).name
    with progress.step(f"timing {cm.num_kernels} kernels and the whole run"):
        prof = cm.profile(repeat=args.repeat, seed=args.seed, model=name)
    if args.html:
        from .report import render_html

        with progress.step(f"writing {args.html}"):
            _write_text(args.html, render_html(cm.plan, title=name, profile=prof,
                                               inputs=cm.inputs, outputs=cm.outputs), "report")
    if to_stdout:
        _emit_json(prof.to_json())
        return EXIT_OK
    if args.json_out:
        _write_text(args.json_out, json.dumps(prof.to_json(), indent=2) + "\n", "profile")
    print(prof.table())
    for path, what in ((args.json_out, "json"), (args.html, "report")):
        if path:
            print(f"{what}: {path}")
    return EXIT_OK


# -- explain -------------------------------------------------------------------------------
def cmd_explain(args, progress: Progress) -> int:
    """Why are two ops (not) fused?"""
    from .report import explain_ops

    hints = parse_shape_hints(args.shape)
    _check_target_hw(args)
    loaded = _load(args.model, progress)
    check_hints(hints, loaded)
    plan = search_plan(loaded, args.target, args.hw, cost_hints(hints), progress)
    a, b = args.ops
    exp, notes = explain_ops(plan, a, b)
    for n in notes:
        print(f"[{PROG}] note: {n}", file=sys.stderr)
    if args.json:
        _emit_json(exp.to_json())
    else:
        print(exp)
    return EXIT_OK


# -- hw ------------------------------------------------------------------------------------
def _hw_summary(spec) -> dict:
    from .ops import OpClass

    return {
        "name": spec.name, "kind": spec.kind.value, "target": dict(spec.target).get("kind", ""),
        "cores": spec.num_cores,
        "peak_matmul_gflops": spec.peak_flops[OpClass.MATMUL] / 1e9,
        "dram_gbps": spec.dram.bandwidth_bytes_per_s / 1e9,
        "on_chip": {lvl.name: lvl.capacity_bytes for lvl in spec.on_chip},
    }


def cmd_hw(args, progress: Progress) -> int:
    """List, show (or calibrate) hardware presets."""
    from .presets import get_hardware, list_hardware

    if args.hw_command == "calibrate":
        return _calibrate_hook(args, progress)
    if args.hw_command == "list":
        rows = []
        for name in list_hardware():
            try:
                rows.append(_hw_summary(get_hardware(name)))
            except Exception as err:  # noqa: BLE001 - one broken preset must not hide others
                rows.append({"name": name, "error": str(err)})
        if args.json:
            _emit_json(rows)
            return EXIT_OK
        print(f"{'name':<16} {'kind':<5} {'target':<7} {'cores':>5} {'matmul GFLOP/s':>15} "
              f"{'DRAM GB/s':>10}")
        for r in rows:
            if "error" in r:
                print(f"{r['name']:<16} error: {r['error']}")
                continue
            print(f"{r['name']:<16} {r['kind']:<5} {r['target']:<7} {r['cores']:>5} "
                  f"{r['peak_matmul_gflops']:>15.0f} {r['dram_gbps']:>10.1f}")
        return EXIT_OK
    spec = get_hardware(args.name)
    if args.json:
        _emit_json(spec.to_json())
        return EXIT_OK
    s = _hw_summary(spec)
    print(f"{spec.name}: {s['kind']} ({s['target']} target {dict(spec.target)})")
    print(f"  cores/SMs/CUs: {spec.num_cores}, SIMD {spec.simd_width_bits} bits, "
          f"launch overhead {spec.launch_overhead_s * 1e6:.1f} us")
    for cls, v in spec.peak_flops.items():
        print(f"  peak {cls.value:<15} {v / 1e9:>12.1f} GFLOP/s")
    for lvl in spec.memory:
        print(f"  memory {lvl.name:<6} {_bytes(lvl.capacity_bytes):>10} "
              f"{lvl.bandwidth_bytes_per_s / 1e9:>10.1f} GB/s{' shared' if lvl.shared else ''}")
    if spec.efficiency:
        print("  efficiency: " + ", ".join(f"{k}={v:.2f}" for k, v in spec.efficiency.items()))
    return EXIT_OK


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _calibrate_hook(args, progress: Progress) -> int:
    """``hw calibrate``: handed to ``fusion_tvm.calibration.cli_main(argv)`` once it exists."""
    try:
        mod = importlib.import_module("fusion_tvm.calibration")
    except ModuleNotFoundError:
        mod = None
    entry = getattr(mod, "cli_main", None)
    if entry is None:
        print(f"{PROG}: hw calibrate: not implemented yet", file=sys.stderr)
        return EXIT_NOT_IMPLEMENTED
    return int(entry(list(args.calibrate_args)) or 0)


# ----------------------------------------------------------------------------------- parser
def _common(json_flag: bool = True) -> argparse.ArgumentParser:
    """Global flags, accepted before or after the subcommand."""
    p = argparse.ArgumentParser(add_help=False)
    sup = argparse.SUPPRESS
    p.add_argument("--quiet", "-q", action="store_true", default=sup,
                   help="no progress on stderr")
    p.add_argument("--debug", action="store_true", default=sup,
                   help="print tracebacks for every error")
    if json_flag:
        p.add_argument("--json", action="store_true", default=sup,
                       help="machine-readable output on stdout")
    return p


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--target", default="llvm",
                   help="llvm (default), cuda or hls, or a TVM target as JSON "
                        "('{\"kind\": \"llvm\", \"mcpu\": \"znver4\"}')")
    p.add_argument("--hw", default=None,
                   help="hardware preset (see 'hw list') or a spec .json; default: the "
                        "target's default")
    p.add_argument("--shape", action="append", metavar="DIM=N|DIM=LO..HI",
                   help="value of a symbolic dim for the cost model (repeatable)")


def _verify_options(p: argparse.ArgumentParser, tuning_db: bool = True) -> None:
    p.add_argument("--verify", metavar="measure", default=None,
                   help="measure: where the cost model's choice for a block is within its "
                        "error band, build both candidates, time them here and keep the "
                        "faster (a few seconds; cached in --tuning-db)")
    if tuning_db:
        p.add_argument("--tuning-db", metavar="DB.json", default=None,
                       help="measured block decisions read and written with --verify")


def _version() -> str:
    """``fusion-tvm 0.1.0 (apache-tvm 0.27.0.post1)``, read without importing TVM."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "unknown"

    return f"{PROG} {of('fusion_tvm')} (apache-tvm {of('apache-tvm')})"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``fusion-tvm``."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[_common()],
        description="Cost-model-driven operator fusion for Apache TVM: plan, compile, run, "
                    "benchmark, profile and explain.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("plan", parents=[common], help="search and print the fusion plan")
    _model_options(p)
    p.add_argument("--html", metavar="OUT.html", help="write the interactive HTML report")
    p.add_argument("--why", action="store_true",
                   help="also say why each kernel boundary is there (explain() per boundary)")
    _verify_options(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("compile", parents=[common], help="build a shared library (+ plan JSON)")
    _model_options(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT.so")
    p.add_argument("--tuning-db", metavar="DB.json", default=None,
                   help="knob values measured by 'tune' and measured block decisions "
                        "(optional)")
    _verify_options(p, tuning_db=False)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("tune", parents=[common],
                       help="measure schedule knobs per kernel into a tuning database")
    _model_options(p)
    p.add_argument("--db", required=True, metavar="DB.json",
                   help="database file (created, or its records improved)")
    p.add_argument("--trials", type=int, default=16,
                   help="candidates per kernel besides the default (default 16)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("run", parents=[common], help="run a compiled artifact with plain TVM")
    p.add_argument("artifact", help="library written by 'compile'")
    p.add_argument("--inputs", nargs="+", metavar="X.npy", default=[],
                   help="input arrays in the model's order (random when absent)")
    p.add_argument("--input-names", nargs="+", metavar="NAME",
                   help="names of the --inputs files, in the same order")
    p.add_argument("--out", default="outputs", metavar="DIR",
                   help="directory for the outputs (.npy); default: ./outputs")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", parents=[common],
                       help="measure ours vs FuseOps vs onnxruntime (interleaved)")
    _model_options(p)
    p.add_argument("--repeat", type=int, default=20, help="interleaved rounds (default 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for TVM (TVM_NUM_THREADS) and onnxruntime")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("profile", parents=[_common(json_flag=False)],
                       help="time every kernel of one run against the plan's predictions")
    _model_options(p)
    p.add_argument("--json", dest="json_out", nargs="?", const="-", default=None,
                   metavar="FILE", help="write the profile as JSON to FILE (alone or '-': "
                                        "to stdout instead of the table)")
    p.add_argument("--html", metavar="OUT.html",
                   help="write the plan's HTML report with the profile as a section")
    p.add_argument("--repeat", type=int, default=7,
                   help="timing rounds, the minimum kept (default 7; each kernel loops "
                        "for >= 3 ms a round)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("explain", parents=[common], help="why are two ops (not) fused?")
    _model_options(p)
    p.add_argument("--ops", nargs=2, required=True, metavar=("A", "B"),
                   help="two ops, by binding or PrimFunc name (lv12, conv2d1, lv5#3)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("hw", parents=[common], help="hardware presets")
    hw = p.add_subparsers(dest="hw_command", metavar="list|show|calibrate", required=True)
    hw.add_parser("list", parents=[common], help="list the presets")
    show = hw.add_parser("show", parents=[common], help="show one preset or spec file")
    show.add_argument("name", help="preset name or spec .json")
    cal = hw.add_parser("calibrate", parents=[common], help="measure this machine into a spec JSON")
    cal.add_argument("calibrate_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_hw)
    return parser


# ------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fusion-tvm`` / ``python -m fusion_tvm``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["hw", "calibrate"]:
        # calibration parses its own options (argparse REMAINDER drops leading flags)
        from .calibration import cli_main

        try:
            return int(cli_main(argv[2:]) or 0)
        except SystemExit as exc:  # its argparse errors
            return int(exc.code or 0)
        except UserInputError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return EXIT_USER
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("quiet", "debug", "json"):
        setattr(args, flag, bool(getattr(args, flag, False)))
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            parser.error(f"--threads must be at least 1, got {threads}")
        # Read by TVM's thread pool when it starts, i.e. before any kernel runs.
        os.environ["TVM_NUM_THREADS"] = str(threads)
    progress = Progress(quiet=args.quiet)
    try:
        return args.func(args, progress)
    except UserInputError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {err}", file=sys.stderr)
        _json_error(args, err, EXIT_USER)
        return EXIT_USER
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        with contextlib.suppress(Exception):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return EXIT_OK
    except Exception as err:  # noqa: BLE001 - the last line of defence
        if args.debug:
            traceback.print_exc()
        msg = str(err).strip().splitlines()
        print(f"{PROG}: internal error: {type(err).__name__}: {msg[0] if msg else ''}\n"
              f"  (this is a bug; rerun with --debug for the traceback and please report it)",
              file=sys.stderr)
        _json_error(args, err, EXIT_INTERNAL)
        return EXIT_INTERNAL


def _json_error(args, err: BaseException, code: int) -> None:
    """With --json, a failure is also a JSON object on stdout (scripts read one stream)."""
    if getattr(args, "json", False):
        _emit_json({"error": str(err), "type": type(err).__name__, "exit_code": code})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
