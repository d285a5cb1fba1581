"""The Python face a user meets first: CompiledModel's signature, run's feeds, export + load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import fusion_tvm
from fusion_tvm.errors import InputMismatchError, UserInputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo

    path = tmp_path_factory.mktemp("api") / "mlp.onnx"
    onnx.save(zoo.get_model("mlp", small=True, dynamic=True), path)
    return path, fusion_tvm.compile(path)


def test_signature_and_repr(mlp):
    _, cm = mlp
    assert cm.inputs == (fusion_tvm.TensorSpec("input", ("N", 64), "float32"),)
    assert cm.outputs == (fusion_tvm.TensorSpec("probs", ("N", 10), "float32"),)
    text = repr(cm)
    assert "input: float32[N, 64]" in text and "probs: float32[N, 10]" in text
    noun = "kernel" if cm.num_kernels == 1 else "kernels"
    assert f"{cm.num_kernels} {noun}," in text and "llvm" in text


def test_run_takes_a_dict_a_list_keywords_or_one_array(mlp):
    _, cm = mlp
    x = np.random.default_rng(0).standard_normal((3, 64)).astype("float32")
    ref = cm.run({"input": x})
    assert isinstance(ref, list) and isinstance(ref[0], np.ndarray) and ref[0].shape == (3, 10)
    for out in (cm.run([x]), cm.run(x), cm.run(input=x)):
        np.testing.assert_array_equal(out[0], ref[0])
    assert not isinstance(cm.bind(x)(), np.ndarray)  # device tensors from bind only


def test_run_errors_name_the_real_rank_and_the_mixup(mlp):
    _, cm = mlp
    with pytest.raises(InputMismatchError, match=r"rank 3 \(shape \(2, 3, 64\)\).*rank 2"):
        cm.run(np.zeros((2, 3, 64), "float32"))
    with pytest.raises(InputMismatchError, match="either positionally or by keyword"):
        cm.run({"input": np.zeros((1, 64), "float32")}, input=np.zeros((1, 64), "float32"))
    with pytest.raises(InputMismatchError, match="unknown"):
        cm.run(inp=np.zeros((1, 64), "float32"))


@pytest.mark.parametrize("hint", ["big", ["a"], (1, "x"), 2.5, None])
def test_bad_shape_hint_values_are_our_error(mlp, hint):
    path, _ = mlp
    with pytest.raises(UserInputError, match="bad shape hint value .* for dim 'N': expected"):
        fusion_tvm.compile(path, shape_hints={"N": hint})


def test_cli_style_target_string_points_to_the_dict_form(mlp):
    from fusion_tvm.errors import InvalidTargetError

    path, cm = mlp
    with pytest.raises(InvalidTargetError, match=r'JSON target dict, e.g. \{"kind": "llvm"'):
        fusion_tvm.compile(path, target="llvm -mcpu=znver4")
    assert " 1 kernels" not in repr(cm)  # "1 kernel" / "2 kernels"


def test_export_then_load_runs_the_same(mlp, tmp_path):
    _, cm = mlp
    lib = cm.export(tmp_path / "mlp.so")
    meta = json.loads((tmp_path / "mlp.plan.json").read_text())
    assert meta["inputs"] == [{"name": "input", "shape": ["N", 64], "dtype": "float32"}]
    assert meta["kernels_built"] == cm.num_kernels and meta["groups"]
    back = fusion_tvm.load(lib)
    assert back.inputs == cm.inputs and back.outputs == cm.outputs
    assert back.num_kernels == cm.num_kernels and back.plan_json["groups"] == meta["groups"]
    x = np.random.default_rng(1).standard_normal((5, 64)).astype("float32")
    np.testing.assert_array_equal(back.run(x)[0], cm.run(x)[0])
    np.testing.assert_array_equal(back.bind(input=x)().numpy(), cm.run(x)[0])
    with pytest.raises(InputMismatchError, match="axis 1 is 63"):
        back.run(np.zeros((1, 63), "float32"))


def test_load_without_its_json_says_so(mlp, tmp_path):
    _, cm = mlp
    cm.export(tmp_path / "m.so")
    (tmp_path / "m.plan.json").unlink()
    with pytest.raises(UserInputError, match="m.plan.json"):
        fusion_tvm.load(tmp_path / "m.so")
    with pytest.raises(UserInputError, match="no such file"):
        fusion_tvm.load(tmp_path / "absent.so")


def test_compile_export_and_load_print_nothing_from_tvm(tmp_path):
    """TVM's C++ log is kept from users: BERT-tiny's build logged five 'Fast mode segfaults'
    warnings (topi take), export a 'Scope Saving:' per scoped constant, load 'Scope Loaded:'."""
    lib, model = str(tmp_path / "b.so"), str(ROOT / "tests" / "data" / "bert_tiny.onnx")
    code = (f"import fusion_tvm; cm = fusion_tvm.compile({model!r}); "
            f"cm.export({lib!r}); fusion_tvm.load({lib!r})")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr


def test_noise_filter_keeps_everything_else(capfd):
    import os

    from fusion_tvm.api import tvm_noise_filtered

    with tvm_noise_filtered():
        os.write(2, b"[10:35:02] transform.h:1261: Warning: Fast mode segfaults when there are\n")
        os.write(2, b"[10:35:02] executable.cc:276: Warning: Scope Saving:global\n")
        os.write(2, b"a real problem\n")
        print("python's own warning", file=sys.stderr)
    err = capfd.readouterr().err  # (pytest's sys.stderr does not go through fd 2)
    assert sorted(err.splitlines()) == ["a real problem", "python's own warning"]


def test_submodules_the_readme_names_need_no_import():
    assert callable(fusion_tvm.explain.explain) and callable(fusion_tvm.report.render_html)


def test_package_is_typed_and_versioned():
    assert (Path(fusion_tvm.__file__).parent / "py.typed").is_file()
    from fusion_tvm.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0


def test_one_kernel_count_plan_and_build_agree(mlp):
    """The plan's counts for ours, FuseOps and unfused are the kernels each build launches
    (what `plan`, `compile`, `bench` and the profile print)."""
    path, cm = mlp
    fuseops = fusion_tvm.compile(path, fusion="fuseops")
    unfused = fusion_tvm.compile(path, fusion="none")
    assert cm.plan.num_kernels == cm.num_kernels == len(cm.kernel_calls())
    assert cm.plan.fuseops_kernels == fuseops.num_kernels
    assert cm.plan.unfused_kernels == unfused.num_kernels
    assert cm.num_kernels < fuseops.num_kernels < unfused.num_kernels


def test_cpu_without_a_preset_is_built_for_it_and_says_how_it_is_priced(mlp):
    path, _ = mlp
    with pytest.warns(UserWarning, match="no hardware preset for mcpu 'skylake-avx512'"):
        cm = fusion_tvm.compile(path, target={"kind": "llvm", "mcpu": "skylake-avx512"})
    assert str(cm.target.attrs["mcpu"]) == "skylake-avx512"
