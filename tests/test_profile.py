"""``CompiledModel.profile()`` and ``fusion-tvm profile``: every kernel of one run, timed and
set against the plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import fusion_tvm
from fusion_tvm.cli import main
from fusion_tvm.errors import InputMismatchError, UserInputError
from fusion_tvm.profile import ModelProfile
from fusion_tvm.report import render_html

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fusion_tvm" / "examples" / "detection_head.onnx"
HW = "ci-x86-avx2"


@pytest.fixture(scope="module")
def head():
    return fusion_tvm.compile(str(EXAMPLE), hw=HW)


@pytest.fixture(scope="module")
def prof(head):
    return head.profile(repeat=3, model=EXAMPLE.name)


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks import zoo

    path = tmp_path_factory.mktemp("models") / "mlp.onnx"
    onnx.save(zoo.get_model("mlp", small=True, dynamic=True), path)
    return path


def test_every_kernel_of_the_run_is_profiled(head, prof):
    assert prof.num_kernels == head.num_kernels == len(prof.kernels) == 13
    assert sorted(k.kernel for k in prof.kernels) == sorted(head.kernel_calls())
    plan = head.plan
    for k in prof.kernels:
        assert k.measured_s > 0
        assert k.predicted_s is not None and k.predicted_s > 0
        group = plan.groups[k.group]
        assert group.kernel == k.kernel  # matched to its own plan group
        assert k.rule and k.rule == group.scheduled_rule
        assert k.predicted_s == group.predicted_time_s and k.flops == group.flops
        assert k.gflops == pytest.approx(k.flops / k.measured_s / 1e9)
        assert k.traffic_bytes > 0 and k.gbps > 0
        # the roofline is a lower bound of the plan's own prediction (which adds launch,
        # efficiency and parallel regions to it)
        assert 0 < k.roofline_s < k.predicted_s
        assert k.roofline_share == pytest.approx(k.roofline_s / k.measured_s)
    assert sorted({k.group for k in prof.kernels}) == list(range(len(plan.groups)))


def test_rows_are_slowest_first_and_total_adds_up(prof):
    times = [k.measured_s for k in prof.kernels]
    assert times == sorted(times, reverse=True)
    assert prof.kernel_sum_s == pytest.approx(sum(times))
    assert prof.overhead_s == pytest.approx(prof.run_s - prof.kernel_sum_s)
    # each kernel's time alone is part of the whole run (slack: a shared, noisy machine)
    assert 0 < prof.kernel_sum_s <= 1.5 * prof.run_s
    assert prof.predicted_s == pytest.approx(sum(k.predicted_s for k in prof.kernels))


def test_table_lists_every_kernel_and_the_total(prof):
    text = prof.table()
    body = [line for line in text.splitlines() if line[:4].strip().isdigit()]
    assert len(body) == len(prof.kernels)
    assert [int(line.split()[0]) for line in body] == [k.index for k in prof.kernels]
    total = text.splitlines()[-1]
    assert total.startswith("total: 13 kernels") and "whole run" in total
    assert "VM / launch overhead" in total


def test_json_round_trips(prof):
    data = json.loads(json.dumps(prof.to_json()))
    assert ModelProfile.from_json(data) == prof
    assert data["num_kernels"] == 13
    row = data["kernels"][0]
    assert {"measured_s", "predicted_s", "rule", "gflops", "gbps", "roofline_share"} <= set(row)


def test_html_report_has_the_profile(head, prof):
    page = render_html(head.plan, title="head", profile=prof)
    assert 'id="profile"' in page and "measured profile (13 kernels" in page
    for k in prof.kernels:
        assert f"<td class='mono'>{k.kernel}</td>" in page
    assert 'id="profile"' not in render_html(head.plan, title="head")


def test_feeds_at_other_dims_reprice_the_plan(mlp_path):
    cm = fusion_tvm.compile(str(mlp_path), hw=HW)
    (name,) = cm.input_names
    at_plan = cm.profile(repeat=1)
    assert at_plan.dims == cm.plan.dims == {"N": 1}
    x = np.random.default_rng(0).standard_normal((4, 64)).astype("float32")
    at_4 = cm.profile({name: x}, repeat=1)
    assert at_4.dims == {"N": 4} and at_4.num_kernels == cm.num_kernels
    assert any("evaluated again at the run's dims" in n for n in at_4.notes)
    # the work of an MLP grows with the batch: priced at the run's batch, not the plan's
    by_kernel = {k.kernel: k for k in at_plan.kernels}
    for k in at_4.kernels:
        assert k.flops == pytest.approx(4 * by_kernel[k.kernel].flops, rel=0.01)
    with pytest.raises(InputMismatchError):
        cm.profile({name: x[:, :3]})
    with pytest.raises(UserInputError):
        cm.profile(repeat=0)


def test_cli_profile_writes_json_and_html(mlp_path, tmp_path, capsys):
    out_json, out_html = tmp_path / "p.json", tmp_path / "p.html"
    rc = main(["profile", str(mlp_path), "--hw", HW, "--repeat", "2", "-q",
               "--json", str(out_json), "--html", str(out_html)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out_json.read_text())
    assert data["num_kernels"] == len(data["kernels"]) >= 1
    assert data["model"] == "mlp.onnx" and data["run_s"] > 0
    assert "measured profile" in out_html.read_text()
    assert "total:" in printed and f"json: {out_json}" in printed
    # --json alone: the JSON on stdout instead of the table
    assert main(["profile", str(mlp_path), "--hw", HW, "--repeat", "1", "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_kernels"] == data["num_kernels"]


def test_cli_profile_refuses_other_targets(mlp_path, capsys):
    assert main(["profile", str(mlp_path), "--target", "cuda", "-q"]) == 2
    assert "llvm" in capsys.readouterr().err
