"""Dynamic shapes: compile once, run many sizes, equal to onnxruntime; shape hints."""

import numpy as np
import onnxruntime as ort
import pytest
from tvm import relax

import fusion_tvm
from benchmarks.zoo import example_inputs, get_model
from fusion_tvm.errors import UserInputError
from fusion_tvm.shape_hints import parse_hint_text, sample_points, sample_values

CASES = {
    # model, the dim that varies, sizes (1 and a non-power-of-two included)
    "resnet18": ({"dynamic": True}, "N", [1, 3, 4, 7]),
    "bert_2l": ({"dynamic": True}, "S", [1, 5, 16, 33]),
    "gpt2_2l": ({"dynamic": True}, "S", [1, 6, 16, 29]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_once_run_many_sizes(name):
    kw, dim, sizes = CASES[name]
    model = get_model(name, small=True, **kw)
    cm = fusion_tvm.compile(model, hw="ci-x86-avx2", shape_hints={dim: (1, 64)})
    assert relax.analysis.check_well_formed(cm.fused_mod)
    sess = ort.InferenceSession(model.SerializeToString())
    other = {"N": 2} if dim == "S" else {}
    for size in sizes:
        feeds = example_inputs(model, seed=size, **{dim: size, **other})
        ref = sess.run(None, feeds)
        out = cm.run(feeds)
        for a, r in zip(out, ref, strict=True):
            assert a.shape == r.shape
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4, err_msg=f"{dim}={size}")


def test_shape_hint_parsing_and_sampling():
    assert parse_hint_text("N=8") == ("N", 8)
    assert parse_hint_text("N=1..64") == ("N", (1, 64))
    assert parse_hint_text("S=16,128") == ("S", [16, 128])
    assert sample_values((1, 64)) == [1, 8, 64]
    assert len(sample_points({"N": (1, 64), "S": [16, 128]})) == 6
    for bad in ("N", "N=abc", "N=5..2", "N=0", "1x=3"):
        with pytest.raises(UserInputError, match="shape hint"):
            parse_hint_text(bad)


def test_unknown_hint_name_is_a_user_error():
    model = get_model("mlp", small=True)
    with pytest.raises(UserInputError, match="unknown dim"):
        fusion_tvm.compile(model, shape_hints={"Q": 4})


def test_range_hint_plan_reports_points():
    model = get_model("bert_2l", small=True, dynamic=True)
    from fusion_tvm.frontend import load_model
    from fusion_tvm.pipeline import make_pipeline

    parts = make_pipeline(hw="ci-x86-avx2", shape_hints={"S": (1, 256), "N": 1})
    with parts.target:
        parts.fuse(parts.prepare(load_model(model).mod))
    plan = parts.fuse_pass.plan
    assert plan.dims["S"] == 16 and plan.dims["N"] == 1
    assert any("3 sample points" in n for n in plan.notes)
    assert plan.num_kernels < plan.fuseops_kernels


def test_specialized_variants_dispatch_and_match():
    model = get_model("bert_2l", small=True, dynamic=True)
    cm = fusion_tvm.compile(model, hw="ci-x86-avx2", shape_hints={"S": (1, 32)},
                            specialize={"S": [8]})
    assert list(cm.variants) == [(("S", 8),)]
    variant = cm.variants[(("S", 8),)]
    calls = []
    original = variant.bind
    variant.bind = lambda arrays: calls.append(1) or original(arrays)
    sess = ort.InferenceSession(model.SerializeToString())
    for size in (8, 5):
        feeds = example_inputs(model, seed=size, N=1, S=size)
        out = cm.run(feeds)
        np.testing.assert_allclose(out[0], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert calls == [1]  # S=8 ran the static variant, S=5 the generic build
