"""Tests of fusion_tvm.frontend: real exports import, build and match onnxruntime; errors name
the file, the operator and the node; our converter overrides each fix a real failure."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as stock_from_onnx
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.script import relax as R

from fusion_tvm.errors import (
    FusionTVMError,
    ModelLoadError,
    UnsupportedOperatorError,
    UserInputError,
)
from fusion_tvm.frontend import LoadedModel, load_model, overrides

DATA = Path(__file__).parent / "data"
OPSET = 17
RTOL = ATOL = 1e-4


# --------------------------------------------------------------------------- helpers


def _model(nodes, inputs, outputs, initializers=(), name="g") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _vi(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _int64(name, values, dims=None):
    values = list(values)
    return helper.make_tensor(
        name, TensorProto.INT64, [len(values)] if dims is None else dims, values
    )


@functools.cache
def _build(loaded: LoadedModel) -> relax.VirtualMachine:
    # Stock TVM, no fusion of ours: the frontend's output must build as it is.
    mod = relax.get_pipeline("zero")(loaded.mod)
    return relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())


def _run(loaded: LoadedModel, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    out = _build(loaded)["main"](*[tvm.runtime.tensor(feeds[n]) for n in loaded.input_names])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _assert_matches_ort(model, loaded: LoadedModel, feeds: dict[str, np.ndarray]) -> None:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    expected = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)
    actual = _run(loaded, feeds)
    assert len(actual) == len(expected)
    for name, got, want in zip(loaded.output_names, actual, expected, strict=True):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)


def _load(model, **kw) -> LoadedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the importer's renaming / checker chatter
        return load_model(model, **kw)


# --------------------------------------------------------------------------- real exports


def _feeds(loaded: LoadedModel, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Inputs for one run, with each symbolic dim set from ``dims``."""
    rng = np.random.default_rng(sum(dims.values()))
    feeds = {}
    for name, shape, dtype in zip(
        loaded.input_names, loaded.input_shapes, loaded.input_dtypes, strict=True
    ):
        shape = tuple(dims[d] if isinstance(d, str) else d for d in shape)
        if dtype == "float32":
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        elif name == "attention_mask":
            feeds[name] = np.ones(shape, np.int64)
            feeds[name][-1, shape[1] // 2 :] = 0  # a padded row, so the mask matters
        elif name == "token_type_ids":
            feeds[name] = np.zeros(shape, np.int64)
        else:
            feeds[name] = rng.integers(0, 100, shape, dtype=np.int64)
    return feeds


# Two runs per export with different batch and sequence lengths.
_TEXT_RUNS = [{"batch": 1, "sequence": 5}, {"batch": 3, "sequence": 11}]
EXPORTS = {
    "cnn_bn": [{"batch": 1}, {"batch": 3}],
    "bert_tiny": _TEXT_RUNS,
    "bert_tiny_dynamo": _TEXT_RUNS,
    "gpt2_tiny": _TEXT_RUNS,
    "gpt2_tiny_past": [
        {"batch": 1, "sequence": 1, "past_sequence": 4, "total_sequence": 5},
        {"batch": 3, "sequence": 2, "past_sequence": 7, "total_sequence": 9},
    ],
    "t5_tiny": [
        {"batch": 1, "sequence": 5, "decoder_sequence": 3},
        {"batch": 2, "sequence": 9, "decoder_sequence": 6},
    ],
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_export_imports_builds_and_matches_onnxruntime(name):
    path = DATA / f"{name}.onnx"
    loaded = _load(path)
    assert loaded.source == "onnx"
    # Relax names are the ONNX ones made identifiers ("past.0.key" -> "past_0_key").
    relax_names = [p.name for p in loaded.mod["main"].params]
    assert relax_names == [n.replace(".", "_") for n in loaded.input_names]
    for dims in EXPORTS[name]:
        _assert_matches_ort(path, loaded, _feeds(loaded, dims))


# What stock TVM 0.27 does with the same files: the reason the overrides exist. If one of these
# starts passing after a TVM upgrade, the matching override may be removable.
STOCK_FAILURES = {
    "bert_tiny": "broadcast_to",  # ConstantOfShape
    "gpt2_tiny": "broadcast_to",  # ConstantOfShape, then Range
    "t5_tiny": "broadcast_to",  # ConstantOfShape, then Range
    "bert_tiny_dynamo": "Reshape expects",  # Range
}


@pytest.mark.parametrize("name", sorted(STOCK_FAILURES))
def test_stock_importer_fails_on_export(name):
    model = onnx.load(str(DATA / f"{name}.onnx"))
    with warnings.catch_warnings(), pytest.raises(Exception, match=STOCK_FAILURES[name]):
        warnings.simplefilter("ignore")
        stock_from_onnx(model)


def test_fixtures_are_small():
    sizes = {p.name: p.stat().st_size for p in DATA.glob("*.onnx")}
    assert set(EXPORTS) <= {name.removesuffix(".onnx") for name in sizes}
    assert all(size < 500 * 1024 for size in sizes.values()), sizes


def test_cnn_fixture_keeps_batch_norm():
    # The export must keep BN (do_constant_folding=False), or this test covers nothing.
    ops = {n.op_type for n in onnx.load(str(DATA / "cnn_bn.onnx")).graph.node}
    assert "BatchNormalization" in ops


def test_symbolic_dims_stay_symbolic_and_shared():
    loaded = _load(DATA / "bert_tiny.onnx")
    assert loaded.input_names == ("input_ids", "attention_mask", "token_type_ids")
    assert loaded.input_shapes == (("batch", "sequence"),) * 3
    assert loaded.input_dtypes == ("int64",) * 3
    assert loaded.output_names == ("last_hidden_state", "pooler_output")
    params = loaded.mod["main"].params
    # One tir variable per dim name across inputs, so shapes can be matched downstream.
    first, second = (p.ty.shape.values[1] for p in params[:2])
    assert first.same_as(second)
    out_shape = loaded.mod["main"].ret_ty.fields[0].shape.values
    assert [str(d) for d in out_shape[:2]] == ["batch", "sequence"]
    assert int(out_shape[2]) == 32


def test_unnamed_dims_get_their_own_names_and_onnx_input_names_are_kept():
    # TorchScript exports without input_names give "input.1"; dims may have no dim_param. Stock
    # TVM gives every unnamed dim one shared variable, so these two rows counts would be tied
    # and the run below (3 rows + 2 rows) rejected.
    nodes = [helper.make_node("Concat", ["input.1", "2"], ["y"], name="cat", axis=0)]
    model = _model(nodes, [_vi("input.1", [None, 4]), _vi("2", [None, 4])], [_vi("y", [None, 4])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no renaming chatter
        loaded = load_model(model)
    assert loaded.input_names == ("input.1", "2")
    assert loaded.input_shapes == (("input_1_dim0", 4), ("input_2_dim0", 4))
    feeds = {"input.1": np.ones((3, 4), np.float32), "2": np.zeros((2, 4), np.float32)}
    _assert_matches_ort(model, loaded, feeds)


def test_params_are_embedded_as_constants():
    loaded = _load(DATA / "cnn_bn.onnx")
    main = loaded.mod["main"]
    assert len(main.params) == 1
    assert int(main.attrs["num_input"]) == 1


def test_shape_dict_fixes_or_renames_dims():
    static = _load(DATA / "cnn_bn.onnx", shape_dict={"input": [2, 3, 16, 16]})
    assert static.input_shapes == ((2, 3, 16, 16),)
    renamed = _load(DATA / "cnn_bn.onnx", shape_dict={"input": ["n", 3, 16, 16]})
    assert renamed.input_shapes == (("n", 3, 16, 16),)


def test_model_proto_is_accepted_and_not_modified():
    proto = onnx.load(str(DATA / "cnn_bn.onnx"))
    before = proto.SerializeToString()
    loaded = _load(proto, shape_dict={"input": [1, 3, 16, 16]})
    assert loaded.input_shapes == ((1, 3, 16, 16),)
    assert proto.SerializeToString() == before


@tvm.script.ir_module
class _Doubler:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")) -> R.Tensor(("n", 4), "float32"):
        with R.dataflow():
            y = R.add(x, x)
            R.output(y)
        return y


def test_irmodule_is_taken_as_is():
    loaded = load_model(_Doubler)
    assert loaded.mod is _Doubler
    assert loaded.source == "irmodule"
    assert loaded.input_names == ("x",)
    assert loaded.input_shapes == (("n", 4),)
    assert loaded.input_dtypes == ("float32",)
    assert loaded.output_names == ("output",)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_run(loaded, {"x": x})[0], 2 * x)


# --------------------------------------------------------------------------- overrides


def test_constant_of_shape_override_rank0_target():
    # torch's attention-mask code: ConstantOfShape(shape=[]) with value a one-element 1-D
    # tensor. Stock TVM broadcasts the rank-1 value to rank 0 and fails.
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["empty"],
            ["c"],
            name="mask/const",
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [3.0]),
        ),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    model = _model(nodes, [_vi("x", ["n"])], [_vi("y", ["n"])], [_int64("empty", [], dims=[0])])
    with pytest.raises(Exception, match="broadcast_to"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stock_from_onnx(model)
    loaded = _load(model)
    _assert_matches_ort(model, loaded, {"x": np.arange(4, dtype=np.float32)})


def test_constant_of_shape_override_dynamic_and_default_value():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros"),  # value: 0.0 default
        helper.make_node(
            "ConstantOfShape",
            ["s"],
            ["o"],
            name="ones",
            value=helper.make_tensor("v", TensorProto.INT64, [1], [1]),
        ),
        helper.make_node("Cast", ["o"], ["of"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["z", "of"], ["y"], name="add"),
    ]
    model = _model(nodes, [_vi("x", ["b", 3])], [_vi("y", ["b", 3])])
    loaded = _load(model)
    for batch in (1, 4):
        _assert_matches_ort(model, loaded, {"x": np.zeros((batch, 3), np.float32)})


@pytest.mark.parametrize("start, delta", [(0, 1), (0, 2), (-1, 3)])
def test_range_override_keeps_sequence_length_symbolic(start, delta):
    # GPT-2 / T5 position ids: Range(0, x.shape[1], 1). Stock TVM names the length with a
    # fresh variable, which loses `seq` and later breaks Shape -> Slice / Reshape.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Range", ["start", "seq", "delta"], ["pos"], name="positions"),
        helper.make_node("Cast", ["pos"], ["y"], name="cast", to=TensorProto.FLOAT),
    ]
    inits = [
        _int64("one", [1], dims=[]),
        _int64("start", [start], dims=[]),
        _int64("delta", [delta], dims=[]),
    ]
    model = _model(nodes, [_vi("x", ["b", "seq"])], [_vi("y", [None])], inits)
    loaded = _load(model)
    (length,) = loaded.mod["main"].ret_ty.shape.values
    assert "seq" in str(length) and "range_len" not in str(length)
    for seq in (5, 8):
        _assert_matches_ort(model, loaded, {"x": np.zeros((2, seq), np.float32)})


def test_range_override_empty_when_limit_below_start():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Sub", ["seq", "five"], ["limit"], name="minus_five"),
        helper.make_node("Range", ["zero", "limit", "one"], ["y"], name="positions"),
    ]
    inits = [_int64(n, [v], dims=[]) for n, v in (("zero", 0), ("one", 1), ("five", 5))]
    model = _model(nodes, [_vi("x", ["b", "seq"])], [_vi("y", [None], TensorProto.INT64)], inits)
    loaded = _load(model)
    for seq in (3, 8):  # 3 - 5 < 0: an empty range
        _assert_matches_ort(model, loaded, {"x": np.zeros((1, seq), np.float32)})


