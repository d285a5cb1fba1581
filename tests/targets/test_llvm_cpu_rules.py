"""LLVM-CPU schedule rules: numerics against the unscheduled build, and which rule fired."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import relax as R

import fusion_tvm.targets.llvm_cpu  # noqa: F401  (registers the backend)
from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule
from fusion_tvm.presets import get_hardware
from fusion_tvm.targets.llvm_cpu import Fallback
from fusion_tvm.targets.llvm_cpu.matmul import derive_tiles

# Frozen AVX2 spec: runs on any x86-64 CI machine and keeps tile choices deterministic.
HW = get_hardware("ci-x86-avx2")
TARGET = tvm.target.Target(dict(HW.target))
RNG = np.random.default_rng(0)


def lower(mod: tvm.IRModule) -> tvm.IRModule:
    """Legalize and fuse the way the pipeline does before scheduling."""
    return tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, TARGET), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return np.concatenate([o.numpy().ravel() for o in out])  # a tuple: all its fields


def rules_of(mod: tvm.IRModule) -> dict[str, str]:
    return {
        gv.name_hint: str(f.attrs[RULE_ATTR])
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc)
    }


def check(mod: tvm.IRModule, inputs: list[np.ndarray], expect: dict[str, str], tol=1e-4):
    """Schedule ``mod``; check the rules that fired and the numbers against the plain build."""
    lowered = lower(mod)
    scheduled = ApplyTargetSchedule("llvm", HW)(lowered)
    fired = rules_of(scheduled)
    for fragment, rule in expect.items():
        matching = {name: r for name, r in fired.items() if fragment in name}
        assert matching, f"no kernel named like {fragment!r} in {fired}"
        assert set(matching.values()) == {rule}, fired
    np.testing.assert_allclose(run(scheduled, inputs), run(lowered, inputs), rtol=tol, atol=tol)
    return scheduled


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


# ---------------------------------------------------------------------------- builders
def matmul_module(m, n, k, *, trans_b=False, epilogue="gelu", batch=None, batch_b=False):
    bb = relax.BlockBuilder()
    x_shape = (m, k) if batch is None else (batch, m, k)
    w_shape = (n, k) if trans_b else (k, n)
    if batch_b:
        w_shape = (batch, *w_shape)
    x = relax.Var("x", R.Tensor(x_shape, "float32"))
    w = relax.Var("w", R.Tensor(w_shape, "float32"))
    b = relax.Var("b", R.Tensor((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            rhs = bb.emit(relax.op.permute_dims(w, [*range(len(w_shape) - 2), -1, -2])) if (
                trans_b
            ) else w
            y = bb.emit(relax.op.matmul(x, rhs))
            if epilogue:
                y = bb.emit(relax.op.add(y, b))
                y = bb.emit(getattr(relax.op.nn, epilogue)(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def elementwise_module(shape):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    y = relax.Var("y", R.Tensor(shape, "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            t = bb.emit(relax.op.add(x, y))
            t = bb.emit(relax.op.exp(relax.op.multiply(t, relax.const(0.5, "float32"))))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(t)))
        bb.emit_func_output(out)
    return bb.get()


# ------------------------------------------------------------------------------ matmul
def test_tiles_derived_from_hardware():
    avx2 = derive_tiles(HW, 32, None, None, b_j_contiguous=True)
    avx512 = derive_tiles(get_hardware("epyc-znver4-2c"), 32, None, None, b_j_contiguous=True)
    assert (avx2.nr, avx512.nr) == (16, 32)  # two vectors of lanes
    assert avx2.mr * avx2.nr // 8 <= HW.num_vector_registers // 2
    assert avx512.mr * avx512.nr // 16 <= 16
    assert derive_tiles(HW, 32, 1, 64, b_j_contiguous=True).pack_b is False
    assert derive_tiles(HW, 32, 3, 64, b_j_contiguous=True).mr == 3


def test_b_padded_along_n_is_packed():
    """Few row tiles read a row-major B in place, unless N needs padding: then every load
    of the hot loop would go through the padding guard (a 95 x 504 x 196 pointwise conv as
    a GEMM: 2.5x slower in place)."""
    assert derive_tiles(HW, 32, 16, 192, b_j_contiguous=True).pack_b is False
    assert derive_tiles(HW, 32, 16, 196, b_j_contiguous=True).pack_b is True
    assert derive_tiles(HW, 32, 16, None, b_j_contiguous=True).pack_b is False


@pytest.mark.parametrize(
    "m,n,k,trans_b,epilogue",
    [
        (64, 48, 32, False, "gelu"),  # divisible, bias + GELU epilogue
        (37, 53, 29, False, "relu"),  # ragged M, N, K: tails and N padding
        (37, 53, 29, True, None),  # transposed B (prologue packed), no epilogue
        (3, 20, 16, False, "relu"),  # fewer rows than the register tile
    ],
)
def test_matmul_static(m, n, k, trans_b, epilogue):
    mod = matmul_module(m, n, k, trans_b=trans_b, epilogue=epilogue)
    w = rand(n, k) if trans_b else rand(k, n)
    check(mod, [rand(m, k), w, rand(n)], {"matmul": "matmul"})


def test_row_times_matrix_gemv():
    mod = matmul_module(1, 100, 48, epilogue="relu")  # batch-1 fc layer, N not a vector multiple
    check(mod, [rand(1, 48), rand(48, 100), rand(100)], {"matmul": "matmul"})


def test_matmul_symbolic_rows():
    n_var = tirx.Var("n", "int64")
    mod = matmul_module(n_var, 40, 24, epilogue="gelu")
    check(mod, [rand(45, 24), rand(24, 40), rand(40)], {"matmul": "matmul"})


def test_matmul_symbolic_rows_transposed_ragged():
    n_var = tirx.Var("n", "int64")
    mod = matmul_module(n_var, 20, 24, trans_b=True, epilogue="relu", batch=2)
    check(mod, [rand(2, 13, 24), rand(20, 24), rand(20)], {"matmul": "matmul"})


def test_batch_matmul_shared_and_batched_b():
    mod = matmul_module(10, 24, 16, epilogue="relu", batch=3)  # B shared by the batch
    check(mod, [rand(3, 10, 16), rand(16, 24), rand(24)], {"matmul": "matmul"})
    mod = matmul_module(10, 24, 16, epilogue=None, batch=3, batch_b=True)
    check(mod, [rand(3, 10, 16), rand(3, 16, 24), rand(24)], {"matmul": "matmul"})


# ------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("shape", [(4, 64), (3, 7, 13)])
def test_elementwise_static(shape):
    check(elementwise_module(shape), [rand(*shape), rand(*shape)], {"add": "elementwise"})


def test_elementwise_symbolic():
    n_var = tirx.Var("n", "int64")
    check(elementwise_module((n_var, 37)), [rand(5, 37), rand(5, 37)], {"add": "elementwise"})


# ---------------------------------------------------------------------------- fallback
@pytest.mark.parametrize(
    "mod,inputs",
    [
        (matmul_module(37, 53, 29, epilogue="gelu"), [rand(37, 29), rand(29, 53), rand(53)]),
        (elementwise_module((3, 7, 13)), [rand(3, 7, 13), rand(3, 7, 13)]),
    ],
)
def test_fallback_matches_everything(mod, inputs):
    lowered = lower(mod)
    scheduled = lowered
    for gv, func in lowered.functions_items():
        if isinstance(func, tirx.PrimFunc):
            sch = Fallback().apply(func, TARGET, HW)
            assert sch is not None
            scheduled = scheduled.clone() if scheduled is lowered else scheduled
            scheduled[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    np.testing.assert_allclose(run(scheduled, inputs), run(lowered, inputs), rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------- conv
def conv_module(data, weight, *, groups=1, stride=1, bn=False, residual=False):
    """conv2d (+ bias or batch-norm arithmetic) + ReLU (+ residual add), NCHW."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(data, "float32"))
    w = relax.Var("w", R.Tensor(weight, "float32"))
    scale = relax.Var("s", R.Tensor((1, weight[0], 1, 1), "float32"))
    shift = relax.Var("t", R.Tensor((1, weight[0], 1, 1), "float32"))
    params = [x, w, scale, shift]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(x, w, strides=stride, padding=weight[2] // 2, groups=groups)
            )
            if bn:  # inference batch-norm as FuseOps sees it after decomposition
                y = bb.emit(relax.op.multiply(relax.op.subtract(y, shift), scale))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, shift)))
            if residual:
                y = bb.emit(relax.op.add(y, y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def conv_inputs(data, weight):
    return [rand(*data), rand(*weight), rand(1, weight[0], 1, 1), rand(1, weight[0], 1, 1)]


@pytest.mark.parametrize(
    "data,weight,kw",
    [
        ((1, 8, 16, 16), (16, 8, 3, 3), dict(bn=True)),  # 3x3 + BN + ReLU
        ((2, 5, 12, 20), (7, 5, 3, 3), dict(residual=True)),  # ragged channels, batch 2
        ((1, 6, 8, 24), (6, 1, 3, 3), dict(groups=6)),  # depthwise
        ((1, 4, 8, 8), (8, 4, 1, 1), {}),  # 1x1
    ],
)
def test_conv2d_static(data, weight, kw):
    check(conv_module(data, weight, **kw), conv_inputs(data, weight), {"conv2d": "conv2d"},
          tol=1e-3)


def test_conv2d_symbolic_batch():
    n_var = tirx.Var("n", "int64")
    mod = conv_module((n_var, 4, 8, 16), (8, 4, 3, 3), bn=True)
    check(mod, conv_inputs((3, 4, 8, 16), (8, 4, 3, 3)), {"conv2d": "conv2d"}, tol=1e-3)


def test_conv2d_narrow_rows_vectorise_channels():
    data, weight = (1, 4, 7, 7), (16, 4, 3, 3)  # 7 columns: channel-vector kernel
    check(conv_module(data, weight, bn=True), conv_inputs(data, weight), {"conv2d": "conv2d"},
          tol=1e-3)


def test_conv2d_narrow_rows_ragged_channels_fall_through():
    data, weight = (1, 4, 7, 7), (6, 4, 3, 3)  # neither rows nor channels fill a vector
    scheduled = check(conv_module(data, weight), conv_inputs(data, weight), {}, tol=1e-3)
    assert "conv2d" not in set(rules_of(scheduled).values())


# --------------------------------------------------------------------------- reduction
def row_module(kind, shape):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    g = relax.Var("g", R.Tensor((shape[-1],), "float32"))
    with bb.function("main", [x, g]):
        with bb.dataflow():
            if kind == "softmax":  # elementwise prologue fused by FuseOps
                y = bb.emit(relax.op.nn.softmax(relax.op.multiply(x, relax.const(0.5, "float32"))))
            elif kind == "layernorm":  # layer norm + GELU epilogue
                y = bb.emit(relax.op.nn.gelu(relax.op.nn.layer_norm(x, g, g, axes=[-1])))
            elif kind == "rmsnorm":
                y = bb.emit(relax.op.nn.rms_norm(x, g, axes=[-1]))
            elif kind == "sum":
                y = bb.emit(relax.op.sum(x, axis=[-1]))
            elif kind == "mean":
                y = bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))
            elif kind == "maxpool":
                y = bb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
            else:
                y = bb.emit(relax.op.nn.adaptive_avg_pool2d(x, output_size=1))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "kind,shape,kernel",
    [
        ("softmax", (8, 64), "softmax"),  # rfactor-ed vector partials
        ("softmax", (7, 37), "softmax"),  # ragged row: scalar reduction
        ("layernorm", (6, 48), "layer_norm"),
        ("rmsnorm", (5, 32), "rms_norm"),
        ("sum", (4, 3, 40), "sum"),
        ("mean", (3, 50), "mean"),
        ("maxpool", (1, 4, 13, 13), "max_pool"),
        ("avgpool", (2, 8, 7, 7), "avg_pool"),
    ],
)
def test_reduction_rows(kind, shape, kernel):
    check(row_module(kind, shape), [rand(*shape), rand(shape[-1])], {kernel: "reduction"})


