"""ApplyTargetSchedule: first match wins, failures skip, input untouched."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.script import relax as R

import fusion_tvm.targets.llvm_cpu  # noqa: F401
from fusion_tvm.passes.apply_target_schedule import RULE_ATTR, ApplyTargetSchedule
from fusion_tvm.presets import get_hardware
from fusion_tvm.targets.base import ScheduleRule, get_backend
from fusion_tvm.targets.llvm_cpu import Fallback, LLVMCPUBackend

HW = get_hardware("ci-x86-avx2")


class Raises(ScheduleRule):
    name = "raises"

    def apply(self, func, target, hw):
        raise RuntimeError("template bug")


class Declines(ScheduleRule):
    name = "declines"

    def apply(self, func, target, hw):
        return None


class FakeBackend(LLVMCPUBackend):
    """Not registered: passed as an instance."""

    def __init__(self, rules):
        self._rules = rules

    def schedule_rules(self, hw):
        return self._rules


def module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.add(x, x))))
        bb.emit_func_output(out)
    mod = bb.get()
    seq = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
           relax.transform.FuseOps(), relax.transform.FuseTIR()]
    return tvm.transform.Sequential(seq)(mod)


def prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def test_backend_registered():
    backend = get_backend("llvm")
    assert isinstance(backend, LLVMCPUBackend)
    assert backend.default_hardware == "host"
    rules = [r.name for r in backend.schedule_rules(HW)]
    assert rules[-1] == "fallback"
    # most specific first: the chained-contraction and blocked-layout templates before the
    # generic matmul / conv ones, the catch-all last
    assert rules == ["flash_attention", "attention", "staged_chain", "conv2d_nchwc", "matmul",
                     "conv2d", "reduction", "elementwise", "fallback"]
    rowwise = [r.name for r in LLVMCPUBackend(softmax="rowwise").schedule_rules(HW)]
    assert rowwise == rules[1:]


def test_input_not_mutated_and_attrs_set():
    mod = module()
    before = {name: f for name, f in prim_funcs(mod).items()}
    out = ApplyTargetSchedule("llvm", HW)(mod)
    for name, func in prim_funcs(mod).items():
        assert func.same_as(before[name])
        assert func.attrs is None or RULE_ATTR not in func.attrs
    for func in prim_funcs(out).values():
        assert bool(func.attrs["tirx.is_scheduled"])
        assert str(func.attrs[RULE_ATTR]) == "elementwise"


def test_raising_rule_is_skipped():
    backend = FakeBackend([Raises(), Declines(), Fallback()])
    out = ApplyTargetSchedule(backend, HW)(module())
    assert {str(f.attrs[RULE_ATTR]) for f in prim_funcs(out).values()} == {"fallback"}
    ex = tvm.compile(out, tvm.target.Target(dict(HW.target)))
    x = np.arange(128, dtype="float32").reshape(8, 16) - 64
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.maximum(2 * x, 0))


def test_no_rule_leaves_function_alone():
    mod = module()
    out = ApplyTargetSchedule(FakeBackend([Raises(), Declines()]), HW)(mod)
    assert out.same_as(mod)


def test_already_scheduled_is_skipped():
    once = ApplyTargetSchedule(FakeBackend([Fallback()]), HW)(module())
    twice = ApplyTargetSchedule("llvm", HW)(once)
    assert {str(f.attrs[RULE_ATTR]) for f in prim_funcs(twice).values()} == {"fallback"}


def test_rule_efficiency_covers_every_rule():
    backend = get_backend("llvm")
    names = {r.name for r in backend.schedule_rules(HW)}
    from fusion_tvm.targets.llvm_cpu.efficiency import EFFICIENCY as table

    assert set(table) == names
    assert all(backend.rule_efficiency(n) == table[n] for n in names)
    assert all(0 < v <= 1.5 for v in table.values())  # HardwareSpec's accepted range
    HW.with_efficiency(table)  # validates