def test_range_override_defers_to_stock_for_constants():
    nodes = [helper.make_node("Range", ["a", "b", "c"], ["y"], name="r")]
    inits = [_int64("a", [2], dims=[]), _int64("b", [9], dims=[]), _int64("c", [3], dims=[])]
    model = _model(nodes, [], [_vi("y", [3], TensorProto.INT64)], inits)
    _assert_matches_ort(model, _load(model), {})


def test_overrides_do_not_patch_the_stock_importer():
    assert onnx_frontend._get_convert_map()["Range"] is onnx_frontend.Range
    assert overrides.converter_map()["Range"] is overrides.Range
    assert {"ConstantOfShape", "Range"} <= overrides.overridden_ops()


def test_register_override_refuses_duplicates():
    with pytest.raises(ValueError, match="Range"):
        overrides.register_override("Range")(type("Again", (onnx_frontend.OnnxOpConverter,), {}))


# --------------------------------------------------------------------------- errors


def _no_chained_traceback(err: pytest.ExceptionInfo) -> None:
    # Users must see our message, not a TVM traceback printed as "the above exception...".
    assert err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__


def test_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="not found") as err:
        load_model(path)
    assert str(path) in str(err.value)


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="not a file") as err:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(err.value)


@pytest.mark.parametrize(
    "content",
    [b"import torch\nprint('this is not a model')\n", b"\x89PNG\r\n\x1a\n" + bytes(range(256))],
    ids=["text", "binary"],
)
def test_not_an_onnx_file(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as err:
        load_model(path)
    assert str(path) in str(err.value)
    _no_chained_traceback(err)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not an ONNX model") as err:
        load_model(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_file(tmp_path, keep):
    data = (DATA / "bert_tiny.onnx").read_bytes()
    path = tmp_path / "bert_truncated.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="truncated") as err:
        load_model(path)
    assert str(path) in str(err.value)
    _no_chained_traceback(err)


def test_missing_external_data(tmp_path):
    weight = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "fc.weight")
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc")]
    path = tmp_path / "big.onnx"
    model = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])], [weight])
    onnx.save(model, str(path), save_as_external_data=True, location="big.data", size_threshold=0)
    assert _load(path).input_names == ("x",)
    (tmp_path / "big.data").unlink()
    with pytest.raises(ModelLoadError, match="big.data") as err:
        load_model(path)
    assert str(path) in str(err.value)


