"""The benchmark model zoo: valid ONNX, runs in onnxruntime, imports and builds in stock TVM."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from benchmarks import zoo  # noqa: E402

ort = pytest.importorskip("onnxruntime")

ALL = zoo.list_models()
# Full-size models over ~100 MB (seq 128 BERT, GPT-2's 50k vocabulary) only run with -m slow;
# bert_2l_s16 keeps a full-width transformer in the default run.
_HEAVY = {"bert_2l", "gpt2_2l"}
FULL_SIZE = [n for n in ALL if not zoo.get_spec(n).large and n not in _HEAVY]
LARGE = [n for n in ALL if zoo.get_spec(n).large or n in _HEAVY]


def run_ort(model: onnx.ModelProto, feeds):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_runs(model: onnx.ModelProto, **dims):
    onnx.checker.check_model(model)
    outs = run_ort(model, zoo.example_inputs(model, **dims))
    assert outs
    for out in outs:
        assert np.isfinite(out).all()
        # Realistic init: activations stay O(1), neither vanishing nor exploding.
        assert 1e-3 < float(np.abs(out).max()) < 100.0
    return outs


def test_registry():
    assert {"resnet18", "resnet50", "mobilenetv2", "bert_base", "bert_2l", "gpt2", "vit_tiny",
            "mlp", "detection_head"} <= set(ALL)
    with pytest.raises(ValueError, match="already registered"):
        zoo.register_model("mlp", zoo.mlp)
    with pytest.raises(KeyError, match="unknown zoo model"):
        zoo.get_model("alexnet")


@pytest.mark.parametrize("name", ALL)
def test_small_static_and_dynamic(name):
    check_runs(zoo.get_model(name, small=True))
    dyn = zoo.get_model(name, small=True, dynamic=True)
    params = {d.dim_param for i in dyn.graph.input for d in i.type.tensor_type.shape.dim}
    assert "N" in params
    outs = check_runs(dyn, N=2, S=8)
    assert outs[0].shape[0] == 2


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size(name):
    check_runs(zoo.get_model(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_full_size_large(name):
    check_runs(zoo.get_model(name))


def test_batch8_and_structure():
    m = zoo.get_model("resnet18", small=True, batch=8)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 8
    ops = {n.op_type for n in m.graph.node}
    assert {"Conv", "BatchNormalization", "Relu", "Add", "MaxPool", "GlobalAveragePool",
            "Flatten", "Gemm"} <= ops
    ops = {n.op_type for n in zoo.get_model("mobilenetv2", small=True).graph.node}
    assert "Clip" in ops
    assert any(a.name == "group" and a.i > 1 for n in zoo.get_model("mobilenetv2", small=True)
               .graph.node for a in n.attribute)
    ops = {n.op_type for n in zoo.get_model("bert_2l", small=True).graph.node}
    assert {"ReduceMean", "Pow", "Sqrt", "Erf", "Softmax", "Transpose", "Reshape"} <= ops
    ops = {n.op_type for n in zoo.get_model("bert_2l", small=True, decomposed_ln=False)
           .graph.node}
    assert "LayerNormalization" in ops and "ReduceMean" not in ops
    ops = {n.op_type for n in zoo.get_model("gpt2_2l", small=True).graph.node}
    assert {"Tanh", "LayerNormalization"} <= ops
    ops = {n.op_type for n in zoo.get_model("detection_head", small=True).graph.node}
    assert {"Resize", "Concat", "Sigmoid"} <= ops


def test_deterministic():
    a = zoo.get_model("bert_2l", small=True).SerializeToString()
    assert a == zoo.get_model("bert_2l", small=True).SerializeToString()
    assert a != zoo.get_model("bert_2l", small=True, seed=1).SerializeToString()


def test_example_inputs_mask():
    m = zoo.get_model("bert_2l", small=True, dynamic=True)
    feeds = zoo.example_inputs(m, N=6, S=10)
    mask = feeds["attention_mask"]
    assert mask.shape == (6, 10) and mask.dtype == np.int64
    assert set(np.unique(mask)) <= {0, 1}
    assert (mask[:, 0] == 1).all() and (mask[0] == 1).all()
    assert (np.diff(mask, axis=1) <= 0).all()  # padding only at the end
    assert feeds["input_ids"].max() < 1000 and feeds["input_ids"].min() >= 0
    np.testing.assert_array_equal(mask, zoo.example_inputs(m, N=6, S=10)["attention_mask"])


def test_bundled_example_is_generated():
    from benchmarks.zoo.detection import EXAMPLE_PATH, detection_head

    data = EXAMPLE_PATH.read_bytes()
    assert data == detection_head().SerializeToString()
    assert 50_000 < len(data) < 1_000_000
    shape = [d.dim_value for d in onnx.load(str(EXAMPLE_PATH)).graph.input[0].type.tensor_type
             .shape.dim]
    assert shape == [1, 3, 64, 64]


# ------------------------------------------------------------------ stock TVM vs onnxruntime
TVM_CASES = [(n, {}) for n in ("mlp", "detection_head", "resnet18", "bert_2l", "gpt2_2l",
                                "vit_tiny")]
TVM_CASES += [("bert_2l", {"dynamic": True}), ("mlp", {"dynamic": True, "batch": 3})]


@pytest.mark.parametrize("name,kw", [*TVM_CASES, pytest.param("mobilenetv2", {},
                                                               marks=pytest.mark.slow)],
                         ids=[*(f"{n}{'-dyn' if k else ''}" for n, k in TVM_CASES),
                              "mobilenetv2"])
def test_stock_tvm_matches_ort(name, kw):
    tvm = pytest.importorskip("tvm")
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = zoo.get_model(name, small=True, **kw)
    feeds = zoo.example_inputs(model, N=3, S=8)
    expected = run_ort(model, feeds)
    mod = relax.get_pipeline("zero")(from_onnx(model))
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input])
    outs = [out] if hasattr(out, "numpy") else list(out)
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ torch runner, benchmark driver
@pytest.mark.parametrize("name", ["detection_head", "bert_2l", "gpt2_2l", "vit_tiny"])
def test_to_torch_matches_ort(name):
    torch = pytest.importorskip("torch")
    from benchmarks.zoo.to_torch import to_torch

    model = zoo.get_model(name, small=True)
    feeds = zoo.example_inputs(model)
    module = to_torch(model, {k: v.shape for k, v in feeds.items()})
    with torch.inference_mode():
        outs = module(*[torch.from_numpy(feeds[n]) for n in module.input_names])
    for got, want in zip(outs, run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_run_py_smoke(tmp_path):
    from benchmarks import run

    assert run.parse_model("bert_2l:batch=8,seq=16,small=True") == \
        ("bert_2l", {"batch": 8, "seq": 16, "small": True})
    rc = run.main(["--models", "mlp:small=True", "--contenders", "stock_tvm", "onnxruntime",
                   "--repeat", "3", "--min-repeat", "1", "--threads", "1", "--out",
                   str(tmp_path)])
    assert rc == 0
    text = (tmp_path / "summary.md").read_text()
    assert "| mlp:small=True |" in text and "1 thread(s)" in text
    assert (tmp_path / "results.json").exists()
    bars = ET.parse(tmp_path / "latency.svg").getroot().findall(".//{*}rect/{*}title")
    assert sorted(b.text.rsplit(":", 1)[0] for b in bars) == \
        ["mlp:small=True onnxruntime", "mlp:small=True stock_tvm"]


def test_svg_charts_scale_and_validate():
    from benchmarks.svgplot import bar_chart, scatter_loglog

    svg = bar_chart(["a", "b"], {"x": [1.0, 100.0], "y": [None, 10.0]}, "ms")
    root = ET.fromstring(svg)
    bars = {t.text.split(":")[0]: float(t.text.split(":")[1])
            for t in root.findall(".//{*}rect/{*}title")}
    assert bars == {"a x": 1.0, "b x": 100.0, "b y": 10.0}  # None draws no bar
    heights = {t.text.split(":")[0]: float(r.get("height"))
               for r in root.findall(".//{*}rect") for t in r.findall("{*}title")}
    # log axis: 1 -> 10 -> 100 are equally spaced
    assert abs((heights["b x"] - heights["b y"]) - (heights["b y"] - heights["a x"])) < 0.5
    root = ET.fromstring(scatter_loglog({"ours": [(1.0, 2.0)], "fuseops": [(3.0, 3.0)]},
                                        "pred", "meas"))
    assert len(root.findall(".//{*}circle")) == 2  # one point + its legend marker
    with pytest.raises(ValueError):
        bar_chart(["a"], {"x": [None]}, "ms")


def test_run_py_flags_mismatch(tmp_path, monkeypatch):
    from benchmarks import run

    def wrong(model, feeds, ctx):  # a contender whose outputs are off by 1
        sess = run.onnxruntime(model, feeds, ctx)
        return run.Prepared(lambda f: [o + 1.0 for o in sess.run(f)], 0.0, kernels=1)

    monkeypatch.setitem(run.PREPARE, "stock_tvm", wrong)
    rc = run.main(["--models", "mlp:small=True", "--contenders", "stock_tvm", "onnxruntime",
                   "--repeat", "2", "--min-repeat", "1", "--threads", "1", "--out",
                   str(tmp_path)])
    assert rc == 1
    assert "| mlp:small=True | stock_tvm | mismatch |" in (tmp_path / "summary.md").read_text()
