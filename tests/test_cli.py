"""``python -m fusion_tvm``: every subcommand end to end, and the user-error paths.

Each call is a fresh interpreter (TVM's import dominates), so the error cases run a few at a
time in parallel and the successful paths use small models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fusion_tvm.cli import main, parse_shape_hint

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fusion_tvm" / "examples" / "detection_head.onnx"
HW = "ci-x86-avx2"


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, TVM_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fusion_tvm", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr
    return res


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo

    d = tmp_path_factory.mktemp("models")
    onnx.save(zoo.get_model("mlp", small=True, dynamic=True), d / "mlp.onnx")
    (d / "garbage.onnx").write_bytes(b"\x08\x07garbage, not a protobuf \xff\xfe" * 20)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node("FrobnicateXYZ", ["x"], ["y"], name="frob_node")
    graph = helper.make_graph([node], "weird", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              d / "unsupported.onnx")
    return d


# ------------------------------------------------------------------------------ shape hints
@pytest.mark.parametrize("text, value, rng", [("N=8", 8, None), ("N=1..64", 8, (1, 64)),
                                              ("S=16..16", 16, (16, 16)),
                                              ("batch=2..8", 4, (2, 8))])
def test_parse_shape_hint(text, value, rng):
    h = parse_shape_hint(text)
    assert h.value == value
    assert (h.low, h.high) == (rng if rng else (None, None))


# -------------------------------------------------------------------------------- commands
def test_plan_detection_head_table_and_html(tmp_path):
    html = tmp_path / "plan.html"
    res = ok(cli("plan", EXAMPLE, "--hw", HW, "--html", html, "--why"))
    assert "kernel boundaries (why not fused):" in res.stdout
    assert "fusion plan for llvm on ci-x86-avx2" in res.stdout
    assert "kernels: unfused" in res.stdout and "predicted speedup vs FuseOps" in res.stdout
    assert "searching fusion plan" in res.stderr  # progress goes to stderr
    page = html.read_text()
    assert page.count('class="group" data-group=') >= 2


def test_plan_json_keeps_the_hint_range(models, capsys):
    # in-process (the subprocess path is covered above): same main(), no TVM re-import
    assert main(["plan", str(models / "mlp.onnx"), "--hw", HW, "--shape", "N=1..64",
                 "--json", "--quiet", "--why"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    data = json.loads(out.out)
    assert data["shape_hints"]["N"] == {"value": 8, "range": [1, 64], "hint": "N=1..64"}
    assert data["dims"]["N"] == 8
    assert data["num_kernels"] == len(data["groups"]) >= 1
    assert data["inputs"] == [{"name": "input", "shape": ["N", 64], "dtype": "float32"}]
    assert {b["group"] for b in data["boundaries"]} == set(range(data["num_kernels"]))
    assert all(b["reason"] for b in data["boundaries"])


def test_compile_then_run_with_plain_tvm(models, tmp_path, capsys, monkeypatch):
    import onnxruntime as ort

    so = tmp_path / "mlp.so"
    res = ok(cli("compile", models / "mlp.onnx", "-o", so, "--hw", HW, "--shape", "N=4"))
    assert so.is_file() and (tmp_path / "mlp.plan.json").is_file()
    meta = json.loads((tmp_path / "mlp.plan.json").read_text())
    assert meta["kernels_built"] >= 1 and meta["outputs"] == ["probs"]
    assert "wrote" in res.stdout

    ok(cli("run", so, "--out", "rand", "--quiet", cwd=tmp_path))  # random inputs (N=4)
    assert np.load(tmp_path / "rand" / "probs.npy").shape == (4, 10)

    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(so), "--inputs", "x.npy", "--input-names", "input", "--out",
                 "given", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["name"] for o in out] == ["probs"]
    got = np.load(tmp_path / out[0]["path"])
    sess = ort.InferenceSession(str(models / "mlp.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)


def test_bench_json(models):
    res = ok(cli("bench", models / "mlp.onnx", "--hw", HW, "--repeat", "3", "--threads", "1",
                 "--json"))
    data = json.loads(res.stdout)
    rows = {r["contender"]: r for r in data["rows"]}
    assert {"ours", "fuseops", "onnxruntime"} <= set(rows)
    for r in rows.values():
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert rows["ours"]["max_abs_err_vs_onnxruntime"] < 1e-4
    assert "benchmarking 3 interleaved rounds" in res.stderr


def test_explain_by_primfunc_names(models):
    res = ok(cli("explain", models / "mlp.onnx", "--hw", HW, "--ops", "matmul", "relu",
                 "--json", "-q"))
    data = json.loads(res.stdout)
    assert data["fused"] is True and data["reason"]
    assert data["op_a"].startswith("matmul") and data["op_b"].startswith("relu")


def test_hw_list_and_show(capsys):
    assert main(["hw", "list", "--json"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert {"ci-x86-avx2", "h100", "u250"} <= {r["name"] for r in names}
    spec = json.loads(ok(cli("hw", "show", HW, "--json")).stdout)
    from fusion_tvm.hardware import HardwareSpec

    assert HardwareSpec.from_json(spec).name == HW


# ----------------------------------------------------------------------------- error paths
# (args, exit code, what stderr must name); paths are relative to the models dir. The first
# group runs as real processes (exit status and stderr as a user sees them); the others call
# the same main() in-process, which is much faster than another TVM import.
PROCESS_ERRORS = {
    "missing_file": (["plan", "nope.onnx"], 2, ["nope.onnx", "does not exist"]),
    "corrupt_onnx": (["plan", "garbage.onnx"], 2, ["garbage.onnx", "not a readable ONNX"]),
    "unsupported_op": (["plan", "unsupported.onnx"], 2, ["FrobnicateXYZ", "frob_node"]),
    "bad_shape_hint": (["plan", "mlp.onnx", "--shape", "N=abc"], 2, ["N=abc", "integer"]),
    "unknown_preset": (["plan", "mlp.onnx", "--hw", "nosuch-gpu"], 2,
                       ["nosuch-gpu", "ci-x86-avx2"]),
}
INPROCESS_ERRORS = {
    "hint_empty_range": (["plan", "mlp.onnx", "--shape", "N=5..2"], 2, ["N=5..2", "range"]),
    "hint_unknown_dim": (["plan", "mlp.onnx", "--shape", "Q=4"], 2, ["Q=4", "'Q'", "N"]),
    "hint_twice": (["plan", "mlp.onnx", "--shape", "N=4", "--shape", "N=8"], 2, ["N=8"]),
    "bad_hw_file": (["plan", "mlp.onnx", "--hw", "nope.json"], 2, ["nope.json"]),
    "unknown_target": (["compile", "mlp.onnx", "-o", "x.so", "--target", "tpu"], 2, ["'tpu'"]),
    "unknown_op": (["explain", "mlp.onnx", "--ops", "matmul", "nosuchop"], 2,
                   ["nosuchop", "lv1"]),
    "missing_artifact": (["run", "nope.so"], 2, ["nope.so", "does not exist"]),
    "bad_artifact": (["run", "garbage.onnx"], 2, ["garbage.onnx", "TVM library"]),
    "missing_npy": (["run", "garbage.onnx", "--inputs", "nope.npy"], 2, ["nope.npy"]),
    "bad_repeat": (["bench", "mlp.onnx", "--repeat", "0"], 2, ["--repeat"]),
    "no_command": ([], 2, ["usage:"]),
    "bad_option": (["plan", "mlp.onnx", "--frobnicate"], 2, ["--frobnicate"]),
    "calibrate_bad_option": (["hw", "calibrate", "--no-such-flag"], 2, ["--no-such-flag"]),
    "hls_needs_static": (["compile", "mlp.onnx", "-o", "d", "--target", "hls"], 2,
                         ["--shape N="]),
    "run_hls_folder": (["run", "."], 2, ["folder"]),
    "html_dir_missing": (["plan", "mlp.onnx", "--html", "no/such/dir/p.html"], 2,
                         ["no/such/dir"]),
}


def _check_error(res_rc: int, stderr: str, code: int, words: list[str]) -> None:
    assert res_rc == code, stderr
    assert "Traceback" not in stderr
    for w in words:
        assert w in stderr, f"{w!r} not in {stderr!r}"
    if code == 2 and "usage:" not in stderr:
        assert "fusion-tvm: error:" in stderr


@pytest.fixture(scope="module")
def error_runs(models):
    with ThreadPoolExecutor(max_workers=len(PROCESS_ERRORS)) as pool:
        futures = {k: pool.submit(cli, *args, cwd=models)
                   for k, (args, _, _) in PROCESS_ERRORS.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("case", list(PROCESS_ERRORS))
def test_user_errors_exit_cleanly(case, error_runs):
    _, code, words = PROCESS_ERRORS[case]
    _check_error(error_runs[case].returncode, error_runs[case].stderr, code, words)


@pytest.mark.parametrize("case", list(INPROCESS_ERRORS))
def test_user_errors_in_process(case, models, capsys, monkeypatch):
    args, code, words = INPROCESS_ERRORS[case]
    monkeypatch.chdir(models)
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse
        rc = exc.code
    _check_error(rc, capsys.readouterr().err, code, words)


def test_plan_with_spec_file_and_json_errors(models, tmp_path, capsys):
    assert main(["hw", "show", HW, "--json"]) == 0
    spec = tmp_path / "my_cpu.json"
    spec.write_text(capsys.readouterr().out)
    assert main(["plan", str(models / "mlp.onnx"), "--hw", str(spec), "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"] == HW
    # with --json a user error is also machine-readable on stdout
    assert main(["plan", str(models / "mlp.onnx"), "--shape", "N=x", "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["exit_code"] == 2 and "N=x" in err["error"]


def test_compile_hls_fixes_dims_with_shape(models, tmp_path, capsys):
    out = tmp_path / "mlp_hls"
    assert main(["compile", str(models / "mlp.onnx"), "--target", "hls", "--shape", "N=2",
                 "-o", str(out), "-q"]) == 0
    assert out.is_dir() and "project folder" in capsys.readouterr().out
    meta = json.loads((tmp_path / "mlp_hls.plan.json").read_text())
    assert meta["target_kind"] == "hls" and meta["kernels_built"] >= 1


def test_internal_errors_exit_1_and_debug_shows_tracebacks(monkeypatch, capsys):
    import fusion_tvm.cli as cli_mod

    def boom(args, progress):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli_mod, "cmd_hw", boom)
    assert main(["hw", "list"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: kaboom" in err and "Traceback" not in err
    assert main(["hw", "list", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    # --debug also shows where a user error came from
    assert main(["--debug", "plan", "nope.onnx"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_plan_prints_no_tvm_noise():
    """`plan` runs the phases without TVM's C++ warnings (BERT-tiny's legalized take logged
    five 'Fast mode segfaults' lines); with -q stderr is empty."""
    res = ok(cli("plan", ROOT / "tests" / "data" / "bert_tiny.onnx", "--hw", HW, "-q"))
    assert res.stderr == "" and "kernels:" in res.stdout
