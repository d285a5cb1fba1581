"""The plan names each op's ONNX node(s): carried from the importer through the passes
(BatchNorm folded into a conv or decomposed, NCHWc layout, legalization) onto the plan's ops,
its JSON, table and HTML, and accepted by ``explain`` like Relax and PrimFunc names."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusion_tvm.cli import Progress, main, search_plan
from fusion_tvm.errors import UserInputError
from fusion_tvm.explain import explain
from fusion_tvm.frontend import load_model
from fusion_tvm.report import explain_ops, render_html

HW = "ci-x86-avx2"  # AVX2: 8 fp32 lanes, the convs below go to the blocked NCHW8c layout
#: The model's compute nodes, by name (the ONNX graph below, in order).
NODES = ["stem_conv", "stem_bn", "stem_relu", "mid_bn", "body_conv", "body_act",
         "body_mul", "head_pool", "head_flatten", "head_fc"]


def _model() -> onnx.ModelProto:
    """x -> Conv -> BatchNorm (folded into the conv) -> Relu -> BatchNorm (decomposed into
    per-channel ops: no conv before it) -> Conv (bias) -> Sigmoid, Mul (SiLU) ->
    GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)

    def init(name, *shape, positive=False):
        a = rng.random(shape, dtype=np.float32) + (0.5 if positive else -0.5)
        return numpy_helper.from_array(a.astype(np.float32), name)

    inits = [init("w0", 16, 3, 3, 3), init("w1", 16, 16, 3, 3), init("b1", 16),
             init("fc_w", 10, 16), init("fc_b", 10)]
    for bn in ("bn0", "bn1"):
        inits += [init(f"{bn}_s", 16), init(f"{bn}_b", 16), init(f"{bn}_m", 16),
                  init(f"{bn}_v", 16, positive=True)]
    def bn_in(bn):
        return [f"{bn}_s", f"{bn}_b", f"{bn}_m", f"{bn}_v"]

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem_conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", *bn_in("bn0")], ["n0"], name="stem_bn"),
        helper.make_node("Relu", ["n0"], ["r0"], name="stem_relu"),
        helper.make_node("BatchNormalization", ["r0", *bn_in("bn1")], ["n1"], name="mid_bn"),
        helper.make_node("Conv", ["n1", "w1", "b1"], ["c1"], name="body_conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"], name="body_act"),
        helper.make_node("Mul", ["c1", "s1"], ["m1"], name="body_mul"),
        helper.make_node("GlobalAveragePool", ["m1"], ["p"], name="head_pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="head_flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="head_fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "named", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx_names") / "named.onnx"
    onnx.save(_model(), path)
    return path


@pytest.fixture(scope="module")
def plan(model_path):
    return search_plan(load_model(str(model_path)), "llvm", HW, {}, Progress(quiet=True))


def _ops(plan_json: dict) -> list[tuple[str, str, list[str]]]:
    """(Relax name, PrimFunc, ONNX nodes) of every op of every kernel in the plan JSON."""
    return [(op, func, names) for g in plan_json["groups"]
            for op, func, names in zip(g["ops"], g["prim_funcs"], g["onnx_nodes"], strict=True)]


def test_plan_json_names_the_onnx_nodes_of_each_op(plan):
    data = json.loads(plan.dumps())
    ops = _ops(data)
    by_func = {}
    for _, func, names in ops:
        by_func.setdefault(func.rstrip("0123456789"), []).append(names)
    # the stem: BatchNorm folded into the weights of a blocked conv, its shift a bias add
    assert ["stem_conv", "stem_bn"] in by_func["conv2d_nchwc"]
    assert ["stem_relu"] in by_func["relu"]
    assert ["stem_bn"] in by_func["add"]
    # a BatchNorm after the ReLU (no weight to fold into): one multiply and one add, it
    assert "subtract" not in by_func and "divide" not in by_func
    assert ["mid_bn"] in by_func["multiply"] and ["mid_bn"] in by_func["add"]
    # a conv with its own bias: the conv and the bias add
    assert ["body_conv"] in by_func["conv2d_nchwc"] and ["body_conv"] in by_func["add"]
    assert by_func["fast_sigmoid"] == [["body_act"]]
    assert ["body_mul"] in by_func["multiply"]
    assert ["head_pool"] in by_func["mean"]
    assert by_func["matmul"] == [["head_fc"]]
    # honest: the input's layout conversion the compiler inserted computes no ONNX node
    assert by_func["to_nchwc"] == [[]]
    shown = {n for _, _, names in ops for n in names}
    assert shown <= set(NODES)
    assert shown >= set(NODES) - {"head_flatten"}  # a flatten is a free reshape view


