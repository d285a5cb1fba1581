"""The online-softmax (flash) attention: the algebraic match and the LLVM-CPU kernel.

``match_attention`` must recognise ``softmax(score(Q K^T)) V`` from the legalized blocks
alone and refuse everything it cannot rewrite exactly; the kernel must equal the unfused
build and onnxruntime for ragged, cross, causal, symbolic and transposed-output shapes, in
one kernel, with buffers that do not grow with the sequence.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

import fusion_tvm
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.legality import TemplateLimits, check_templates
from fusion_tvm.online_softmax import match_attention
from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

HW = "ci-x86-avx2"


def _attention(sq, sk, heads=2, dh=16, dv=None, causal=False, transpose_out=False,
               scale_first=False, softmax="Softmax", dtype=TensorProto.FLOAT):
    """``softmax(Q K^T * s [+ causal mask]) V`` on q [1, h, sq, dh], k / v [1, h, sk, .]."""
    dv = dv or dh
    npdt = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    g = GraphBuilder("flash")
    q = g.add_input("q", [1, heads, sq, dh], dtype)
    k = g.add_input("k", [1, heads, sk, dh], dtype)
    v = g.add_input("v", [1, heads, sk, dv], dtype)
    scale = g.const(1 / np.sqrt(dh), dtype=npdt)
    if scale_first:
        q = g.op("Mul", [q, scale])
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if not scale_first:
        s = g.op("Mul", [s, scale])
    if causal:
        s = g.op("Add", [s, g.const(np.triu(np.full((sq, sk), -1e4), 1), dtype=npdt)])
    if softmax == "Softmax":
        p = g.op("Softmax", [s], axis=-1)
    else:  # not a softmax: sigmoid weights normalised by their sum
        e = g.op("Sigmoid", [s])
        p = g.op("Div", [e, g.op("ReduceSum", [e, g.ints([-1])], keepdims=1)])
    out = g.op("MatMul", [p, v])
    if transpose_out:
        out = g.op("Transpose", [out], perm=[0, 2, 1, 3])
    g.add_output(out, dtype=dtype)
    return g.build("flash attention")


def _feeds(model, sq, sk, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        dims = [d.dim_value or (sq if inp.name == "q" else sk) for d in
                inp.type.tensor_type.shape.dim]
        dt = np.float16 if inp.type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
        out[inp.name] = rng.standard_normal(dims).astype(dt)
    return out


def _rules(cm) -> list[str]:
    from tvm import tirx

    return [str(f.attrs["fusion_tvm.rule"]) for f in cm.fused_mod.functions.values()
            if isinstance(f, tirx.PrimFunc) and f.attrs and "fusion_tvm.rule" in f.attrs]


def _fused(model, **kw):
    """The fused, unscheduled PrimFuncs of ``model`` (our partition)."""
    from tvm import tirx

    cm = fusion_tvm.compile(model, hw=HW, schedule=False, **kw)
    return [f for f in cm.fused_mod.functions.values() if isinstance(f, tirx.PrimFunc)]


# ----------------------------------------------------------------------------- matching
def test_match_reads_the_templates_off_the_blocks():
    (func,) = _fused(_attention(32, 48, dh=16, dv=8, transpose_out=True))
    form = match_attention(func)
    assert form is not None
    assert [int(e) for e in form.row_extents] == [1, 2, 32]
    assert int(form.key_extent) == 48 and form.red_extent == 16 and form.col_extent == 8
    # The scale is the score function of the Q K^T value; the transpose is the epilogue.
    assert form.acc in set(__import__("tvm").tirx.analysis.undefined_vars(form.score))
    assert len(form.epilogue) == 1 and form.out in form.allocs


@pytest.mark.parametrize("case", ["sigmoid", "float16", "scores_only"])
def test_match_refuses_what_it_cannot_rewrite(case):
    if case == "sigmoid":  # normalised, but not exp(s - max): no online form
        model = _attention(16, 16, softmax="sigmoid")
    elif case == "float16":
        model = _attention(16, 16, dtype=TensorProto.FLOAT16)
    else:  # Q K^T and the softmax, no P V: a part of the chain
        g = GraphBuilder("scores")
        q, k = g.add_input("q", [1, 2, 16, 16]), g.add_input("k", [1, 2, 16, 16])
        s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        g.add_output(g.op("Softmax", [s], axis=-1))
        model = g.build()
    funcs = _fused(model)
    assert funcs
    assert all(match_attention(f) is None for f in funcs)


# ------------------------------------------------------------------------------ kernels
CASES = {
    "square": dict(sq=64, sk=64),
    "ragged_rows": dict(sq=77, sk=77, heads=3),
    "cross": dict(sq=5, sk=300, dh=32),
    "wide_v": dict(sq=40, sk=40, dh=32, dv=48, transpose_out=True),
    "causal": dict(sq=50, sk=50, causal=True),
    "scaled_q": dict(sq=16, sk=16, scale_first=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_kernel_equals_unfused_and_onnxruntime(name):
    cfg = CASES[name]
    model = _attention(**cfg)
    feeds = _feeds(model, cfg["sq"], cfg["sk"])
    ours = fusion_tvm.compile(model, hw=HW)
    assert ours.num_kernels == 1
    assert _rules(ours) == ["flash_attention"]
    # The plan names the rule that ran the kernel next to the one the model priced.
    (group,) = ours.plan.groups
    assert group.scheduled_rule == "flash_attention" and group.rule == "matmul"
    assert " flash_attention " in ours.plan.table()
    unfused = fusion_tvm.compile(model, hw=HW, fusion="none", schedule=False)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (got,), (want,) = ours.run(feeds), unfused.run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_symbolic_queries_and_keys():
    """Different symbolic query and key lengths: blocks of keys, whole-tile remainders, a
    masked partial vector; a partial last tile of query rows."""
    g = GraphBuilder("flash_sym")
    q = g.add_input("q", [1, 2, "Q", 16])
    k, v = g.add_input("k", [1, 2, "K", 16]), g.add_input("v", [1, 2, "K", 16])
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    g.add_output(g.op("MatMul", [g.op("Softmax", [s], axis=-1), v]))
    model = g.build()
    hints = {"Q": (1, 512), "K": (1, 512)}
    ours = fusion_tvm.compile(model, hw=HW, shape_hints=hints)
    assert ours.num_kernels == 1 and _rules(ours) == ["flash_attention"]
    unfused = fusion_tvm.compile(model, hw=HW, shape_hints=hints, fusion="none",
                                 schedule=False)
    for sq, sk in ((1, 1), (3, 7), (16, 64), (9, 129), (70, 200)):
        feeds = _feeds(model, sq, sk, seed=sq)
        (got,), (want,) = ours.run(feeds), unfused.run(feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{sq}x{sk}")


def test_buffers_do_not_grow_with_the_sequence():
    """The kernel's own buffers (scores of one key block, accumulators of one row tile) are
    the same at S = 64 and S = 512; no S x S buffer exists."""
    from tvm import tirx

    sizes = {}
    for seq in (64, 512):
        cm = fusion_tvm.compile(_attention(seq, seq), hw=HW)
        (func,) = [f for f in cm.fused_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        script = func.script()
        assert f"{seq}, {seq}" not in script.replace("T.int64(", "").replace(")", "")
        local = [line.strip().split("=")[1] for line in script.splitlines()
                 if "sblock_alloc_buffer" in line and 'scope="local"' in line]
        sizes[seq] = sorted(local)
    assert sizes[64] and sizes[64] == sizes[512]


def test_ragged_rows_are_one_group_only_with_the_online_template():
    """197 query rows (ViT): the whole chain is one group when the backend has the online
    template; the row-wise template (blocks of 4 rows) forbids it."""
    from fusion_tvm.pipeline import make_pipeline

    model = _attention(197, 197, heads=3)
    parts = make_pipeline(hw=HW)
    with parts.target:
        parts.fuse(parts.prepare(fusion_tvm.frontend.load_model(model).mod))
    (block,) = parts.fuse_pass.plan.blocks
    graph = block.graph
    group = frozenset(graph.fusible_nodes)
    block4 = {"attention": True, "attention_row_block": 4}
    assert check_templates(graph, group, TemplateLimits(online_softmax=True, **block4))
    assert not check_templates(graph, group, TemplateLimits(**block4))
    assert check_templates(graph, group, TemplateLimits(attention=True))  # a target without
    # row blocks (attention_row_block None) takes any row count
    rowwise = fusion_tvm.compile(model, target=LLVMCPUBackend(softmax="rowwise"), hw=HW)
    assert rowwise.num_kernels > 1
