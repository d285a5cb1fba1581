"""Render a :class:`~fusion_tvm.plan.FusionPlan` for people: text, and one self-contained HTML.

>>> from fusion_tvm.report import render_html, render_text
>>> Path("plan.html").write_text(render_html(cm.plan, title="resnet18"))

The HTML needs no network: the graph is inline SVG laid out here (kernels in topological
layers left to right, the ops of a kernel top to bottom inside its box), the details come from
an embedded JSON blob, and a few lines of script show them on click. Every kernel box carries
``data-group="<index in plan.groups>"``.

Binding names are not unique in every module (two ``lv5`` in one block), so ops are labelled
``name#id`` where needed; :func:`explain_ops` accepts those labels as well as plain names.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections import defaultdict
from dataclasses import dataclass

from .explain import Explanation, explain
from .plan import BlockPlan, FusionPlan, is_kernel, short_names
from .profile import ModelProfile

# ------------------------------------------------------------------------------- op labels
_VIEW_ATTR = "_report_unique_view"  # cached on the plan: the view's graphs must outlive it


def op_labels(plan: FusionPlan) -> dict[tuple[int, int], str]:
    """``(block index, node id) -> label``: the binding name, ``name#id`` where ambiguous."""
    count: dict[str, int] = defaultdict(int)
    for block in plan.blocks:
        for node in block.graph.nodes:
            count[node.name] += 1
    many = len(plan.blocks) > 1
    labels = {}
    for bi, block in enumerate(plan.blocks):
        for node in block.graph.nodes:
            if count[node.name] == 1:
                labels[(bi, node.id)] = node.name
            else:
                labels[(bi, node.id)] = f"{node.name}#{bi}.{node.id}" if many \
                    else f"{node.name}#{node.id}"
    return labels


def unique_view(plan: FusionPlan) -> FusionPlan:
    """The plan with every op renamed to its unique label, so that :func:`explain` resolves
    names to exactly one op. Graphs are shallow copies; the view is cached on the plan (cost
    models cache by graph identity, so the copies must live as long as the plan)."""
    cached = getattr(plan, _VIEW_ATTR, None)
    if cached is not None:
        return cached
    labels = op_labels(plan)
    blocks = []
    for bi, block in enumerate(plan.blocks):
        g = block.graph
        nodes = [dataclasses.replace(n, name=labels[(bi, n.id)]) for n in g.nodes]
        graph = dataclasses.replace(g, nodes=nodes, succs=g.succs, preds=g.preds)
        blocks.append(dataclasses.replace(block, graph=graph))
    view = dataclasses.replace(plan, blocks=blocks)
    setattr(plan, _VIEW_ATTR, view)
    return view


def explain_ops(plan: FusionPlan, op_a: str, op_b: str) -> tuple[Explanation, list[str]]:
    """:func:`~fusion_tvm.explain.explain` with ambiguous names resolved (and reported).

    Returns the explanation (ops named by their unique labels) and notes on any name that
    matched several ops (the first, in binding order, is used; for an ONNX node computed by
    several ops, the last, which produces its output).
    """
    view = unique_view(plan)
    labels = op_labels(plan)
    notes = []

    def resolve(name: str) -> str:
        if name in labels.values():
            return name
        if not any(n.name == name for b in plan.blocks for n in b.graph.nodes):
            ops = [(bi, n) for bi, b in enumerate(plan.blocks) for n in b.graph.nodes
                   if n.info is not None and name in n.origins]
            if ops:  # an ONNX node: the op producing its output stands for it
                bi, n = ops[-1]
                if len(ops) > 1:
                    alts = ", ".join(labels[(b, m.id)] for b, m in ops[:8])
                    notes.append(f"ONNX node '{name}' is computed by {len(ops)} ops: {alts}; "
                                 f"using {labels[(bi, n.id)]}, which produces its output")
                return labels[(bi, n.id)]
        for attr in ("name", "func_name"):
            hits = [(bi, n) for bi, b in enumerate(plan.blocks) for n in b.graph.nodes
                    if getattr(n, attr) == name and (attr == "name" or n.info is not None)]
            if hits:
                if len(hits) > 1:
                    alts = ", ".join(f"{labels[(bi, n.id)]} ({n.func_name or 'barrier'})"
                                     for bi, n in hits[:8])
                    notes.append(f"'{name}' names {len(hits)} ops: {alts}; using the first "
                                 "(name one with its label to choose)")
                bi, n = hits[0]
                return labels[(bi, n.id)]
        return name  # a kernel's name or row, resolved by explain(); else its user error

    label_a, label_b = resolve(op_a), resolve(op_b)
    exp = explain(view, label_a, label_b)
    # say it in the user's words, with the op each name resolved to
    named_a = op_a if op_a == label_a else f"{op_a} ({label_a})"
    named_b = op_b if op_b == label_b else f"{op_b} ({label_b})"
    return dataclasses.replace(exp, op_a=named_a, op_b=named_b), notes


