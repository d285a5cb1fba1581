"""The LLVM-CPU attention rules with a symbolic sequence length.

One dynamic build per mask kind and softmax form, scheduled by the attention rule of that
form (the online-softmax ``flash_attention`` by default, the row-wise ``attention`` with
``LLVMCPUBackend(softmax="rowwise")``; not the fallback), run at sequence lengths that are
and are not multiples of the row block (4) and the SIMD width, against the unfused,
unscheduled build.
"""

import numpy as np
import pytest

import fusion_tvm
from benchmarks.zoo.builder import GraphBuilder
from fusion_tvm.targets.llvm_cpu.backend import LLVMCPUBackend

HW = "ci-x86-avx2"
HEADS, DH = 2, 16
SIZES = (1, 5, 16, 77, 128, 197)


def _attention(seq, causal: bool):
    """softmax(Q K^T / 4 + mask) V, output transposed to [1, S, heads, dh]."""
    g = GraphBuilder("attention_rule")
    q, k, v = (g.add_input(n, [1, HEADS, seq, DH]) for n in "qkv")
    mask = g.add_input("mask", [1, 1, seq, seq] if causal else [1, 1, 1, seq])
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    s = g.op("Add", [g.op("Div", [s, g.const(4.0)]), mask])
    out = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
    g.add_output(g.op("Transpose", [out], perm=[0, 2, 1, 3]))
    return g.build("attention rule")


def _feeds(seq: int, causal: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    feeds = {n: rng.standard_normal((1, HEADS, seq, DH)).astype("float32") for n in "qkv"}
    if causal:
        feeds["mask"] = np.triu(np.full((seq, seq), -1e4, np.float32), 1)[None, None]
    else:  # padding: the last quarter of the keys masked
        feeds["mask"] = np.zeros((1, 1, 1, seq), np.float32)
        feeds["mask"][..., seq - seq // 4:] = -1e4
    return feeds


def _rules(cm) -> list[str]:
    from tvm import tirx

    return [str(f.attrs["fusion_tvm.rule"]) for f in cm.fused_mod.functions.values()
            if isinstance(f, tirx.PrimFunc) and f.attrs and "fusion_tvm.rule" in f.attrs]


#: Softmax form of the backend -> the rule that schedules the attention kernel.
FORMS = {"online": "flash_attention", "rowwise": "attention"}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal"])
def test_symbolic_sequence_matches_unfused(causal, form):
    model = _attention("S", causal)
    hints = {"S": (1, 256)}
    ours = fusion_tvm.compile(model, target=LLVMCPUBackend(softmax=form), hw=HW,
                              shape_hints=hints)
    ref = fusion_tvm.compile(model, hw=HW, shape_hints=hints, fusion="none", schedule=False)
    assert ours.num_kernels == 1
    assert _rules(ours) == [FORMS[form]]
    for seq in SIZES:
        feeds = _feeds(seq, causal)
        (got,), (want,) = ours.run(feeds), ref.run(feeds)
        assert got.shape == (1, seq, HEADS, DH)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"S={seq}")


@pytest.mark.parametrize("seq", [77, 197])
def test_static_rows_not_a_multiple_of_the_row_block(seq):
    """Static rows that are not a multiple of the row block (4) nor of the vector width: the
    key loops peeled into vectors plus a tail; equal to the unscheduled function."""
    from fusion_tvm.cost_models import get_hardware
    from fusion_tvm.targets.llvm_cpu.attention import Attention, attention_parallel_pays

    model = _attention("S", causal=False)
    fused = fusion_tvm.compile(model, hw=HW, shape_hints={"S": (1, 256)}, schedule=False)
    import tvm
    from tvm import tirx

    func = next(f for f in fused.fused_mod.functions.values()
                if isinstance(f, tirx.PrimFunc) and "softmax" in f.script())
    shape = [d if isinstance(d, tirx.IntImm) else tirx.IntImm("int64", seq)
             for d in func.params[0].ty.shape]
    func = func.specialize({func.params[0]: tirx.decl_buffer(shape, "float32")})
    hw = get_hardware(HW)
    target = tvm.target.Target(dict(hw.target))
    sch = Attention().apply(func, target, hw)
    assert sch is not None
    script = sch.mod["main"].script()
    assert "T.vectorized" in script
    # parallel only when the kernel's serial time pays for the thread pool's fork/join
    assert ("T.parallel" in script) == attention_parallel_pays(hw, func, seq)
    libs = [tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}),
                        target=target) for f in (sch.mod["main"], func)]
    rng = np.random.default_rng(seq)
    outs = []
    for lib in libs:
        args = [tvm.runtime.tensor(rng.standard_normal(
            [int(d) for d in p.ty.shape]).astype("float32")) for p in func.params]
        rng = np.random.default_rng(seq)  # same inputs for both builds
        lib["main"](*args)
        outs.append(args[-1].numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
