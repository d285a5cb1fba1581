"""The bad-input table: every kind of wrong input, run for real, with the error a user sees.

    python benchmarks/bad_inputs.py            # Markdown on stdout, JSON + .md under results/

Each case builds its bad input, calls the public API and records the exception type and
message (or, for NaN/Inf feeds, how the outputs compare with the unfused build). A case
passes when it raises the expected :mod:`fusion_tvm.errors` type (never a TVM traceback);
the script exits 1 when one does not. ``tests/test_bad_inputs.py`` asserts the same cases
and the message contents.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when run as a script

import fusion_tvm  # noqa: E402
from fusion_tvm.errors import (  # noqa: E402
    CapacityError,
    InputMismatchError,
    InvalidHardwareSpecError,
    ModelLoadError,
    UnknownNameError,
    UnsupportedOperatorError,
    UserInputError,
)
from fusion_tvm.hardware import HardwareSpec  # noqa: E402
from fusion_tvm.testing.small_models import embedding_model  # noqa: E402
from fusion_tvm.testing.small_models import float_model as _model  # noqa: E402
from fusion_tvm.testing.small_models import two_input_model as _two_input_model  # noqa: E402

HW = "ci-x86-avx2"
RESULTS = Path(__file__).resolve().parent / "results"


def _feeds(n=2, m=None, **override):
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((n, 4), dtype=np.float32),
             "b": rng.standard_normal((m or n, 3), dtype=np.float32)}
    return {**feeds, **override}


def _spec(**change) -> dict:
    spec = fusion_tvm.get_hardware(HW).to_json()
    for level, (field, value) in change.items():
        index = next(i for i, m in enumerate(spec["memory"]) if m["name"] == level)
        spec["memory"][index][field] = value
    return spec


def _file(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def cases(tmp: Path):
    """(group, what the user gave, expected error type, thunk) for every bad input."""
    good = _two_input_model()
    data = good.SerializeToString()
    compiled = {}

    def run(feeds):
        if "cm" not in compiled:
            compiled["cm"] = fusion_tvm.compile(good, hw=HW)
        return compiled["cm"].run(feeds)

    yield ("model file", "a text file named model.onnx", ModelLoadError,
           lambda: fusion_tvm.compile(_file(tmp, "model.onnx", b"not a protobuf\n" * 20), hw=HW))
    yield ("model file", "an empty file", ModelLoadError,
           lambda: fusion_tvm.load_model(_file(tmp, "empty.onnx", b"")))
    yield ("model file", "a model file cut in half", ModelLoadError,
           lambda: fusion_tvm.compile(_file(tmp, "cut.onnx", data[: len(data) // 2]), hw=HW))
    yield ("model file", "a path that does not exist", ModelLoadError,
           lambda: fusion_tvm.load_model(tmp / "nope.onnx"))
    yield ("model file", "a dict instead of a model", UserInputError,
           lambda: fusion_tvm.compile({"not": "a model"}, hw=HW))
    yield ("model", "an unknown op 'FrobnicateTensor' at node 'the_culprit'",
           UnsupportedOperatorError,
           lambda: fusion_tvm.compile(_model(
               [helper.make_node("Relu", ["x"], ["r"], name="first"),
                helper.make_node("FrobnicateTensor", ["r"], ["y"], name="the_culprit")],
               [("x", [2, 3])], [("y", [2, 3])]), hw=HW))
    yield ("model", "an op of a custom domain (com.example.Relu)", UnsupportedOperatorError,
           lambda: fusion_tvm.load_model(_model(
               [helper.make_node("Relu", ["x"], ["y"], name="custom_relu", domain="com.example")],
               [("x", [2, 3])], [("y", [2, 3])], domains=["com.example"])))
    bn_params = [helper.make_tensor(n, TensorProto.FLOAT, [3], [1.0, 0.5, 2.0])
                 for n in ("scale", "bias", "mean", "var")]
    yield ("model", "BatchNormalization with training_mode=1", UnsupportedOperatorError,
           lambda: fusion_tvm.compile(_model(
               [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                                 ["y"], name="bn_train", training_mode=1)],
               [("x", [2, 3, 4])], [("y", [2, 3, 4])], bn_params), hw=HW))
    yield ("model", "MatMul weight 'weights_fc1' neither an input nor an initializer",
           UserInputError,
           lambda: fusion_tvm.compile(_model(
               [helper.make_node("MatMul", ["x", "weights_fc1"], ["y"], name="fc1")],
               [("x", [2, 4])], [("y", [2, 3])]), hw=HW))
    yield ("run time", "1 input for a 2-input model", InputMismatchError,
           lambda: run([_feeds()["a"]]))
    yield ("run time", "input named 'B' instead of 'b'", InputMismatchError,
           lambda: run({"a": _feeds()["a"], "B": _feeds()["b"]}))
    yield ("run time", "a: [2, 5] where the model wants [N, 4]", InputMismatchError,
           lambda: run(_feeds(a=np.zeros((2, 5), np.float32))))
    yield ("run time", "b of rank 3 where the model wants rank 2", InputMismatchError,
           lambda: run(_feeds(b=np.zeros((2, 3, 1), np.float32))))
    yield ("run time", "a as float64 where the model wants float32", InputMismatchError,
           lambda: run(_feeds(a=np.zeros((2, 4), np.float64))))
    yield ("run time", "N = 2 in a but N = 3 in b", InputMismatchError,
           lambda: run(_feeds(n=2, m=3)))
    yield ("run time", "token id 10 for a 10-row embedding table (Gather)", InputMismatchError,
           lambda: fusion_tvm.compile(embedding_model(rows=10), hw=HW).run(
               {"ids": np.array([[1, 2, 10]], dtype="int64")}))
    yield ("run time", "NaN, +Inf, -Inf in every input (random graphs, seeds 0-4)", None,
           _nan_inf)
    yield ("hardware", "DRAM bandwidth -1", InvalidHardwareSpecError,
           lambda: HardwareSpec.from_json(_spec(DRAM=("bandwidth_bytes_per_s", -1.0))))
    yield ("hardware", "L1 capacity 0", InvalidHardwareSpecError,
           lambda: HardwareSpec.from_json(_spec(L1=("capacity_bytes", 0))))
    yield ("hardware", "spec JSON without peak_flops", InvalidHardwareSpecError,
           lambda: HardwareSpec.from_json(
               {k: v for k, v in _spec().items() if k != "peak_flops"}))
    yield ("hardware", "a hardware JSON file that is not valid JSON", InvalidHardwareSpecError,
           lambda: fusion_tvm.get_hardware(
               str(_file(tmp, "broken.json", b'{"name": "x", "kind": '))))
    yield ("names", "target='tpu'", UnknownNameError,
           lambda: fusion_tvm.compile(good, target="tpu", hw=HW))
    yield ("names", "hw='b200' (no such preset)", UnknownNameError,
           lambda: fusion_tvm.compile(good, hw="b200"))
    yield ("names", "cost_model='oracle'", UnknownNameError,
           lambda: fusion_tvm.compile(good, hw=HW, cost_model="oracle"))
    yield ("names", "fusion='greedy'", UnknownNameError,
           lambda: fusion_tvm.compile(good, hw=HW, fusion="greedy"))
    yield ("FPGA", "a 1024x1024 transpose on zcu104 (target='hls')", CapacityError,
           lambda: fusion_tvm.compile(_model(
               [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0], name="tr"),
                helper.make_node("Relu", ["t"], ["y"], name="relu")],
               [("x", [1024, 1024])], [("y", [1024, 1024])]), target="hls", hw="zcu104"))


def _nan_inf() -> str:
    """NaN/Inf feeds must come out exactly where the unfused build puts them."""
    from fusion_tvm.testing.random_onnx import compare, random_model

    outcome, bad = [], False
    for seed in range(5):
        case = random_model(seed, 4, 8)
        rng = np.random.default_rng(seed)
        feeds = {}
        for name, arr in case.feeds.items():
            arr = arr.copy()
            if arr.dtype.kind == "f" and arr.size:
                flat = arr.reshape(-1)
                idx = rng.choice(flat.size, size=min(3, flat.size), replace=False)
                flat[idx] = [np.nan, np.inf, -np.inf][: len(idx)]
            feeds[name] = arr
        try:
            ours = fusion_tvm.compile(case.model, hw=HW, fusion="cost").run(feeds)
            base = fusion_tvm.compile(case.model, hw=HW, fusion="none").run(feeds)
        except Exception as err:  # noqa: BLE001 - recorded in the row
            outcome.append(f"seed {seed}: {type(err).__name__}: {str(err).splitlines()[0]}")
            bad = True
            continue
        diff = compare(ours, base)
        nan = "NaN in an output" if any(np.isnan(o).any() for o in base) else "no NaN out"
        outcome.append(f"seed {seed}: {'differs: ' + diff if diff else 'equal'} ({nan})")
        bad = bad or bool(diff)
    summary = "; ".join(outcome)
    if bad:
        raise RuntimeError(summary)
    return "no error; outputs equal the unfused build's (same NaN mask, infinities): " + summary


def run_all(tmp: Path) -> list[dict]:
    rows = []
    for group, given, expected, thunk in cases(tmp):
        row = {"group": group, "input": given,
               "expected": expected.__name__ if expected else "no error"}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = thunk()
        except Exception as err:  # noqa: BLE001 - the table records whatever is raised
            message = str(err).strip().replace(str(tmp), "<tmp>")
            row["raised"], row["message"] = type(err).__name__, message
            row["ok"] = expected is not None and isinstance(err, expected)
        else:
            row["raised"] = "no error"
            row["message"] = result if isinstance(result, str) else ""
            row["ok"] = expected is None
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    def cell(text: str) -> str:
        text = " ".join(text.split())
        return (text if len(text) <= 300 else text[:297] + "...").replace("|", "\\|")

    lines = ["| | input | error | message |", "|---|---|---|---|"]
    for r in rows:
        mark = "ok" if r["ok"] else f"**expected {r['expected']}**"
        lines.append(f"| {r['group']} | {cell(r['input'])} | {r['raised']} ({mark}) | "
                     f"{cell(r['message'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "bad_inputs",
                        help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_all(Path(tmp))
    table = markdown(rows)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("# Bad inputs\n\n" + table + "\n")
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} cases raise the expected error")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
