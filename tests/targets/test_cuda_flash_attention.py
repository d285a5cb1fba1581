"""The CUDA online-softmax (flash) attention rule, checked without a GPU.

Kernel level: for ragged, cross, causal, transposed, symbolic shapes the rule takes the
fused ``softmax(Q K^T) V`` PrimFunc, the schedule computes what the unscheduled function
does when its thread loops run one after another on the CPU (:mod:`.emulate`), and nvcc
compiles the generated CUDA for sm_80 and sm_90 within the static shared memory, the
per-thread state in registers / local arrays. Graph level: the ``gpu`` cost model plans a
whole attention block as one ``flash_attention`` kernel and leaves ``Q K^T`` + softmax as
it did before.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import tirx

from fusion_tvm.cost_models import get_cost_model, get_hardware
from fusion_tvm.frontend import load_model
from fusion_tvm.online_softmax import match_attention
from fusion_tvm.pipeline import make_pipeline
from fusion_tvm.targets import get_backend
from fusion_tvm.targets.cuda import flash_attention as fa
from fusion_tvm.targets.cuda.backend import STATIC_SMEM_BYTES
from fusion_tvm.targets.cuda.build import nvcc_compile, nvcc_path
from fusion_tvm.targets.cuda.emulate import check_schedule
from fusion_tvm.testing.synthetic import ConstantCostModel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is not installed with the package
    sys.path.insert(0, str(ROOT))

from test_cuda import plan_of  # noqa: E402

from benchmarks.ablation import attention_block  # noqa: E402
from benchmarks.zoo.builder import GraphBuilder  # noqa: E402

HW = "h100"
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc (CUDA toolkit) not installed")


def _attention(sq, sk, heads=2, dh=16, dv=None, causal=False, transpose_out=False,
               kv_transposed=False):
    """``softmax(Q K^T / sqrt(dh) [+ causal mask]) V``; ``sq`` / ``sk`` may be names.

    ``kv_transposed``: K and V arrive as ``[1, h, d, sk]`` (K read along the keys)."""
    dv = dv or dh
    g = GraphBuilder("flash")
    q = g.add_input("q", [1, heads, sq, dh])
    if kv_transposed:
        kt = g.add_input("kt", [1, heads, dh, sk])
        v = g.op("Transpose", [g.add_input("vt", [1, heads, dv, sk])], perm=[0, 1, 3, 2])
    else:
        kt = g.op("Transpose", [g.add_input("k", [1, heads, sk, dh])], perm=[0, 1, 3, 2])
        v = g.add_input("v", [1, heads, sk, dv])
    s = g.op("Mul", [g.op("MatMul", [q, kt]), g.const(np.float32(1 / np.sqrt(dh)))])
    if causal:
        s = g.op("Add", [s, g.const(np.triu(np.full((sq, sk), -1e4, np.float32), 1))])
    out = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
    if transpose_out:
        out = g.op("Transpose", [out], perm=[0, 2, 1, 3])
    g.add_output(out)
    return g.build("flash attention")


CASES = {
    "square": dict(sq=64, sk=64, dh=64),
    "ragged_rows": dict(sq=77, sk=77, heads=3),
    "cross": dict(sq=5, sk=300, dh=32),
    "wide_v_transposed_out": dict(sq=40, sk=40, dh=32, dv=48, transpose_out=True),
    "causal": dict(sq=50, sk=50, causal=True),
    "kv_transposed": dict(sq=33, sk=70, dh=32, kv_transposed=True),
    "symbolic": dict(sq="Q", sk="K"),
    # 6 keys in a tile of 8 over 4 lanes: the last lane sees only masked keys; tiles of
    # 8 x 12 floats are not a multiple of the 128 threads (guarded loads)
    "masked_lane": dict(sq=3, sk=6, dh=12),
}
#: Symbolic lengths the ``symbolic`` case is emulated at (a partial row tile and key
#: tile, one key, a query shorter than a warp).
SYMBOLIC_DIMS = [{"Q": 70, "K": 200}, {"Q": 9, "K": 129}, {"Q": 1, "K": 1}]


def _fused(model, shape_hints=None) -> tirx.PrimFunc:
    """The one PrimFunc of ``model`` fused for CUDA (always-fuse model: the plan is not
    under test here)."""
    parts = make_pipeline(target="cuda", hw=HW, cost_model=ConstantCostModel(),
                          shape_hints=shape_hints)
    with parts.target:
        mod = parts.fuse(parts.prepare(load_model(model).mod))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


@pytest.fixture(scope="module")
def kernels() -> dict[str, tuple[tirx.PrimFunc, tirx.PrimFunc]]:
    """Case -> (fused PrimFunc, its flash_attention schedule)."""
    hw = get_hardware(HW)
    target = get_backend("cuda").target(hw)
    out = {}
    for name, cfg in CASES.items():
        hints = {"Q": (1, 256), "K": (1, 256)} if name == "symbolic" else None
        func = _fused(_attention(**cfg), hints)
        sch = fa.FlashAttention().apply(func, target, hw)
        assert sch is not None, name
        out[name] = (func, sch.mod["main"])
    return out


@pytest.fixture(scope="module")
def cuda_source(kernels) -> str:
    """The CUDA source of every case, one module (one nvcc run per arch)."""
    target = get_backend("cuda").target(get_hardware(HW))
    funcs = {name: sched.with_attr("global_symbol", name)
             for name, (_, sched) in kernels.items()}
    return tvm.tirx.build(tvm.IRModule(funcs), target=target).imports[0].inspect_source()


def _kernel_bodies(source: str) -> dict[str, str]:
    """``__global__`` name -> body of each kernel defined in ``source``."""
    bodies = {}
    head = r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^)]*\) \{'
    for m in re.finditer(head, source):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        bodies[m.group(1)] = source[m.end():i]
    return bodies


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_computes_the_same_serialised_on_cpu(kernels, name):
    func, sched = kernels[name]
    assert match_attention(func) is not None
    for dims in SYMBOLIC_DIMS if name == "symbolic" else [None]:
        result = check_schedule(func, sched, dims=dims)
        print(name, dims or "", result)
        assert result.ok and not result.skipped, (name, dims, result)
        assert result.max_abs_err < 1e-5


def test_epilogue_pass_when_not_folded(kernels, monkeypatch):
    """An epilogue the store cannot absorb runs as its own thread-bound pass."""
    func, folded = kernels["wide_v_transposed_out"]
    monkeypatch.setattr(fa, "_fold_epilogue", lambda form: None)
    hw = get_hardware(HW)
    sch = fa.FlashAttention().apply(func, get_backend("cuda").target(hw), hw)
    assert folded.script().count('thread="blockIdx.x"') == 1  # transpose in the store
    assert sch.mod.script().count('thread="blockIdx.x"') == 2  # main pass, transpose pass
    assert check_schedule(func, sch.mod["main"]).ok


def test_tiles_follow_the_grid_and_head_dims():
    h100 = get_hardware(HW).gpu
    # 2 x 5 query rows: far too few warps for 132 SMs, each row's keys split in 4 lanes
    cross = fa.flash_tiles(32, 32, STATIC_SMEM_BYTES, 5, 300, 10, h100.sm_count)
    assert (cross.rows, cross.lanes, cross.keys) == (32, 4, 32)
    # 32 heads x 2048 rows give each SM 8 warps: one thread per row, 64-row blocks
    big = fa.flash_tiles(64, 64, STATIC_SMEM_BYTES, 2048, 2048, 32 * 2048, h100.sm_count)
    assert (big.rows, big.lanes, big.keys, big.smem_bytes) == (64, 1, 32, 32 * 130 * 4)
    # a wide head halves the key tile; dk + dv = 256 fits no thread
    assert fa.flash_tiles(96, 112, STATIC_SMEM_BYTES).keys == 16
    assert fa.flash_tiles(128, 128, STATIC_SMEM_BYTES) is None


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_within_static_shared_memory(cuda_source, kernels, arch, tmp_path):
    nvcc_compile(cuda_source, arch, workdir=str(tmp_path))
    bodies = _kernel_bodies(cuda_source)
    assert set(bodies) == {f"{name}_kernel" for name in CASES}  # one launch per case
    for name, body in bodies.items():
        shared = re.findall(r"__shared__[^;]*?float (\w+)\[(\d+)\]", body)
        assert {v.removesuffix("_ptr") for v, _ in shared} <= {"k_tile", "v_tile",
                                                               "lane_merge"}, name
        assert 4 * sum(int(n) for _, n in shared) <= STATIC_SMEM_BYTES, name
        # per-thread state: local arrays of one thread's row, never shared or global
        form = match_attention(kernels[name.removesuffix("_kernel")][0])
        local = dict(re.findall(r"^\s*alignas\(\d+\) float (\w+)_ptr\[(\d+)\];", body, re.M))
        assert int(local["q_reg"]) == form.red_extent and int(local["acc_o"]) == \
            form.col_extent, (name, local)
        assert body.count("__syncthreads()") >= 2


# ------------------------------------------------------------------------- graph level
def test_attention_block_is_one_flash_kernel():
    plan = plan_of(attention_block(), "cuda", HW, "gpu")
    assert plan.num_kernels == 1
    (group,) = plan.groups
    assert group.rule == "flash_attention"
    block = plan.blocks[0]
    (members,) = block.groups
    cost = plan.cost_model_obj.estimate(block.graph, members)
    print(cost.reason, cost.detail["launch_shape"])
    graph = block.graph
    # Memory: Q, K, V, the mask and the output once; no S x S scores anywhere
    externals = {t for n in members for t in graph.nodes[n].inputs
                 if graph.tensors[t].producer not in members}
    assert cost.detail["in_bytes"] == pytest.approx(sum(graph.nbytes(t) for t in externals))
    assert cost.detail["out_bytes"] == 4 * 4 * 128 * 64
    assert cost.detail["internal_s"] == 0.0 and cost.onchip_bytes < 4 * 4 * 128 * 128
    assert cost.detail["launch_shape"].smem_bytes <= STATIC_SMEM_BYTES


def test_symbolic_attention_is_one_flash_kernel_with_shape_hints():
    parts = make_pipeline(target="cuda", hw=HW, shape_hints={"Q": (1, 256), "K": (1, 256)})
    with parts.target:
        parts.fuse(parts.prepare(load_model(_attention("Q", "K", heads=4)).mod))
    assert [g.rule for g in parts.fuse_pass.plan.groups] == ["flash_attention"]


def test_attention_infeasible_where_its_tiles_do_not_fit():
    h100 = get_hardware(HW)
    tiny = replace(h100, name="h100-4k", gpu=replace(h100.gpu, shared_memory_per_block=4096))
    plan = plan_of(attention_block(), "cuda", h100, "gpu")
    block = plan.blocks[0]
    (group,) = block.groups
    cost = get_cost_model("gpu", tiny, get_backend("cuda")).estimate(block.graph, group)
    assert not cost.feasible and "shared memory" in cost.reason
    assert plan_of(attention_block(), "cuda", tiny, "gpu").num_kernels > 1


def test_scores_and_softmax_alone_are_not_flash():
    """Q K^T + softmax (no P V) keeps its CUDA plan: the matmul apart from the softmax."""
    g = GraphBuilder("scores")
    q, k = g.add_input("q", [1, 4, 128, 64]), g.add_input("k", [1, 4, 128, 64])
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    g.add_output(g.op("Softmax", [g.op("Mul", [s, g.const(np.float32(0.125))])], axis=-1))
    plan = plan_of(g.build(), "cuda", HW, "gpu")
    assert all(grp.rule != "flash_attention" for grp in plan.groups)
    graph = plan.blocks[0].graph
    for members in plan.blocks[0].groups:
        kinds = {graph.nodes[n].op_class.value for n in members}
        assert not {"matmul", "reduction"} <= kinds, kinds
    block = plan.blocks[0]
    whole = frozenset(block.graph.fusible_nodes)
    cost = plan.cost_model_obj.estimate(block.graph, whole)
    assert not cost.feasible and "no CUDA template runs this attention chain" in cost.reason


def test_kernel_count_in_cuda_source_of_a_built_block():
    """Through the whole pipeline: the block's PrimFunc is scheduled by flash_attention
    and launches one kernel."""
    from fusion_tvm.api import build_cuda

    b = build_cuda(attention_block(seq=64, dh=32), hw=HW)
    assert list(b.rules.values()) == ["flash_attention"]
    assert len(_kernel_bodies(b.source)) == 1  # (count_global_kernels counts prototypes too)