# ---------------------------------------------------------------------------- plan model
@dataclass
class Boundary:
    """Why a kernel's output goes through memory to another kernel (or leaves the block)."""

    group: int  # index in plan.groups
    producer: str  # op label
    consumer: str  # op label, '' when the value leaves the block
    consumer_group: int | None  # index in plan.groups; None for barriers / outputs
    reason: str
    separate_s: float | None = None
    merged_s: float | None = None
    producer_onnx: tuple[str, ...] = ()  # ONNX node(s) the producer op computes
    consumer_onnx: tuple[str, ...] = ()


def kernel_groups(plan: FusionPlan) -> list[tuple[int, frozenset[int]]]:
    """``(block index, node ids)`` for each entry of ``plan.groups``, in the same order."""
    out = []
    for bi, block in enumerate(plan.blocks):
        out.extend((bi, g) for g in block.groups if is_kernel(block.graph, g))
    if len(out) != len(plan.groups):  # fall back to the ids the plan records
        out = []
        for gp in plan.groups:
            bi = next((i for i, b in enumerate(plan.blocks) if b.function == gp.function), 0)
            out.append((bi, frozenset(gp.node_ids)))
    return out


def _partition(block: BlockPlan) -> list[frozenset[int]]:
    """The block's groups, completed with singletons for any node left out."""
    groups = list(block.groups)
    covered = set().union(*groups) if groups else set()
    groups += [frozenset([n.id]) for n in block.graph.nodes if n.id not in covered]
    return groups


def boundaries(plan: FusionPlan) -> list[Boundary]:
    """For each kernel and each kernel (or barrier) consuming its output: why not fused.

    The pair explained is the kernel's last op feeding that consumer and the consumer's first
    op reading it.
    """
    labels = op_labels(plan)
    view = unique_view(plan)
    index = {key: k for k, key in enumerate(kernel_groups(plan))}
    out: list[Boundary] = []
    for bi, block in enumerate(plan.blocks):
        graph = block.graph
        part = _partition(block)
        group_of = {i: g for g in part for i in g}
        for g in part:
            k = index.get((bi, g))
            if k is None:
                continue
            pairs: dict[frozenset[int], tuple[int, int]] = {}
            for n in sorted(g):
                for s in sorted(graph.succs[n]):
                    h = group_of.get(s)
                    if h is None or h == g:
                        continue
                    prev = pairs.get(h)
                    if prev is None or n > prev[0] or (n == prev[0] and s < prev[1]):
                        pairs[h] = (n, s)
            for h, (n, s) in sorted(pairs.items(), key=lambda kv: kv[1]):
                exp = explain(view, labels[(bi, n)], labels[(bi, s)])
                out.append(Boundary(k, labels[(bi, n)], labels[(bi, s)], index.get((bi, h)),
                                    exp.reason, exp.separate_s, exp.merged_s,
                                    tuple(graph.nodes[n].origins),
                                    tuple(graph.nodes[s].origins)))
            escaping = [n for n in sorted(g) for t in graph.nodes[n].outputs
                        if graph.tensors[t].escapes]
            if escaping and not pairs:
                out.append(Boundary(k, labels[(bi, escaping[-1])], "", None,
                                    "its result leaves the dataflow block (a model output or "
                                    "a value used after the block)",
                                    producer_onnx=tuple(graph.nodes[escaping[-1]].origins)))
    return out


def _dim(d) -> str:
    try:
        return str(int(d))
    except (TypeError, ValueError):
        return str(d)


def _shape(graph, node) -> str:
    parts = []
    for t in node.outputs:
        ti = graph.tensors[t]
        if ti.shape or ti.dtype:
            parts.append(f"({', '.join(_dim(d) for d in ti.shape)}) {ti.dtype}".strip())
    return "; ".join(parts)


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


# ------------------------------------------------------------------------------------ text
def render_text(plan: FusionPlan, max_boundaries: int = 200) -> str:
    """The plan table followed by why each kernel boundary is there."""
    lines = [plan.table(), "", "kernel boundaries (why not fused):"]
    bounds = boundaries(plan)
    for b in bounds[:max_boundaries]:
        to = f"#{b.consumer_group}" if b.consumer_group is not None else "-"
        pair = f"{b.producer} -> {b.consumer}" if b.consumer else b.producer
        if b.producer_onnx or b.consumer_onnx:
            sides = [b.producer_onnx, b.consumer_onnx] if b.consumer else [b.producer_onnx]
            pair += f" (ONNX {' -> '.join(short_names(list(x)) or '-' for x in sides)})"
        lines.append(f"  #{b.group:<3} -> {to:<4} {pair}: {b.reason}")
    if len(bounds) > max_boundaries:
        lines.append(f"  ... {len(bounds) - max_boundaries} more")
    if not bounds:
        lines.append("  none")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- layout
NODE_W, NODE_H, ROW_H = 140, 22, 28
PAD, HEAD_H, COL_GAP, BOX_GAP, BAND_GAP = 10, 34, 56, 24, 44
MAX_BAND_W = 1120  # long chains of kernels wrap into bands, read like lines of text


