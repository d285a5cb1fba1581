"""Builds checked against onnxruntime, the reference the tests hold every ONNX model to."""

from __future__ import annotations

import collections
from collections.abc import Mapping

import numpy as np


def onnxruntime_outputs(model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of ``model`` (an ONNX ModelProto) on ``feeds``, by onnxruntime's CPU
    provider."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def assert_matches_onnxruntime(model, feeds: Mapping[str, np.ndarray], rtol: float = 1e-4,
                               atol: float = 1e-4, **compile_kwargs):
    """``fusion_tvm.compile(model, **compile_kwargs)``, each output checked against
    onnxruntime's on ``feeds``; returns the compiled model."""
    import fusion_tvm

    want = onnxruntime_outputs(model, feeds)
    compiled = fusion_tvm.compile(model, **compile_kwargs)
    got = compiled.run(dict(feeds))
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return compiled


def rule_counts(compiled) -> collections.Counter:
    """Kernels of ``compiled`` by the schedule rule that ran them."""
    from ..targets.schedule import applied_rules

    return collections.Counter(applied_rules(compiled.fused_mod).values())
