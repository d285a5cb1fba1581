"""Measured decisions (``compile(..., verify="measure")``) on the bundled detection head.

Under the frozen spec its block main#0 keeps FuseOps's partition merged further (0.131 ms
predicted) over the search's own (0.152 ms): a 13% predicted saving, inside the 15% band, so
the measured mode builds both, times them and records the faster; a second compile with the
same tuning database reads the decision and times nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import fusion_tvm
from fusion_tvm import verify
from fusion_tvm.cli import main as cli_main
from fusion_tvm.errors import UserInputError

HW = "ci-x86-avx2"
MODEL = Path(fusion_tvm.__file__).parent / "examples" / "detection_head.onnx"
CANDIDATES = {"search", "fuseops"}


def _feeds(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        inp.name: rng.standard_normal(
            [d.dim_value for d in inp.type.tensor_type.shape.dim]).astype("float32")
        for inp in model.graph.input
    }


def _no_timing(*_args, **_kwargs):
    raise AssertionError("timed a build")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The measured compile and its tuning database file (created by the compile)."""
    db = tmp_path_factory.mktemp("verify") / "db.json"
    return fusion_tvm.compile(str(MODEL), hw=HW, verify="measure", tuning_db=db), db


def test_measured_plan_records_the_decision(measured):
    cm, db = measured
    plan = cm.plan
    [v] = plan.verified
    assert (v["function"], v["block"]) == ("main", 0)
    assert {v["source"], v["alternative"]} == CANDIDATES
    assert plan.blocks[0].source == v["source"]
    assert set(v["measured_s"]) == CANDIDATES and all(t > 0 for t in v["measured_s"].values())
    assert v["predicted_s"]["fuseops"] < v["predicted_s"]["search"]  # the model's view
    faster = min(v["measured_s"], key=v["measured_s"].get)
    assert v["source"] == faster and v["cached"] is False
    assert f"kept {v['source']} (timed now)" in plan.table()
    assert plan.to_json()["verified"] == plan.verified
    [rec] = json.loads(db.read_text())["decisions"]
    assert (rec["source"], rec["name"], rec["hardware"]) == (v["source"], "main#0", HW)


def test_measured_build_matches_onnxruntime(measured):
    cm, _ = measured
    model = onnx.load(MODEL)
    feeds = _feeds(model)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for a, r in zip(cm.run(feeds), ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


def test_second_compile_reads_the_database(measured, monkeypatch):
    first, db = measured
    monkeypatch.setattr(verify, "time_interleaved", _no_timing)
    cm = fusion_tvm.compile(str(MODEL), hw=HW, verify="measure", tuning_db=db)
    [v] = cm.plan.verified
    [v0] = first.plan.verified
    assert v["cached"] is True
    assert (v["source"], v["alternative"]) == (v0["source"], v0["alternative"])
    assert cm.plan.blocks[0].source == v0["source"]
    assert v["measured_s"] == pytest.approx(v0["measured_s"])
    assert "(from the tuning database)" in cm.plan.table()
    assert cm.kernel_calls() == first.kernel_calls()


def test_verify_off_times_nothing_and_plans_as_before(monkeypatch):
    monkeypatch.setattr(verify, "time_interleaved", _no_timing)
    plan = fusion_tvm.compile(str(MODEL), hw=HW).plan
    assert plan.verified is None and "verified" not in plan.to_json()
    assert [(f["function"], f["block"], f["source"]) for f in plan.fallbacks] == \
        [("main", 0, "fuseops")]
    assert plan.blocks[0].source == "fuseops"
    assert "measured" not in plan.table()


def test_the_band_picks_close_decisions():
    class Block:
        def __init__(self, kept, other):
            self.alternative = "search"
            self.predicted_time_s, self.alternative_time_s = kept, other

    class Plan:
        blocks = [Block(0.131, 0.152), Block(0.10, 0.20), Block(0.1, None)]

    Plan.blocks[2].alternative = None
    assert verify.uncertain_blocks(Plan()) == [Plan.blocks[0]]
    assert verify.uncertain_blocks(Plan(), band=0.6) == Plan.blocks[:2]


@pytest.mark.parametrize("kwargs", [{"verify": "fast"}, {"verify": True},
                                    {"verify": "measure", "fusion": "fuseops"}])
def test_bad_verify_raises_our_error(kwargs):
    with pytest.raises(UserInputError, match="verify"):
        fusion_tvm.compile(str(MODEL), hw=HW, **kwargs)


def test_cli_rejects_a_bad_verify_mode(tmp_path, capsys):
    code = cli_main(["compile", str(MODEL), "-o", str(tmp_path / "m.so"), "--verify", "fast"])
    assert code == 2
    assert "verify='fast'" in capsys.readouterr().err