def group_color(k: int) -> str:
    """A distinct hue per kernel (golden-angle spacing)."""
    return f"hsl({(k * 137.508) % 360:.0f}, 62%, 46%)"


@dataclass
class _Box:
    key: tuple[int, frozenset[int]]
    kernel: int | None
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0
    band_top: float = 0.0


def _layout_block(block: BlockPlan, bi: int, index: dict, y0: float):
    """Place the groups of one block: layers of the group DAG left to right, the ops of a
    group top to bottom by their depth inside it. Returns boxes, node positions and height."""
    graph = block.graph
    part = _partition(block)
    group_of = {i: gi for gi, g in enumerate(part) for i in g}
    gpreds: list[set[int]] = [set() for _ in part]
    for gi, g in enumerate(part):
        for n in g:
            gpreds[gi].update(group_of[p] for p in graph.preds[n] if group_of[p] != gi)
    order = sorted(range(len(part)), key=lambda gi: min(part[gi]))
    layer = [0] * len(part)
    done: set[int] = set()
    pending = list(order)
    while pending:  # longest-path layering (the group DAG is acyclic: legality checks it)
        rest = []
        for gi in pending:
            if gpreds[gi] <= done:
                layer[gi] = max((layer[p] + 1 for p in gpreds[gi]), default=0)
            else:
                rest.append(gi)
        if len(rest) == len(pending):  # defensive: never loop on a cyclic quotient
            for gi in rest:
                layer[gi] = max((layer[p] + 1 for p in gpreds[gi] if p in done), default=0)
            rest = []
        done.update(gi for gi in pending if gi not in rest)
        pending = rest

    # sources (views of parameters, constants) sit just before their first consumer
    gsuccs: list[set[int]] = [set() for _ in part]
    for gi, ps in enumerate(gpreds):
        for p in ps:
            gsuccs[p].add(gi)
    for gi in order:
        if not gpreds[gi] and gsuccs[gi]:
            layer[gi] = max(0, min(layer[s] for s in gsuccs[gi]) - 1)

    boxes: list[_Box] = []
    local: dict[int, tuple[int, int]] = {}  # node -> (row, column) inside its box
    for g in part:
        depth: dict[int, int] = {}
        for n in sorted(g):
            depth[n] = max((depth[p] + 1 for p in graph.preds[n] if p in g), default=0)
        cols: dict[int, int] = defaultdict(int)
        for n in sorted(g):
            local[n] = (depth[n], cols[depth[n]])
            cols[depth[n]] += 1
        rows = max(depth.values()) + 1
        width = max(cols.values())
        kernel = index.get((bi, g))
        head = HEAD_H if kernel is not None else 0
        boxes.append(_Box((bi, g), kernel, w=width * (NODE_W + 8) - 8 + 2 * PAD,
                          h=head + rows * ROW_H - (ROW_H - NODE_H) + 2 * PAD))

    by_layer: dict[int, list[int]] = defaultdict(list)
    for gi in order:
        by_layer[layer[gi]].append(gi)
    x, band_top, band_bottom = PAD, y0, y0
    rank: dict[int, float] = {}
    for lay in sorted(by_layer):
        members = by_layer[lay]
        col_w = max(boxes[gi].w for gi in members)
        if x > PAD and x + col_w > MAX_BAND_W:  # wrap into a new band below
            x, band_top = PAD, band_bottom + BAND_GAP
        # barycentre of the predecessors' ranks keeps producer -> consumer edges short
        members.sort(key=lambda gi: (
            sum(rank[p] for p in gpreds[gi]) / len(gpreds[gi]) if gpreds[gi] else -1.0,
            min(part[gi])))
        y = band_top
        for r, gi in enumerate(members):
            box = boxes[gi]
            box.x, box.y, box.band_top = x, y, band_top
            rank[gi] = r
            y += box.h + BOX_GAP
        band_bottom = max(band_bottom, y - BOX_GAP)
        x += col_w + COL_GAP
    pos = {}
    for gi, g in enumerate(part):
        box = boxes[gi]
        head = HEAD_H if box.kernel is not None else 0
        for n in g:
            row, col = local[n]
            pos[n] = (box.x + PAD + col * (NODE_W + 8), box.y + PAD + head + row * ROW_H)
    height = max((b.y + b.h for b in boxes), default=y0) - y0
    width = max((b.x + b.w for b in boxes), default=0)
    return boxes, pos, width, height