def _pooled(shape, pool_size, strides, padding):
    k, p = np.broadcast_to(pool_size, 2), np.broadcast_to(padding, 2)
    return (*shape[:2], *((n + 2 * q - w) // strides + 1
                          for n, q, w in zip(shape[2:], p, k, strict=True)))


def window_module(kind, shape, pool_size, strides, padding, epilogue):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    r = relax.Var("r", R.Tensor(_pooled(shape, pool_size, strides, padding), "float32"))
    pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(pool(x, pool_size=pool_size, strides=strides, padding=padding))
            if epilogue:  # TVM #20401's MaxPool + Add, and a ReLU after it
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, r)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind,shape,pool_size,strides,padding,epilogue,one_nest", [
    ("max", (1, 8, 16, 24), 3, 1, 1, True, True),  # the row vector divides 24
    ("avg", (2, 4, 12, 16), 3, 1, 1, True, True),  # sum then divide: the divide joins too
    ("max", (1, 4, 10, 32), (2, 3), 1, (0, 1), False, True),  # output copied from a row
    ("max", (1, 4, 11, 13), 3, 1, 1, True, False),  # 13 columns: no vector, as before
    ("max", (1, 4, 16, 16), 3, 2, 1, True, False),  # strided: the (x, window) nest
])
def test_unit_stride_window_vectorises_columns(kind, shape, pool_size, strides, padding,
                                               epilogue, one_nest):
    """A stride-1 pooling window over NCHW rows runs its output columns as the vector, the
    padding and an elementwise epilogue computed at the row: one loop nest (TVM #20401's
    MaxPool + Add: 53 us as three passes, 45 us so)."""
    mod = window_module(kind, shape, pool_size, strides, padding, epilogue)
    inputs = [rand(*shape), rand(*_pooled(shape, pool_size, strides, padding))]
    scheduled = check(mod, inputs, {"pool": "reduction"})
    (func,) = [f for gv, f in scheduled.functions_items() if "pool" in gv.name_hint]
    assert (_loop_nests(func) == 1) == one_nest, func.script()


