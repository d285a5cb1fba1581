"""Does a scheduled PrimFunc lower for CUDA? A rule whose schedule TVM cannot lower is
"not mine", so the driver tries the next rule instead of failing the build."""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.s_tir.pipeline import default_s_tir_pipeline


def lowers(sch: s_tir.Schedule, target: tvm.target.Target) -> str | None:
    """None when ``sch`` lowers through TVM's TIR pipeline for ``target``, else the error.

    Runs the lowering passes of ``tvm.tirx.build`` (flattening, thread-binding and memory
    verification, host/device split) but no code generation: milliseconds per kernel.
    """
    func = sch.mod["main"].with_attr("global_symbol", "main").with_attr("target", target)
    pipeline = default_s_tir_pipeline()[0]
    try:
        with target:
            pipeline(tvm.IRModule({"main": func}))
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds; the text is the answer
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        return lines[-1] if lines else type(err).__name__
    return None