def _route(a, b, src: _Box, dst: _Box) -> str:
    """A producer -> consumer curve; across bands it runs right, down the column gap, along
    the gap above the consumer's band, and in from the left."""
    if dst.band_top <= src.band_top:
        mx = (a[0] + b[0]) / 2
        return f"M{a[0]:.0f},{a[1]:.0f} C{mx:.0f},{a[1]:.0f} {mx:.0f},{b[1]:.0f} " \
               f"{b[0]:.0f},{b[1]:.0f}"
    out_x = src.x + src.w + COL_GAP / 2
    in_x = dst.x - (COL_GAP / 3 if dst.x > COL_GAP else dst.x / 2)
    gap_y = dst.band_top - BAND_GAP / 2
    r = 8
    return (f"M{a[0]:.0f},{a[1]:.0f} H{out_x - r:.0f} Q{out_x:.0f},{a[1]:.0f} {out_x:.0f},"
            f"{a[1] + r:.0f} V{gap_y - r:.0f} Q{out_x:.0f},{gap_y:.0f} {out_x - r:.0f},"
            f"{gap_y:.0f} H{in_x + r:.0f} Q{in_x:.0f},{gap_y:.0f} {in_x:.0f},{gap_y + r:.0f} "
            f"V{b[1] - r:.0f} Q{in_x:.0f},{b[1]:.0f} {b[0]:.0f},{b[1]:.0f}")


#: Characters of an op's name that fit its box (11.5 px monospace, ~6.9 px a character).
OP_CHARS = 18


