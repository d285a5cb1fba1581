"""Matmul rule with symbolic rows: one build, many sizes, equal to the unscheduled build.

Also checks the properties the dynamic schedule is for: no row guard in the register-tile
loop (M is padded to whole tiles) and the epilogue computed per tile even when the row
axis is a fused ``N * S``; and that the VM lowering keeps the module's alias information
(``MarkShapeFuncsNoAlias``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.script import relax as R

import fusion_tvm.targets.llvm_cpu  # noqa: F401  (registers the backend)
from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.passes.mark_noalias import MarkShapeFuncsNoAlias
from fusion_tvm.pipeline import lower_passes
from fusion_tvm.presets import get_hardware
from fusion_tvm.targets.llvm_cpu.matmul import _panel_stationary, derive_tiles
from fusion_tvm.testing.synthetic import ConstantCostModel

HW = get_hardware("ci-x86-avx2")
TARGET = tvm.target.Target(dict(HW.target))
RNG = np.random.default_rng(0)
SIZES = [1, 7, 16, 77, 129]


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def lower(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def build(mod: tvm.IRModule) -> relax.VirtualMachine:
    ex = tvm.compile(mod, TARGET, relax_pipeline=tvm.transform.Sequential(lower_passes()))
    return relax.VirtualMachine(ex, tvm.cpu())


def gemm_module(x_shape, w_shape, n, epilogue):
    """``x @ w`` then ``epilogue`` in {None, "gelu", "residual"} (bias first if any)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(x_shape, "float32"))
    w = relax.Var("w", R.Tensor(w_shape, "float32"))
    b = relax.Var("b", R.Tensor((n,), "float32"))
    params = [x, w, b]
    out_shape = (*x_shape[:-1], n)
    if epilogue == "residual":
        params.append(relax.Var("r", R.Tensor(out_shape, "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            if epilogue is not None:
                y = bb.emit(relax.op.add(y, b))
            if epilogue == "gelu":
                y = bb.emit(relax.op.nn.gelu(y))
            elif epilogue == "residual":
                y = bb.emit(relax.op.add(y, params[3]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def scheduled_matmul(mod: tvm.IRModule) -> tuple[tvm.IRModule, tirx.PrimFunc]:
    scheduled = ApplyTargetSchedule("llvm", HW)(lower(mod))
    funcs = [f for _, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc)]
    matmuls = [f for f in funcs if str(f.attrs[RULE_ATTR]) == "matmul"]
    assert len(matmuls) == 1, [str(f.attrs[RULE_ATTR]) for f in funcs]
    return scheduled, matmuls[0]


def realize(sch: s_tir.Schedule, name: str):
    return tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, sch.get_sblock(name))


def check_sizes(mod, make_inputs, sizes=SIZES):
    """Build ``mod`` scheduled and plain once; compare them at every size."""
    scheduled, func = scheduled_matmul(mod)
    fast, plain = build(scheduled), build(lower(mod))
    for size in sizes:
        inputs = [tvm.runtime.tensor(a) for a in make_inputs(size)]
        np.testing.assert_allclose(
            fast["main"](*inputs).numpy(), plain["main"](*inputs).numpy(),
            rtol=1e-4, atol=1e-4, err_msg=f"size {size}",
        )
    return func


@pytest.mark.parametrize(
    "n,k,epilogue", [(40, 24, "gelu"), (53, 29, "gelu"), (53, 29, None), (16, 300, "residual")]
)
def test_symbolic_rows_every_size(n, k, epilogue):
    m = tirx.Var("m", "int64")
    mod = gemm_module((m, k), (k, n), n, epilogue)

    def inputs(size):
        extra = [rand(size, n)] if epilogue == "residual" else []
        return [rand(size, k), rand(k, n), rand(n), *extra]

    func = check_sizes(mod, inputs)
    # M is padded to whole register tiles: the hot loop carries no row guard.
    predicate = realize(s_tir.Schedule(func), "matmul_update").predicate
    assert isinstance(predicate, tirx.IntImm) and predicate.value == 1


def test_fused_symbolic_rows_epilogue_per_tile():
    batch, seq = tirx.Var("N", "int64"), tirx.Var("S", "int64")
    mod = gemm_module((batch, seq, 24), (24, 40), 40, "residual")

    def inputs(size):
        return [rand(2, size, 24), rand(24, 40), rand(40), rand(2, size, 40)]

    func = check_sizes(mod, inputs, sizes=[1, 7, 16, 77])
    # The epilogue (bias + residual) runs inside the parallel tile loop, not after it.
    sch = s_tir.Schedule(func)
    tile = sch.get(sch.get_loops(sch.get_sblock("matmul_update"))[0])
    assert tile.kind == tirx.stmt.ForKind.PARALLEL
    epilogue = [b for b in ("T_add", "T_add1") if _has_block(sch, b)]
    assert epilogue
    for name in epilogue:
        assert sch.get(sch.get_loops(sch.get_sblock(name))[0]).same_as(tile), name


def _has_block(sch: s_tir.Schedule, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - the schedule raises a generic error for a missing name
        return False
    return True


def test_batch_matmul_symbolic_batch_and_rows():
    batch, m = tirx.Var("b", "int64"), tirx.Var("m", "int64")
    mod = gemm_module((batch, m, 20), (batch, 20, 24), 24, "gelu")

    def inputs(size):
        return [rand(3, size, 20), rand(3, 20, 24), rand(24)]

    check_sizes(mod, inputs, sizes=[1, 7, 16, 33])


def test_shape_funcs_marked_noalias():
    m = tirx.Var("m", "int64")
    scheduled, _ = scheduled_matmul(gemm_module((m, 8), (8, 16), 16, "gelu"))
    with TARGET:
        lowered = tvm.transform.Sequential(lower_passes())(scheduled)
    funcs = {gv.name_hint: f for gv, f in lowered.functions_items()
             if isinstance(f, tirx.PrimFunc)}
    shape_funcs = [f for name, f in funcs.items() if name.startswith("shape_func")]
    assert shape_funcs, sorted(funcs)
    assert all(bool(f.attrs["tirx.noalias"]) for f in shape_funcs)
    # A function with several buffers and no attribute is left alone.
    two = lowered[[gv for gv in lowered.get_global_vars() if gv.name_hint in funcs
                   and not gv.name_hint.startswith("shape_func")][0]].without_attr("tirx.noalias")
    out = MarkShapeFuncsNoAlias()(tvm.IRModule({"f": two}))
    assert "tirx.noalias" not in out["f"].attrs


def test_large_k_panel_stationary_order():
    tiles = derive_tiles(HW, 32, None, 40, b_j_contiguous=True)
    # An A strip of mr x 2100 floats exceeds L1: column panels go outer; K = 512 fits L1.
    assert _panel_stationary(HW, 2100, tiles.mr, tiles.nr, 32)
    assert not _panel_stationary(HW, 512, tiles.mr, tiles.nr, 32)
    assert not _panel_stationary(HW, None, tiles.mr, tiles.nr, 32)
    assert _panel_stationary(HW, 512, tiles.mr, tiles.nr, 32, packed=False)  # B read in place
    m = tirx.Var("m", "int64")
    check_sizes(gemm_module((m, 2100), (2100, 40), 40, "gelu"),
                lambda size: [rand(size, 2100), rand(2100, 40), rand(40)], sizes=[1, 37])
    check_sizes(gemm_module((96, 2100), (2100, 40), 40, "gelu"),
                lambda size: [rand(96, 2100), rand(2100, 40), rand(40)], sizes=[96])


def test_transposed_b_is_packed_not_gathered():
    """A transpose inlined into B (ViT's ``q @ k^T`` over ``k[b, s, h, d]``) makes B's
    innermost axis k, not j: B is packed (one transposing pass), never read in place with
    a stride of a whole row per vector lane (29 us against 1 us predicted)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", R.Tensor((1, 3, 37, 32), "float32"))
    k = relax.Var("k", R.Tensor((1, 37, 3, 32), "float32"))
    with bb.function("main", [q, k]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 3, 1]))  # [1, 3, 32, 37]
            out = bb.emit_output(relax.op.matmul(q, kt))
        bb.emit_func_output(out)
    mod = bb.get()
    # FuseOps leaves the transpose apart; fuse the two as the cost model does (ViT).
    grouped = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        FuseByCostModel(ConstantCostModel(fuse=True), hw=HW, compare_fuseops=False),
        relax.transform.FuseTIR(),
    ])(mod)
    scheduled = ApplyTargetSchedule("llvm", HW)(grouped)
    funcs = [f for _, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc)]
    (func,) = [f for f in funcs if str(f.attrs[RULE_ATTR]) == "matmul"]
    assert len(funcs) == 1, [str(f.attrs[RULE_ATTR]) for f in funcs]
    sch = s_tir.Schedule(func)
    update = sch.get(sch.get_sblock("matmul_update"))
    # The micro-kernel reads the packed panel of B, not the strided input k.
    k_shape = [1, 37, 3, 32]
    assert not any([int(d) for d in r.source.shape] == k_shape for r in update.reads), \
        update.reads
    assert any(r.source.name.endswith("_global") for r in update.reads), update.reads
    assert derive_tiles(HW, 32, 37, 37, b_j_contiguous=False).pack_b
    fast, plain = build(scheduled), build(lower(mod))
    args = [tvm.runtime.tensor(rand(1, 3, 37, 32)), tvm.runtime.tensor(rand(1, 37, 3, 32))]
    np.testing.assert_allclose(fast["main"](*args).numpy(), plain["main"](*args).numpy(),
                               rtol=1e-4, atol=1e-4)