@pytest.mark.parametrize("shape", [(1, 6, 28, 28, 8), (2, 3, 7, 9, 8)])
def test_global_pool_over_blocked_lanes_vectorises_the_lanes(shape):
    """The squeeze of a squeeze-excitation block over ``NCHW[b]c``: a mean over all
    pixels (784: longer than a window) with the channel lanes innermost. The lanes are
    the vector, the pixels a loop outside it (as a row reduction each channel ran a scalar
    chain over stride-8 loads: 0.14-0.2 of its predicted speed, MobileNetV3's pools 27-40
    against 3-5 us)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    scheduled = check(bb.get(), [rand(*shape)], {"mean": "reduction"})
    (func,) = [f for gv, f in scheduled.functions_items() if "mean" in gv.name_hint]
    script = func.script()
    vectorized = re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", script)
    assert vectorized and set(vectorized) == {str(shape[-1])}, script


def _rf_lanes(func) -> list[int]:
    """Vector widths of the rfactor partial-sum blocks of a scheduled PrimFunc."""
    script = func.script()
    widths = []
    for part in script.split("for ")[1:]:
        m = re.match(r"\w+ in T\.vectorized\(T\.int64\((\d+)\)\):\s+with T\.sblock\(\"(\w+)\"",
                     part)
        if m and "_rf" in m.group(2):
            widths.append(int(m.group(1)))
    return widths


@pytest.mark.parametrize("shape,lanes_used", [((1, 24, 28, 28), 8), ((1, 24, 14, 14), 4)])
def test_pool_over_nchw_rows_reduces_in_vector_partials(shape, lanes_used):
    """The mean over H and W of an NCHW tensor (two reduction loops) of a swish output that
    is published too: the pixels fused into one reduction, split into vector partial
    sums (4 lanes where 8 do not divide 196) even with the published copy beside it (the
    partials were matched by stmt identity, lost when a producer was inlined: MixNet's
    pools ran as scalar chains, 142 us against 7; GPT-2's residual + layer norm 68 vs 19)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(x, relax.op.sigmoid(x)))
            m = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
            out = bb.emit_output(relax.Tuple([y, m]))
        bb.emit_func_output(out)
    scheduled = check(bb.get(), [rand(*shape)], {"mean": "reduction"}, tol=1e-3)
    (func,) = [f for gv, f in scheduled.functions_items() if "mean" in gv.name_hint]
    assert _rf_lanes(func) and set(_rf_lanes(func)) == {lanes_used}, func.script()


def _loop_nests(func) -> int:
    """Top-level loop nests of a scheduled PrimFunc."""
    sch = tvm.s_tir.Schedule(func)
    outer = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loop = sch.get(sch.get_loops(block)[0])
        if not any(loop.same_as(o) for o in outer):
            outer.append(loop)
    return len(outer)


def test_reduction_symbolic_rows():
    n_var = tirx.Var("n", "int64")
    mod = row_module("layernorm", (n_var, 64))
    check(mod, [rand(9, 64), rand(64)], {"layer_norm": "reduction"})


# ---------------------------------------------------- intrinsics without vector lowering
@pytest.mark.parametrize("op", ["cosh", "sinh"])
def test_hyperbolic_stay_scalar(op):
    """TVM's LLVM codegen has no vector cosh/sinh: every rule must keep them scalar."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((16, 40), "float32"))
    w = relax.Var("w", R.Tensor((40, 32), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            a = bb.emit(getattr(relax.op, op)(x))  # elementwise kernel (and matmul prologue)
            y = bb.emit(relax.op.matmul(a, w))
            out = bb.emit_output(bb.emit(getattr(relax.op, op)(relax.op.multiply(
                y, relax.const(0.01, "float32")))))  # matmul epilogue
        bb.emit_func_output(out)
    check(bb.get(), [rand(16, 40), rand(40, 32)], {"matmul": "matmul"}, tol=1e-3)


def test_window_reverse_epilogue_is_not_computed_per_tile():
    """A GEMM on 49 window rows whose epilogue reshapes them to 7 x 7 and transposes to
    NCHW: an 8-row tile (16 lanes) got a 32 x 2 x 1 region of the output there, computed
    from rows other parallel tiles had not written (TinyViT, Swin-T: 0.4-0.9 relative
    error). The epilogue now runs after the GEMM, over the whole output."""
    from tvm import s_tir

    import fusion_tvm

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 49, 64), "float32"))
    r = relax.Var("r", relax.TensorType((1, 7, 7, 64), "float32"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x, r]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((64, 64)).astype("float32"))
            y = bb.emit(relax.op.reshape(relax.op.matmul(x, w), (1, 7, 7, 64)))
            out = bb.emit_output(bb.emit(relax.op.permute_dims(relax.op.add(r, y),
                                                               [0, 3, 1, 2])))
        bb.emit_func_output(out)
    compiled = fusion_tvm.compile(bb.get(), hw="epyc-znver4-2c")
    (func,) = [f for f in compiled.fused_mod.functions.values()
               if isinstance(f, tirx.PrimFunc) and "fusion_tvm.rule" in f.attrs]
    assert str(func.attrs["fusion_tvm.rule"]) == "matmul"
    sch = s_tir.Schedule(func)
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    epilogue = next(b for b in ("T_transpose", "T_add") if b in names)
    extents = [int(sch.get(lp).extent) for lp in sch.get_loops(sch.get_sblock(epilogue))]
    assert np.prod(extents) == 49 * 64, extents
