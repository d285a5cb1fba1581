"""The plan report: labels, boundaries, layout, text, and the HTML page (in headless Chromium)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

from fusion_tvm.cli import Progress, search_plan
from fusion_tvm.frontend import load_model
from fusion_tvm.plan import FusionPlan
from fusion_tvm.report import (
    _layout_block,
    boundaries,
    explain_ops,
    kernel_groups,
    op_labels,
    render_html,
    render_text,
)
from fusion_tvm.testing.browser import Chromium, find_chromium

EXAMPLE = Path(__file__).resolve().parents[1] / "fusion_tvm" / "examples" / "detection_head.onnx"
NEEDS_CHROMIUM = pytest.mark.skipif(
    find_chromium() is None, reason="no chromium binary on PATH (apt-get install chromium): "
    "the report is not opened in a browser")


@pytest.fixture(scope="module")
def plan():
    loaded = load_model(str(EXAMPLE))
    return search_plan(loaded, "llvm", "ci-x86-avx2", {}, Progress(quiet=True))


def test_labels_are_unique(plan):
    labels = op_labels(plan)
    assert len(set(labels.values())) == len(labels)
    nodes = sum(len(b.graph.nodes) for b in plan.blocks)
    assert len(labels) == nodes


def test_kernel_groups_match_plan_groups(plan):
    kg = kernel_groups(plan)
    assert len(kg) == len(plan.groups) == plan.num_kernels
    for (_, ids), gp in zip(kg, plan.groups, strict=True):
        assert sorted(ids) == gp.node_ids


def test_every_boundary_is_explained(plan):
    bounds = boundaries(plan)
    assert bounds, "a model with several kernels has boundaries"
    labels = set(op_labels(plan).values())
    for b in bounds:
        assert b.reason
        assert b.producer in labels
        assert b.consumer == "" or b.consumer in labels
        assert b.consumer_group is None or b.consumer_group != b.group
    # every kernel but the model's last ones feeds another kernel: each has a boundary
    assert {b.group for b in bounds} == set(range(len(plan.groups)))


def test_ambiguous_names_are_resolved_and_reported(plan):
    names = [n.name for b in plan.blocks for n in b.graph.nodes if n.info is not None]
    dups = sorted({n for n in names if names.count(n) > 1})
    if not dups:
        pytest.skip("no duplicate binding names in this module")
    exp, notes = explain_ops(plan, dups[0], plan.groups[-1].prim_funcs[0])
    assert notes and dups[0] in notes[0]
    assert exp.reason


def test_explain_takes_kernel_rows_and_names(plan):
    """A kernel is named by its plan row (#k), its table name or its fused PrimFunc; its
    first op stands for it, so two kernels are explained like two of their ops."""
    from fusion_tvm.explain import explain

    by_ops = explain_ops(plan, "conv2d_nchwc1", "conv2d_nchwc2")[0]
    for a, b in (("#1", "#2"), (plan.groups[1].name, plan.groups[2].name)):
        exp = explain(plan, a, b)
        assert not exp.fused and exp.reason == by_ops.reason
        assert exp.group_a == by_ops.group_a and exp.group_b == by_ops.group_b
    assert explain(plan, "#1", plan.groups[1].ops[-1]).fused


def test_unknown_op_names_the_nearest_ones(plan):
    from fusion_tvm.errors import UserInputError

    with pytest.raises(UserInputError) as err:
        explain_ops(plan, "conv2d_nchwc99", "conv2d_nchwc1")
    msg = str(err.value)
    assert "no op named 'conv2d_nchwc99'" in msg and "did you mean" in msg
    assert "conv2d_nchwc9" in msg.split("did you mean")[1].split("?")[0]
    assert "#0 " + plan.groups[0].name in msg and "(#0)" in msg
    with pytest.raises(UserInputError, match="no op named '#99'"):
        explain_ops(plan, "#99", "#1")


def test_layout_boxes_do_not_overlap(plan):
    index = {key: k for k, key in enumerate(kernel_groups(plan))}
    boxes, pos, width, height = _layout_block(plan.blocks[0], 0, index, 0.0)
    assert width > 0 and height > 0
    for a, b in itertools.combinations(boxes, 2):
        apart = (a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y)
        assert apart, (a.key, b.key)
    for box in boxes:  # every op inside its own box
        for n in box.key[1]:
            x, y = pos[n]
            assert box.x <= x < box.x + box.w and box.y <= y < box.y + box.h


def test_modeled_bytes(plan):
    """Fusion keeps intermediates on chip: fewer bytes between kernels than one op a kernel,
    and our partition's traffic equals the sum of its kernels' external inputs and outputs."""
    ours, fuseops, unfused = (plan.modeled_bytes(p) for p in ("ours", "fuseops", "unfused"))
    assert 0 < ours["traffic"] < unfused["traffic"]
    assert 0 < fuseops["traffic"] < unfused["traffic"]
    assert all(0 <= b["dram"] <= b["traffic"] for b in (ours, fuseops, unfused))
    direct = 0.0
    for block in plan.blocks:
        for g in block.groups:
            if len(g) > 1 or block.graph.nodes[min(g)].info is not None and \
                    not block.graph.nodes[min(g)].is_view:
                d = plan.cost_model_obj.estimate(block.graph, g).detail
                direct += d["in_bytes"] + d["out_bytes"]
    assert ours["traffic"] == pytest.approx(direct)


def test_every_kernel_shows_its_memory_traffic(plan):
    """The detection head fits the last-level cache (0 B of DRAM in every kernel), so the
    table and the report show each kernel's traffic through memory next to it: the bytes the
    traffic model books for its inputs and outputs, summing to modeled_bytes()."""
    assert all(g.dram_bytes == 0 for g in plan.groups)
    assert all(g.traffic_bytes > 0 for g in plan.groups)
    assert sum(g.traffic_bytes for g in plan.groups) == \
        pytest.approx(plan.modeled_bytes("ours")["traffic"])
    rows = plan.table().splitlines()
    assert "mem KB" in rows[3] and "DRAM KB" in rows[3]
    for k, g in enumerate(plan.groups):
        assert f"{g.traffic_bytes / 1024:>9.1f} {0.0:>9.1f}" in rows[4 + k]
    page = render_html(plan, title="detection head")
    assert "<th>memory</th><th>DRAM</th>" in page and "memory traffic" in page
    assert page.count('"traffic": "0 B"') == 0


def test_text_report(plan):
    text = render_text(plan)
    assert plan.table() in text
    assert "kernel boundaries (why not fused):" in text
    assert re.search(r"#0\s+-> ", text)


def test_html_is_self_contained_and_draws_every_group(plan):
    page = render_html(plan, title="detection head")
    groups = re.findall(r'data-group="(\d+)"', page)
    assert sorted(map(int, groups)) == list(range(len(plan.groups)))
    # nothing to fetch: no external scripts, styles, images or fonts
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"\b(src|href)\s*=", page)
    assert not re.search(r"url\(", page)
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}
    assert "<svg" in page and "predicted speedup vs FuseOps" in page


def test_html_shows_the_model_signature_and_colours_a_slowdown(plan):
    import copy

    from fusion_tvm.api import TensorSpec

    ins = [TensorSpec("images", ("N", 3, 64, 64), "float32")]
    page = render_html(plan, title="head", inputs=ins, outputs=[{"name": "boxes"}])
    sig = page[page.index('id="signature"'):]
    assert "images" in sig and "float32[N, 3, 64, 64]" in sig and "boxes" in sig
    assert "any[?]" in sig  # an output of unknown shape says so
    assert 'id="signature"' not in render_html(plan)  # nothing to show, no empty card
    assert plan.predicted_speedup > 1 and '<tr class="speed">' in page
    slower = copy.copy(plan)
    slower.fuseops_time_s = plan.predicted_time_s / 2
    page = render_html(slower)
    assert '<tr class="speed slow">' in page and "tr.speed.slow td{color:#b42318}" in page


def test_html_graph_fits_the_window_by_default(plan):
    """The SVG is drawn at its own size but shown scaled to the card's width (class fit:
    max-width 100%, viewBox kept), with a 100% button to zoom back and pan by scrolling."""
    page = render_html(plan)
    svg = re.search(r"<svg [^>]*>", page).group(0)
    assert 'class="fit"' in svg and re.search(r'viewBox="0 0 \d+ \d+"', svg)
    assert "svg.fit{max-width:100%;height:auto}" in page
    assert 'data-zoom="fit"' in page and 'data-zoom="1"' in page


@pytest.fixture(scope="module")
def browser():
    with Chromium(timeout=120) as chromium:
        yield chromium


@NEEDS_CHROMIUM
def test_html_renders_in_chromium(plan, tmp_path, browser):
    page = tmp_path / "plan.html"
    page.write_text(render_html(plan, title="detection head"))
    tab = browser.open(page, 1280, 900)
    drawn = tab.evaluate("[].map.call(document.querySelectorAll('#graph g.group'), "
                         "function(g){return +g.getAttribute('data-group');})")
    assert sorted(drawn) == list(range(len(plan.groups)))
    # the script ran: it marks the body and filled the details panel for kernel 0
    assert tab.evaluate("document.body.getAttribute('data-ready')") == str(len(plan.groups))
    assert "why the boundary is here" in tab.evaluate("document.getElementById('details')"
                                                      ".innerText.toLowerCase()")
    assert tab.screenshot()[:8] == b"\x89PNG\r\n\x1a\n"


#: What a window shows of the report: every kernel box in "fit width" and in "100%" (the
#: report's zoom buttons) against the graph's view and its scroll area, the zoom buttons,
#: op names running out of their boxes, the model card, the speedup row's text and colour.
_MEASURE = r"""(function(){
  function box(e){var r=e.getBoundingClientRect();
    return {l:r.left, t:r.top, r:r.right, b:r.bottom};}
  var card=document.getElementById('graph-view'), svg=document.getElementById('graph');
  function measure(){
    return {card:box(card), scrollW:card.scrollWidth, scrollH:card.scrollHeight,
      clientW:card.clientWidth, clientH:card.clientHeight,
      scale:svg.getBoundingClientRect().width/svg.viewBox.baseVal.width,
      groups:[].map.call(svg.querySelectorAll('g.group'), function(g){
        return {k:+g.getAttribute('data-group'), box:box(g.querySelector('rect.box'))};})};}
  var out={vw:innerWidth, vh:innerHeight, docW:document.documentElement.scrollWidth,
    fit:measure()};
  document.querySelector('.zoom button[data-zoom="1"]').click();
  out.full=measure();
  card.scrollTop=card.scrollHeight; card.scrollLeft=card.scrollWidth;  // panned to the end
  out.zoomAfterPan=box(document.querySelector('.zoom'));
  card.scrollTop=0; card.scrollLeft=0;
  document.querySelector('.zoom button[data-zoom="fit"]').click();
  var sig=document.getElementById('signature');
  out.sig=sig ? {box:box(sig), text:sig.innerText} : null;
  out.spill=[].filter.call(svg.querySelectorAll('g.group text.opt, g.op text'),
    function(t){var r=t.parentNode.querySelector('rect').getBoundingClientRect();
      return t.getBoundingClientRect().right > r.right + 0.5;}).map(function(t){
      return t.textContent;});
  var speed=document.querySelector('tr.speed td:last-child');
  out.speed={text:speed.innerText, color:getComputedStyle(speed).color};
  return out;
})()"""


def _rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in re.findall(r"\d+", css)[:3])
    return r, g, b


@NEEDS_CHROMIUM
def test_report_in_a_1400x1000_window(plan, tmp_path, browser):
    """The HTML report of the bundled example, as ``fusion-tvm plan --html`` writes it,
    opened in a 1400x1000 viewport: every kernel box of the graph is in the window or
    reachable with the report's own zoom and pan (fit width: inside the graph view's width,
    reached by scrolling it; 100%: inside its scroll area; the zoom buttons stay in view),
    no op name runs out of its box, the model's inputs and outputs are in the first screen,
    and a predicted slowdown is red, a speedup green."""
    import copy

    from fusion_tvm.api import model_signature

    ins, outs = model_signature(load_model(str(EXAMPLE)))
    path = tmp_path / "report.html"
    path.write_text(render_html(plan, title="detection_head.onnx", inputs=ins, outputs=outs))
    found = browser.open(path, 1400, 1000).evaluate(_MEASURE)
    assert (found["vw"], found["vh"]) == (1400, 1000)
    assert found["docW"] <= found["vw"], "the page scrolls sideways"
    for mode in ("fit", "full"):
        m = found[mode]
        card = m["card"]
        assert card["l"] >= 0 and card["r"] <= found["vw"] and 0 <= card["t"] < found["vh"]
        assert sorted(g["k"] for g in m["groups"]) == list(range(len(plan.groups)))
        for g in m["groups"]:
            b = g["box"]
            # reachable: inside the card's scrollable content (the card is at scroll 0)
            assert b["l"] >= card["l"] - 1 and b["t"] >= card["t"] - 1, (mode, g)
            assert b["r"] <= card["l"] + m["scrollW"] + 1, (mode, g, m["scrollW"])
            assert b["b"] <= card["t"] + m["scrollH"] + 1, (mode, g, m["scrollH"])
            if mode == "fit":  # no sideways panning needed
                assert b["r"] <= card["l"] + m["clientW"] + 1, (g, m["clientW"])
    zoom = found["zoomAfterPan"]  # the zoom buttons stay in the window while panning
    assert 0 <= zoom["t"] and zoom["b"] <= found["vh"] and zoom["r"] <= found["vw"]
    assert 0.5 <= found["fit"]["scale"] <= 1.0 + 1e-6  # fitted, and still legible
    assert abs(found["full"]["scale"] - 1.0) < 1e-3
    sig = found["sig"]
    assert sig is not None and sig["box"]["b"] <= found["vh"] and sig["box"]["r"] <= 1400
    assert all(t.name in sig["text"] for t in (*ins, *outs))
    assert "float32[1, 3, 64, 64]" in sig["text"] and sig["text"].count("output") == len(outs)
    assert found["spill"] == []
    r, g, _ = _rgb(found["speed"]["color"])
    assert plan.predicted_speedup > 1 and g > 2 * r, found["speed"]  # a gain reads green

    slower = copy.copy(plan)
    slower.fuseops_time_s = plan.predicted_time_s / 2
    path.write_text(render_html(slower, inputs=ins, outputs=outs))
    slow = browser.open(path, 1400, 1000).evaluate(_MEASURE)
    assert slow["speed"]["text"].startswith("0.50x")
    r, g, _ = _rgb(slow["speed"]["color"])
    assert r > 2 * g, slow["speed"]  # a slowdown reads red, not as a gain

    # long op names (MobileNet's depthwise_conv2d_nchwc3) are cut to their box, not spilled
    longer = copy.copy(plan)
    longer.blocks = [dataclasses.replace(b, graph=dataclasses.replace(b.graph, nodes=[
        dataclasses.replace(n, func_name=n.func_name and "depthwise_conv2d_nchwc" + n.func_name)
        for n in b.graph.nodes])) for b in plan.blocks]
    path.write_text(render_html(longer))
    assert browser.open(path, 1400, 1000).evaluate(_MEASURE)["spill"] == []


# ------------------------------------------------------------- synthetic multi-block plans
def _synthetic_plan(seeds=(1, 2), nodes=14) -> FusionPlan:
    from fusion_tvm.plan import BlockPlan, group_plan, is_kernel
    from fusion_tvm.search import SearchConfig, search_partition
    from fusion_tvm.testing.synthetic import TableCostModel, random_dag

    model = TableCostModel(seed=3)
    plan = FusionPlan(target="llvm", hardware="ci-x86-avx2", cost_model="table",
                      cost_model_obj=model)
    for bi, seed in enumerate(seeds):
        graph = random_dag(nodes, seed)
        groups = search_partition(graph, model, SearchConfig())
        plan.blocks.append(BlockPlan(f"f{bi}", 0, groups, None, graph))
        for g in groups:
            if is_kernel(graph, g):
                name = "+".join(graph.nodes[i].func_name for i in sorted(g))
                plan.groups.append(group_plan(graph, g, model, f"f{bi}", name))
    plan.num_kernels = len(plan.groups)
    return plan


def test_synthetic_two_blocks():
    plan = _synthetic_plan()
    labels = op_labels(plan)
    assert len(set(labels.values())) == len(labels)
    assert labels[(1, 0)] == "n0#1.0"  # the same binding name in both blocks
    page = render_html(plan, title="synthetic")
    drawn = re.findall(r'data-group="(\d+)"', page)
    assert sorted(map(int, drawn)) == list(range(len(plan.groups)))
    assert "f1 block 0" in page
    text = render_text(plan)
    assert "kernel boundaries" in text
    exp, notes = explain_ops(plan, "n0", "n3#1.3")
    assert notes and "n0#0.0" in notes[0]
    assert exp.reason


def test_modeled_traffic_of_staged_kernels_counts_every_weight():
    """A staged chain (the MLP: its matmuls as one kernel) and a matmul with a staged norm
    move every weight they read: the modeled traffic is at least the model's parameters
    (it once counted only the last stage's, 0.01 MB of the MLP's 2.1 MB); embedding tables,
    of which a lookup reads a few rows, are left out."""
    import numpy as np
    from onnx import numpy_helper

    from benchmarks.zoo import get_model

    for name in ("mlp", "bert_2l"):
        model = get_model(name, small=True)
        gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
        params = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer
                     if np.issubdtype(numpy_helper.to_array(t).dtype, np.floating)
                     and t.name not in gathered)
        p = search_plan(load_model(model), "llvm", "ci-x86-avx2", {}, Progress(quiet=True))
        rules = {p.cost_model_obj.estimate(b.graph, g).reason for b in p.blocks
                 for g in b.groups}
        assert any("staged" in r for r in rules), (name, rules)
        assert p.modeled_bytes("ours")["traffic"] >= params, name