def test_wrong_model_type():
    with pytest.raises(UserInputError, match="dict"):
        load_model({"not": "a model"})


def test_unsupported_operator_names_op_and_node():
    nodes = [helper.make_node("Celu", ["x"], ["y"], name="block3/act/celu")]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(UnsupportedOperatorError) as err:
        load_model(model)
    assert err.value.op_type == "Celu"
    assert err.value.node_name == "block3/act/celu"
    assert "'Celu'" in str(err.value) and "block3/act/celu" in str(err.value)


def test_unsupported_custom_domain_op_names_domain():
    nodes = [helper.make_node("FancyGelu", ["x"], ["y"], name="ffn/gelu", domain="com.acme")]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(UnsupportedOperatorError, match="com.acme") as err:
        load_model(model)
    assert "ffn/gelu" in str(err.value) and "FancyGelu" in str(err.value)


def test_unsupported_operator_in_file_names_the_file(tmp_path):
    nodes = [helper.make_node("Det", ["x"], ["y"], name="det0")]
    path = tmp_path / "det.onnx"
    onnx.save(_model(nodes, [_vi("x", [3, 3])], [_vi("y", [])]), str(path))
    with pytest.raises(UnsupportedOperatorError, match="det0") as err:
        load_model(path)
    assert str(path) in str(err.value)