def _fit(text: str, chars: int = OP_CHARS) -> str:
    """``text`` cut to ``chars`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= chars else text[:chars - 1] + "…"


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _svg(plan: FusionPlan) -> tuple[str, float, float]:
    labels = op_labels(plan)
    index = {key: k for k, key in enumerate(kernel_groups(plan))}
    parts: list[str] = []
    y0, width = PAD, 0.0
    for bi, block in enumerate(plan.blocks):
        graph = block.graph
        if len(plan.blocks) > 1:
            parts.append(f'<text class="blk" x="{PAD}" y="{y0 + 14}">{_esc(block.function)} '
                         f'block {block.block_index}</text>')
            y0 += 24
        boxes, pos, w, h = _layout_block(block, bi, index, y0)
        width = max(width, w)
        group_of = {n: b for b in boxes for n in b.key[1]}
        edges = []
        for n in graph.nodes:
            for s in sorted(graph.succs[n.id]):
                if n.id not in pos or s not in pos:
                    continue
                (x1, y1), (x2, y2) = pos[n.id], pos[s]
                inner = group_of[n.id] is group_of[s]
                if inner:  # down the kernel box
                    a = (x1 + NODE_W / 2, y1 + NODE_H)
                    b = (x2 + NODE_W / 2, y2)
                    d = f"M{a[0]:.0f},{a[1]:.0f} L{b[0]:.0f},{b[1]:.0f}"
                    cls = "e in"
                else:  # through memory, to the right (or down into the next band)
                    a = (x1 + NODE_W, y1 + NODE_H / 2)
                    b = (x2, y2 + NODE_H / 2)
                    d = _route(a, b, group_of[n.id], group_of[s])
                    cls = "e out"
                src = group_of[n.id].kernel
                dst = group_of[s].kernel
                edges.append(f'<path class="{cls}" data-from="{src if src is not None else ""}" '
                             f'data-to="{dst if dst is not None else ""}" d="{d}"/>')
        parts.append('<g class="edges">' + "".join(edges) + "</g>")
        for box in boxes:
            nodes = sorted(box.key[1])
            if box.kernel is None:
                for n in nodes:
                    node = graph.nodes[n]
                    x, y = pos[n]
                    kind = "view" if node.is_view else "barrier"
                    parts.append(
                        f'<g class="op {kind}" data-barrier="{_esc(labels[(bi, n)])}">'
                        f"<title>{_esc(labels[(bi, n)])}: {kind}"
                        f"{' ' + _esc(node.func_name) if node.func_name else ''} "
                        f"{_esc(_shape(graph, node))}</title>"
                        f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" '
                        f'rx="4"/><text x="{x + 8:.0f}" y="{y + 15:.0f}">'
                        f"{_esc(_fit(f'{labels[(bi, n)]} · {kind}'))}</text></g>")
                continue
            k = box.kernel
            gp = plan.groups[k]
            color = group_color(k)
            tip = (f"kernel #{k}: {gp.name}\n{len(gp.ops)} ops, rule {gp.display_rule}, "
                   f"{_fmt_time(gp.predicted_time_s)}, memory {_fmt_bytes(gp.traffic_bytes)} "
                   f"(DRAM {_fmt_bytes(gp.dram_bytes)})\n"
                   f"{gp.bound}"
                   + (f"\nONNX nodes: {' '.join(gp.onnx_names)}" if gp.onnx_names else ""))
            out = [f'<g class="group" data-group="{k}" tabindex="0" style="--c:{color}">',
                   f"<title>{_esc(tip)}</title>",
                   f'<rect class="box" x="{box.x:.0f}" y="{box.y:.0f}" width="{box.w:.0f}" '
                   f'height="{box.h:.0f}" rx="8"/>',
                   f'<text class="gh" x="{box.x + PAD:.0f}" y="{box.y + 17:.0f}">#{k} '
                   f"{_esc(gp.display_rule or gp.kind)}</text>",
                   f'<text class="gt" x="{box.x + PAD:.0f}" y="{box.y + 30:.0f}">'
                   f"{_esc(_fmt_time(gp.predicted_time_s))} · {len(gp.ops)} ops</text>"]
            for n in nodes:
                node = graph.nodes[n]
                x, y = pos[n]
                name = node.func_name or node.name
                onnx = f"\nONNX: {', '.join(node.origins) or 'none'}" if plan.has_onnx_names \
                    else ""
                out.append(f'<g class="op-in"><title>{_esc(labels[(bi, n)])} = '
                           f'{_esc(name)}{_esc(onnx)}</title>'
                           f'<rect class="opn" x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" '
                           f'height="{NODE_H}" rx="4"/><text class="opt" x="{x + 8:.0f}" '
                           f'y="{y + 15:.0f}">{_esc(_fit(name))}</text></g>')
            out.append("</g>")
            parts.append("".join(out))
        y0 += h + 3 * PAD
    return "".join(parts), width + COL_GAP, y0


# ------------------------------------------------------------------------------------ html
def _group_details(plan: FusionPlan) -> list[dict]:
    labels = op_labels(plan)
    bounds: dict[int, list[dict]] = defaultdict(list)
    for b in boundaries(plan):
        bounds[b.group].append(dataclasses.asdict(b))
    details = []
    for k, (bi, g) in enumerate(kernel_groups(plan)):
        graph = plan.blocks[bi].graph
        gp = plan.groups[k]
        ops = [{"label": labels[(bi, n)], "func": graph.nodes[n].func_name,
                "pattern": graph.nodes[n].pattern.name.lower(),
                "shape": _shape(graph, graph.nodes[n]),
                "onnx": list(graph.nodes[n].origins)} for n in sorted(g)]
        details.append({
            "index": k, "name": gp.name, "function": gp.function, "kind": gp.kind,
            "fuseops": _fuseops_note(plan.blocks[bi], g, labels, bi),
            "rule": gp.display_rule, "bound": gp.bound, "time": _fmt_time(gp.predicted_time_s),
            "dram": _fmt_bytes(gp.dram_bytes), "traffic": _fmt_bytes(gp.traffic_bytes),
            "onchip": _fmt_bytes(gp.onchip_bytes),
            "gflop": gp.flops / 1e9, "color": group_color(k), "ops": ops,
            "onnx": gp.onnx_names,
            "boundaries": bounds.get(k, []),
        })
    return details


def _fuseops_note(block: BlockPlan, group: frozenset[int], labels, bi: int) -> str:
    """How FuseOps partitions the same ops (for comparison)."""
    if not block.fuseops_groups:
        return ""
    graph = block.graph
    hits = [h for h in block.fuseops_groups if h & group and is_kernel(graph, h)]
    same = len(hits) == 1 and hits[0] == group
    if same:
        return "FuseOps builds the same kernel"
    extra = sorted(set().union(*hits) - group) if hits else []
    text = f"FuseOps splits these ops over {len(hits)} kernels" if len(hits) != 1 \
        else "FuseOps puts these ops in one kernel"
    if extra:
        names = ", ".join(labels[(bi, n)] for n in extra[:6])
        holds = "which also holds" if len(hits) == 1 else "which also hold"
        text += f" ({holds} {names}{' ...' if len(extra) > 6 else ''})"
    return text


def _summary_rows(plan: FusionPlan) -> str:
    fo_k = plan.fuseops_kernels if plan.fuseops_kernels is not None else "-"
    speed = f"{plan.predicted_speedup:.2f}x" if plan.predicted_speedup else "-"
    rows = [
        ("", "unfused", "FuseOps", "ours"),
        ("kernels", plan.unfused_kernels, fo_k, plan.num_kernels),
        ("predicted time", _fmt_time(plan.unfused_time_s), _fmt_time(plan.fuseops_time_s),
         _fmt_time(plan.predicted_time_s)),
    ]
    head = "".join(f"<th>{_esc(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>"
                   for r in rows[1:])
    # a predicted slowdown reads as one: red, not the bold green of a speedup
    slow = " slow" if plan.predicted_speedup and plan.predicted_speedup < 1 else ""
    body += (f'<tr class="speed{slow}"><td colspan="3">predicted speedup vs FuseOps</td>'
             f"<td>{_esc(speed)}</td></tr>")
    return f"<table class='summary'><tr>{head}</tr>{body}</table>"


def _groups_table(plan: FusionPlan) -> str:
    onnx = plan.has_onnx_names
    rows = ["<tr><th>#</th><th>kernel</th><th>ops</th><th>rule</th><th>predicted</th>"
            "<th>memory</th><th>DRAM</th><th>bound</th>"
            + ("<th>ONNX nodes</th>" if onnx else "") + "</tr>"]
    for k, g in enumerate(plan.groups):
        names = (f"<td class='mono'>{_esc(' '.join(g.onnx_names) or '-')}</td>"
                 if onnx else "")
        rows.append(
            f'<tr data-row="{k}"><td><span class="sw" style="background:{group_color(k)}">'
            f"</span>{k}</td><td class='mono'>{_esc(g.name)}</td><td>{len(g.ops)}</td>"
            f"<td>{_esc(g.display_rule)}</td><td>{_esc(_fmt_time(g.predicted_time_s))}</td>"
            f"<td>{_esc(_fmt_bytes(g.traffic_bytes))}</td>"
            f"<td>{_esc(_fmt_bytes(g.dram_bytes))}</td><td>{_esc(g.bound)}</td>{names}</tr>")
    return "<table class='groups'>" + "".join(rows) + "</table>"


def _profile_table(profile: ModelProfile) -> str:
    """The measured profile: one row per kernel, slowest first (a row opens its plan
    group's details), and the total."""
    def num(v, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    rows = ["<tr><th>#</th><th>kernel</th><th>rule</th><th>measured</th><th>of run</th>"
            "<th>predicted</th><th>pred / meas</th><th>GFLOP/s</th><th>GB/s</th>"
            "<th>roofline</th></tr>"]
    for k in profile.kernels:
        share = k.measured_s * k.calls / profile.run_s if profile.run_s else 0.0
        row = f' data-row="{k.group}"' if k.group is not None else ""
        swatch = (f'<span class="sw" style="background:{group_color(k.group)}"></span>'
                  if k.group is not None else "")
        calls = f" (x{k.calls})" if k.calls > 1 else ""
        rows.append(
            f"<tr{row}><td>{swatch}{k.index}</td><td class='mono'>{_esc(k.kernel)}{calls}</td>"
            f"<td>{_esc(k.rule or '-')}</td><td>{_esc(_fmt_time(k.measured_s))}</td>"
            f'<td><span class="bar" style="width:{100 * share:.0f}px"></span> '
            f"{100 * share:.0f}%</td><td>{_esc(_fmt_time(k.predicted_s))}</td>"
            f"<td>{num(k.predicted_ratio, '.2f')}</td><td>{num(k.gflops, '.1f')}</td>"
            f"<td>{num(k.gbps, '.1f')}</td>"
            f"<td>{num(k.roofline_share and 100 * k.roofline_share, '.0f')}"
            f"{'%' if k.roofline_share is not None else ''}</td></tr>")
    t = profile.timing
    how = (f"each kernel timed alone from the built library, {t.get('statistic', 'min')} of "
           f"{t.get('repeat')} rounds of &ge; {t.get('min_repeat_ms')} ms") if t else ""
    notes = "".join(f"<div>note: {_esc(n)}</div>" for n in profile.notes)
    return (f"<table class='groups profile'>{''.join(rows)}</table>"
            f"<div class='total'>{_esc(profile.total_line())}</div>"
            f"<div class='legend'>{how}; roofline = the machine's roofline bound / measured; "
            f"the whole run goes through the Relax VM, the difference is its overhead."
            f"{notes}</div>")


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2330;
 background:#f5f6f8}
header{padding:14px 22px;background:#1d2330;color:#fff}
header h1{margin:0;font-size:19px;font-weight:600}
header .meta{color:#aab3c5;font-size:12.5px;margin-top:3px}
main{display:grid;grid-template-columns:minmax(0,1fr) 390px;gap:16px;padding:16px 22px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:12px 14px}
.graph{align-self:start}
.gview{overflow:auto;max-height:72vh}
h2{font-size:14px;margin:0 0 8px;color:#475069;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceff3}
th{color:#6a7386;font-weight:600}
table.summary td:not(:first-child),table.summary th{text-align:right;white-space:nowrap}
table.summary th:first-child{text-align:left}
tr.speed td{font-weight:700;color:#0a7a45;border-bottom:0}
tr.speed.slow td{color:#b42318}
svg.fit{max-width:100%;height:auto}
.zoom{float:right;margin-top:-4px}
.zoom button{font:12px system-ui,sans-serif;margin-left:4px;padding:2px 8px;cursor:pointer;
 border:1px solid #c4cad6;border-radius:4px;background:#fff}
.zoom button.on{background:#1d2330;color:#fff;border-color:#1d2330}
table.sig td:last-child{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
table.groups tr[data-row]{cursor:pointer}
table.groups tr[data-row]:hover,table.groups tr.sel{background:#eef3ff}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;
 word-break:break-all}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
svg text{font:11.5px ui-monospace,SFMono-Regular,Menlo,monospace;fill:#1d2330}
svg .blk{font-weight:700;fill:#475069}
.group{cursor:pointer}
.group .box{fill:var(--c);fill-opacity:.10;stroke:var(--c);stroke-width:1.6}
.group .gh{font-weight:700;fill:var(--c)}
.group .gt{fill:#5b6478;font-size:10.5px}
.group .opn{fill:#fff;stroke:var(--c);stroke-width:1.2}
.group:hover .box,.group.sel .box{fill-opacity:.22;stroke-width:2.6}
.op rect{fill:#f0f1f4;stroke:#a4abba;stroke-dasharray:3 2}
.op text{fill:#6a7386;font-style:italic}
.e{fill:none;stroke:#9aa3b5;stroke-width:1.1}
.e.in{stroke:#6f7890}
.e.out{stroke-width:1.5;stroke-dasharray:5 3}
.e.hi{stroke:#d6336c;stroke-width:2.4;stroke-dasharray:none}
#details .empty{color:#6a7386}
#details h3{margin:2px 0 6px;font-size:15px}
#details .kv{display:grid;grid-template-columns:110px 1fr;gap:2px 8px;font-size:13px}
#details .kv div:nth-child(odd){color:#6a7386}
#details ul{padding-left:18px;margin:6px 0}
#details li{margin:3px 0}
.why{font-size:12.5px;color:#3b4254}
.why b{color:#1d2330}
.legend{font-size:12px;color:#6a7386;margin-top:6px}
footer{padding:0 22px 18px;color:#8a92a3;font-size:12px}
.bar{display:inline-block;height:9px;background:#4c6ef5;border-radius:2px;vertical-align:middle}
table.profile td:nth-child(n+4),table.profile th:nth-child(n+4){text-align:right;
 white-space:nowrap}
.total{margin-top:8px;font-weight:600}
"""

_JS = r"""
(function(){
  var data = JSON.parse(document.getElementById('plan-data').textContent);
  var panel = document.getElementById('details');
  function esc(s){return String(s).replace(/[&<>"]/g,function(c){
    return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
  function show(k){
    var g = data.groups[k]; if(!g) return;
    document.querySelectorAll('.sel').forEach(function(e){e.classList.remove('sel');});
    document.querySelectorAll('.e.hi').forEach(function(e){e.classList.remove('hi');});
    document.querySelectorAll('[data-group="'+k+'"],[data-row="'+k+'"]').forEach(
      function(e){e.classList.add('sel');});
    document.querySelectorAll('.e[data-from="'+k+'"],.e[data-to="'+k+'"]').forEach(
      function(e){e.classList.add('hi');});
    var h = '<h3 style="color:'+g.color+'">kernel #'+k+'</h3>'
      + '<div class="mono">'+esc(g.name)+'</div><div class="kv" style="margin-top:8px">'
      + '<div>predicted</div><div><b>'+esc(g.time)+'</b></div>'
      + '<div>memory traffic</div><div>'+esc(g.traffic)+'</div>'
      + '<div>of it DRAM</div><div>'+esc(g.dram)+'</div>'
      + '<div>on-chip</div><div>'+esc(g.onchip)+'</div>'
      + '<div>work</div><div>'+(g.gflop >= 1 ? g.gflop.toFixed(2)+' GFLOP'
          : (g.gflop*1e3).toFixed(3)+' MFLOP')+'</div>'
      + '<div>rule</div><div>'+esc(g.rule||'-')+' ('+esc(g.kind)+')</div>'
      + '<div>bound</div><div>'+esc(g.bound)+'</div>'
      + (g.onnx.length ? '<div>ONNX nodes</div><div class="mono">'+esc(g.onnx.join(' '))
          +'</div>' : '')
      + (g.fuseops ? '<div>vs FuseOps</div><div>'+esc(g.fuseops)+'</div>' : '') + '</div>'
      + '<h2 style="margin-top:12px">ops</h2><ul>';
    var onnx = data.onnx;
    g.ops.forEach(function(o){h += '<li><span class="mono">'+esc(o.label)+' = '
      +esc(o.func)+'</span> <span class="why">'+esc(o.pattern)+' → '+esc(o.shape)
      +(onnx ? ' · ONNX: '+(o.onnx.length ? esc(o.onnx.join(', '))
                            : 'none') : '')
      +'</span></li>';});
    h += '</ul><h2 style="margin-top:12px">why the boundary is here</h2>';
    if(!g.boundaries.length) h += '<div class="why">no consumer outside this kernel</div>';
    h += '<ul>';
    g.boundaries.forEach(function(b){
      var to = b.consumer_group === null ? (b.consumer ? 'a non-kernel op' : 'outside')
        : 'kernel #'+b.consumer_group;
      var t = (b.separate_s !== null && b.merged_s !== null)
        ? ' <i>(separate '+(b.separate_s*1e6).toFixed(1)+' us, merged '
          +(b.merged_s*1e6).toFixed(1)+' us)</i>' : '';
      h += '<li class="why"><b>'+esc(b.producer)+(b.consumer ? ' → '+esc(b.consumer) : '')
        +'</b> ('+esc(to)+'): '+esc(b.reason)+t+'</li>';});
    panel.innerHTML = h + '</ul>';
  }
  document.querySelectorAll('[data-group],[data-row]').forEach(function(e){
    var k = e.getAttribute('data-group') || e.getAttribute('data-row');
    e.addEventListener('click', function(){show(+k);});
    e.addEventListener('keydown', function(ev){if(ev.key==='Enter') show(+k);});
  });
  // zoom: "fit" scales the graph to the card's width (every kernel in view), "100%" is
  // the drawing's own size, panned by scrolling the graph's view (the buttons stay put)
  var graph = document.getElementById('graph');
  document.querySelectorAll('.zoom button').forEach(function(b){
    b.addEventListener('click', function(){
      var fit = b.getAttribute('data-zoom') === 'fit';
      graph.classList.toggle('fit', fit);
      document.querySelectorAll('.zoom button').forEach(function(o){
        o.classList.toggle('on', o === b);});
    });
  });
  document.body.setAttribute('data-ready', String(data.groups.length));
  var m = /g=(\d+)/.exec(location.hash);  // report.html#g=3 opens kernel 3
  if(data.groups.length) show(m && +m[1] < data.groups.length ? +m[1] : 0);
})();
"""


def _signature(inputs, outputs) -> str:
    """The model's inputs and outputs as a small table (nothing when neither is known)."""
    if not inputs and not outputs:
        return ""

    def row(kind: str, t) -> str:
        d = t if isinstance(t, dict) else (
            t.to_json() if hasattr(t, "to_json") else {"name": str(t)})
        shape = d.get("shape")
        dims = "?" if shape is None else ", ".join(map(str, shape))
        return (f"<tr><td>{kind}</td><td class='mono'>{_esc(d['name'])}</td>"
                f"<td>{_esc(d.get('dtype') or 'any')}[{_esc(dims)}]</td></tr>")

    rows = [row("input", t) for t in inputs or ()] + [row("output", t) for t in outputs or ()]
    return (f'<section class="card" style="margin-top:16px" id="signature"><h2>model</h2>'
            f"<table class='sig'>{''.join(rows)}</table></section>")


def render_html(plan: FusionPlan, title: str = "fusion plan",
                profile: ModelProfile | None = None, inputs=None, outputs=None) -> str:
    """One self-contained HTML page: the graph as inline SVG, per-kernel details, summary.

    Parameters
    ----------
    plan : FusionPlan
        A plan from :class:`~fusion_tvm.passes.FuseByCostModel` (with its blocks).
    title : str
        Shown in the header and the page title.
    profile : ModelProfile, optional
        The measured profile of the model built from ``plan``
        (:meth:`~fusion_tvm.api.CompiledModel.profile`): shown as a table of its own.
    inputs, outputs : sequence, optional
        The model's inputs and outputs (:attr:`CompiledModel.inputs
        <fusion_tvm.api.CompiledModel.inputs>` / ``outputs``, or dicts with ``name``,
        ``shape``, ``dtype``; a bare name for an output of unknown shape): shown beside the
        summary.

    Returns
    -------
    str
        The page; it loads nothing from the network.
    """
    svg, w, h = _svg(plan)
    data = {"groups": _group_details(plan), "onnx": plan.has_onnx_names}
    blob = json.dumps(data, default=str).replace("</", "<\\/")
    dims = ", ".join(f"{k}={v}" for k, v in plan.dims.items()) or "static shapes"
    meta = (f"{_esc(plan.target)} · {_esc(plan.hardware)} · cost model {_esc(plan.cost_model)}"
            f" · dims: {_esc(dims)} · search {plan.search_time_s * 1e3:.0f} ms")
    notes = "".join(f"<div>note: {_esc(n)}</div>" for n in plan.notes)
    measured = "" if profile is None else (
        f'<section class="card" style="grid-column:1/-1" id="profile"><h2>measured profile '
        f"({profile.num_kernels} kernels, whole run {_esc(_fmt_time(profile.run_s))})</h2>"
        f"{_profile_table(profile)}</section>\n")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)} · fusion plan</title><style>{_CSS}</style></head>
<body>
<header><h1>{_esc(title)} — fusion plan</h1><div class="meta">{meta}</div></header>
<main>
<section class="card graph"><div class="zoom"><button data-zoom="fit" class="on">fit width
</button><button data-zoom="1">100%</button></div><h2>kernels ({len(plan.groups)})</h2>
<div class="gview" id="graph-view"><svg xmlns="http://www.w3.org/2000/svg" id="graph"
 class="fit" width="{w:.0f}" height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" role="img"
 aria-label="fusion graph">{svg}</svg></div>
<div class="legend">Each coloured box is one kernel; its ops run top to bottom. Dashed curves
carry a tensor through memory between kernels; grey dashed ops are not kernels (tuples,
views). Click a kernel for its details and the reason for each boundary.</div>
</section>
<aside>
<section class="card"><h2>summary</h2>{_summary_rows(plan)}</section>
{_signature(inputs, outputs)}
<section class="card" style="margin-top:16px"><h2>details</h2>
<div id="details"><div class="empty">Click a kernel.</div></div></section>
</aside>
<section class="card" style="grid-column:1/-1"><h2>kernels</h2>{_groups_table(plan)}</section>
{measured}</main>
<footer>generated by fusion_tvm{notes}</footer>
<script type="application/json" id="plan-data">{blob}</script>
<script>{_JS}</script>
</body></html>
"""
