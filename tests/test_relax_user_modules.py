"""Relax modules as TVM users write them (issue 24): dead code, ``call_tir_inplace``,
hand-written PrimFuncs, weights as parameters, plain string targets."""

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from fusion_tvm.api import count_kernels
from fusion_tvm.passes.fuse_by_cost_model import FuseByCostModel
from fusion_tvm.testing.synthetic import ConstantCostModel

# fmt: off


@I.ir_module
class DeadGroup:
    """TVM's test_transform_fuse_ops.py::test_dead_group: lv..lv3 are never used."""

    @R.function
    def main(inp_0: R.Tensor((1, 784), "float32"), inp_1: R.Tensor((1, 128), "float32"),
             linear1_bias: R.Tensor((128,), "float32"),
             linear1_weight: R.Tensor((128, 784), "float32"),
             linear2_bias: R.Tensor((10,), "float32"),
             linear2_weight: R.Tensor((10, 128), "float32")) -> R.Tensor((1, 10), "float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            lv = R.permute_dims(linear1_weight, axes=None)
            lv1 = R.matmul(inp_0, lv, out_dtype="float32")
            lv2 = R.add(lv1, linear1_bias)
            lv3 = R.nn.relu(lv2)  # noqa: F841 - the dead group
            lv4 = R.permute_dims(linear2_weight, axes=None)
            lv5 = R.matmul(inp_1, lv4, out_dtype="float32")
            lv6 = R.add(lv5, linear2_bias)
            gv = lv6
            R.output(gv)
        return gv


# fmt: on


def _prepared(mod: tvm.IRModule) -> tvm.IRModule:
    mod = relax.transform.LegalizeOps()(mod)
    return relax.transform.AnnotateTIROpPattern()(mod)


def test_dead_group_is_dropped_as_fuseops_drops_it():
    mod = _prepared(DeadGroup)
    fused = FuseByCostModel(ConstantCostModel(fuse=True))(mod)  # used to raise InternalError
    assert relax.analysis.check_well_formed(fused)
    names = {b.var.name for b in fused["main"].body.blocks[0].bindings}
    assert not names & {"lv1", "lv2", "lv3"}
    lowered = relax.transform.FuseTIR()(fused)
    fuseops = relax.transform.FuseTIR()(relax.transform.FuseOps()(mod))
    assert count_kernels(lowered) <= count_kernels(fuseops)