def test_converter_failure_is_wrapped_with_node_name(capsys):
    # An input of unknown rank cannot be reshaped with -1 by the Relax importer.
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="head/flatten")]
    model = _model(nodes, [_vi("x", None)], [_vi("y", None)], [_int64("shape", [-1])])
    with pytest.raises(UnsupportedOperatorError, match="Reshape") as err:
        _load(model)
    assert err.value.node_name == "head/flatten"
    assert "head/flatten" in str(err.value) and "known shape" in str(err.value)
    _no_chained_traceback(err)
    assert "Error converting operator" not in capsys.readouterr().out


def test_unnamed_node_gets_a_usable_name():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"])]
    model = _model(nodes, [_vi("x", None)], [_vi("flat", None)], [_int64("shape", [-1])])
    with pytest.raises(UnsupportedOperatorError, match="#0 Reshape -> flat"):
        _load(model)


def test_missing_initializer_names_the_tensor():
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc/matmul")]
    model = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 3])])
    with pytest.raises(UserInputError, match="'fc.weight'") as err:
        load_model(model)
    assert "fc/matmul" in str(err.value)
    assert not isinstance(err.value, UnsupportedOperatorError)


def test_dangling_input_names_the_tensor(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Add", ["a", "skip_from_nowhere"], ["y"], name="residual/add"),
    ]
    path = tmp_path / "dangling.onnx"
    onnx.save(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]), str(path))
    with pytest.raises(UserInputError, match="'skip_from_nowhere'") as err:
        load_model(path)
    assert str(path) in str(err.value) and "residual/add" in str(err.value)