def test_table_and_html_show_the_onnx_nodes(plan):
    rows = plan.table().splitlines()
    assert rows[3].endswith("onnx nodes")
    first = next(r for r in rows[4:] if "stem_conv" in r)
    assert "stem_conv stem_bn stem_relu" in first
    page = render_html(plan, title="named")
    assert "<th>ONNX nodes</th>" in page and "stem_conv stem_bn stem_relu" in page
    blob = json.loads(page.split('id="plan-data">', 1)[1].split("</script>", 1)[0])
    assert blob["onnx"] is True
    ops = [o for g in blob["groups"] for o in g["ops"]]
    assert {"stem_relu"} <= {n for o in ops for n in o["onnx"]}
    assert any(o["func"] == "to_nchwc" and o["onnx"] == [] for o in ops)


def test_why_lines_name_the_onnx_nodes_of_each_boundary(plan):
    from fusion_tvm.report import boundaries, render_text

    bounds = boundaries(plan)
    assert bounds and all(set(b.producer_onnx) <= set(NODES) for b in bounds)
    named = [b for b in bounds if b.producer_onnx]
    assert named
    text = render_text(plan)
    b = named[0]
    assert f"{b.producer} -> {b.consumer} (ONNX {' '.join(b.producer_onnx)}" in text


def test_explain_takes_onnx_names_like_relax_names(plan):
    relu = next(n for b in plan.blocks for n in b.graph.nodes if n.origins == ("stem_relu",))
    fc = next(n for b in plan.blocks for n in b.graph.nodes if n.origins == ("head_fc",))
    for a, b in (("stem_relu", "head_fc"), ("stem_relu", "stem_conv")):
        by_onnx = explain(plan, a, b)
        rx_a = relu.name
        rx_b = fc.name if b == "head_fc" else next(
            n.name for blk in plan.blocks for n in blk.graph.nodes
            if n.info is not None and "stem_conv" in n.origins)
        by_relax = explain(plan, rx_a, rx_b)
        assert (by_onnx.fused, by_onnx.reason, by_onnx.group_a, by_onnx.group_b) == \
            (by_relax.fused, by_relax.reason, by_relax.group_a, by_relax.group_b)
        assert by_onnx.onnx_a == by_relax.onnx_a and "stem_relu" in by_onnx.onnx_a
    assert explain(plan, "stem_relu", "stem_conv").fused
    assert not explain(plan, "stem_relu", "head_fc").fused
    # explain_ops says which op an ONNX name resolved to, and which ops compute it
    exp, notes = explain_ops(plan, "stem_bn", "stem_relu")
    assert exp.fused and exp.op_a.startswith("stem_bn (") and exp.op_b.startswith("stem_relu (")
    assert notes and "'stem_bn' is computed by 2 ops" in notes[0]


def test_an_unknown_name_lists_onnx_relax_and_primfunc_names(plan):
    with pytest.raises(UserInputError) as err:
        explain(plan, "stem_reluu", "head_fc")
    msg = str(err.value)
    assert "did you mean stem_relu" in msg
    assert "ONNX nodes: stem_conv, stem_bn, stem_relu" in msg
    assert "Relax bindings: " in msg and "PrimFuncs: " in msg and "kernels: #0 " in msg


def test_cli_explain_and_plan_json(model_path, capsys):
    assert main(["explain", str(model_path), "--hw", HW, "--ops", "body_act", "head_pool",
                 "--json", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["op_a"].startswith("body_act (") and "body_mul" in data["onnx_a"]
    assert main(["plan", str(model_path), "--hw", HW, "--json", "-q"]) == 0
    ops = _ops(json.loads(capsys.readouterr().out))
    assert ("stem_relu",) in {tuple(names) for _, _, names in ops}
    assert main(["explain", str(model_path), "--hw", HW, "--ops", "nope", "head_fc", "-q"]) == 2
    assert "ONNX nodes: stem_conv" in capsys.readouterr().err


def test_a_relax_module_has_no_onnx_names(model_path):
    """An IRModule carries no ONNX names: the table keeps its columns, every op's list is
    empty, explain takes Relax names as before."""
    mod = load_model(str(model_path)).mod
    plan = search_plan(load_model(mod), "llvm", HW, {}, Progress(quiet=True))
    assert not plan.has_onnx_names
    assert all(names == [] for g in plan.groups for names in g.onnx_nodes)
    assert plan.table().splitlines()[3].rstrip().endswith("bound")
    assert "<th>ONNX nodes</th>" not in render_html(plan)