def _if_model(else_reads: str) -> onnx.ModelProto:
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"], name="then/relu")], "then", [], [_vi("t", [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", [else_reads], ["e"], name="else/neg")], "else", [], [_vi("e", [2])]
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="cond"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    return _model(nodes, [_vi("x", [2])], [_vi("y", [2])], [zero])


def test_if_branches_may_read_outer_tensors():
    model = _if_model(else_reads="x")
    loaded = _load(model)
    for x in ([1.0, -3.0], [-1.0, 0.5]):
        _assert_matches_ort(model, loaded, {"x": np.array(x, np.float32)})


def test_dangling_input_inside_if_branch():
    with pytest.raises(UserInputError, match="'ghost'.*else/neg|else/neg.*'ghost'"):
        load_model(_if_model(else_reads="ghost"))


def test_output_never_produced():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu")]
    model = _model(nodes, [_vi("x", [2])], [_vi("logits", [2])])
    with pytest.raises(UserInputError, match="'logits'"):
        load_model(model)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"shape_dict": {"images": [1, 3, 16, 16]}}, "'images'"),
        ({"shape_dict": {"input": [-1, 3, 16, 16]}}, "-1"),
        ({"dtype_dict": {"images": "float16"}}, "'images'"),
    ],
)
def test_bad_shape_or_dtype_dict(kw, match):
    with pytest.raises(UserInputError, match=match):
        load_model(DATA / "cnn_bn.onnx", **kw)


@tvm.script.ir_module
class _WithWeights:
    @R.function
    def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 2), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


def test_irmodule_weights_after_num_input_are_fed_after_the_inputs():
    # The VM's main takes every parameter: weights are fed at run time after the inputs
    # (or bound at compile time with compile(..., params=...)); issue 24.
    loaded = load_model(_WithWeights)
    assert loaded.input_names == ("x", "w")
    assert loaded.input_shapes == ((1, 4), (4, 2))


def test_irmodule_without_main():
    with pytest.raises(UserInputError, match="'main'"):
        load_model(tvm.IRModule({}))
    with pytest.raises(UserInputError, match="ONNX"):
        load_model(_Doubler, shape_dict={"x": [1, 4]})


def test_ill_formed_irmodule():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    free = relax.Var("free", relax.TensorType((2,), "float32"))
    main = relax.Function([x], relax.SeqExpr([], free), relax.TensorType((2,), "float32"))
    with pytest.raises(UserInputError, match="not well-formed.*free"):
        load_model(tvm.IRModule({"main": main}))


def test_all_errors_are_ours():
    assert issubclass(ModelLoadError, FusionTVMError)
    assert issubclass(UnsupportedOperatorError, UserInputError)


# --------------------------------------------------------------------------- torch (optional)


def test_torch_module_via_export():
    torch = pytest.importorskip("torch")
    from fusion_tvm.frontend import load_torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            return torch.relu(self.bn(self.fc(x)))

    torch.manual_seed(0)
    block = Block().eval()
    batch = torch.export.Dim("batch")
    loaded = load_torch(block, (torch.randn(2, 4),), dynamic_shapes={"x": {0: batch}})
    assert loaded.source == "torch"
    assert loaded.input_names == ("x",)
    assert loaded.input_shapes == (("batch", 4),)  # the Dim name, not torch's "s17"
    for n in (1, 5):
        x = torch.randn(n, 4)
        with torch.no_grad():
            want = block(x).numpy()
        np.testing.assert_allclose(_run(loaded, {"x": x.numpy()})[0], want, rtol=RTOL, atol=ATOL)


def test_torch_unsupported_op_names_op_and_node():
    torch = pytest.importorskip("torch")
    from fusion_tvm.frontend import load_torch

    class Zeta(torch.nn.Module):
        def forward(self, x):
            return torch.special.zeta(x, x) + 1

    with pytest.raises(UnsupportedOperatorError, match="special_zeta") as err:
        load_torch(Zeta(), (torch.randn(3),))
    assert err.value.node_name
    with pytest.raises(UserInputError, match="torch.nn.Module"):
        load_torch(object(), ())
