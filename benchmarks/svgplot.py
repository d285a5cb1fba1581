"""Dependency-free SVG charts for the benchmark reports (grouped log bars, log-log scatter).

matplotlib is not part of our install; these two charts are all the benchmarks need, so they
are written directly as SVG text, viewable in any browser and diffable in review.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f"]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi], with 2x and 5x (then every digit) on short ranges."""
    for mantissas in ((1,), (1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0 ** e
                 for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for m in mantissas if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= 3:
            return ticks
    return ticks or [lo, hi]


def _fmt(v: float) -> str:
    return f"{v:g}" if v >= 0.01 else f"{v:.0e}"


class _Canvas:
    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
                      f'height="{height}" viewBox="0 0 {width} {height}" '
                      'font-family="sans-serif" font-size="11">',
                      f'<rect width="{width}" height="{height}" fill="white"/>']

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x, y, s, anchor="middle", size=11, rotate=None, **kw) -> None:
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}"'
                 f'{rot}{extra}>{escape(str(s))}</text>')

    def line(self, x1, y1, x2, y2, color="#000", width=1.0, dash=None) -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{color}" stroke-width="{width}"{d}/>')

    def svg(self) -> str:
        return "\n".join([*self.parts, "</svg>"]) + "\n"


def _legend(c: _Canvas, names: list[str], x: float, y: float, markers=None) -> None:
    for i, name in enumerate(names):
        yy = y + 15 * i
        if markers:
            c.add(markers(i, x + 5, yy - 4))
        else:
            c.add(f'<rect x="{x:.1f}" y="{yy - 9:.1f}" width="10" height="10" '
                  f'fill="{PALETTE[i % len(PALETTE)]}"/>')
        c.text(x + 15, yy, name, anchor="start")


def bar_chart(groups: list[str], series: dict[str, list[float | None]], ylabel: str,
              title: str = "") -> str:
    """Grouped bars on a log axis: one group per x label, one bar per series (None: no bar)."""
    values = [v for vs in series.values() for v in vs if v]
    if not values or not groups:
        raise ValueError("bar_chart needs at least one positive value")
    lo, hi = min(values) / 1.5, max(values) * 1.5
    left, right, top, bottom = 60, 150, 30, 110
    width = left + right + max(360, 28 * len(groups) * max(len(series), 1) // 2 + 40 * len(groups))
    c = _Canvas(width, 380)
    pw, ph = width - left - right, c.h - top - bottom

    def ypos(v: float) -> float:
        return top + ph * (1 - (math.log10(v) - math.log10(lo)) / math.log10(hi / lo))

    for t in _log_ticks(lo, hi):
        y = ypos(t)
        c.line(left, y, left + pw, y, color="#ddd")
        c.text(left - 5, y + 4, _fmt(t), anchor="end")
    c.line(left, top, left, top + ph)
    c.line(left, top + ph, left + pw, top + ph)
    c.text(15, top + ph / 2, ylabel, rotate=-90)
    if title:
        c.text(left + pw / 2, 18, title, size=13)
    slot = pw / len(groups)
    bw = 0.8 * slot / max(len(series), 1)
    for g, label in enumerate(groups):
        x0 = left + g * slot + 0.1 * slot
        for s, (_, vs) in enumerate(series.items()):
            v = vs[g] if g < len(vs) else None
            if v:
                y = ypos(v)
                c.add(f'<rect x="{x0 + s * bw:.1f}" y="{y:.1f}" width="{bw * 0.95:.1f}" '
                      f'height="{top + ph - y:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                      f'<title>{escape(label)} {escape(list(series)[s])}: {v:.4g}</title></rect>')
        cx = left + (g + 0.5) * slot
        c.text(cx, top + ph + 12, label, anchor="end", size=10, rotate=-35)
    _legend(c, list(series), left + pw + 15, top + 10)
    return c.svg()


def scatter_loglog(points: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str,
                   title: str = "", diagonal: bool = True) -> str:
    """Log-log scatter, one marker series per key, with the y = x line."""
    allpts = [p for ps in points.values() for p in ps if p[0] > 0 and p[1] > 0]
    if not allpts:
        raise ValueError("scatter_loglog needs at least one positive point")
    lo = min(min(p) for p in allpts) / 1.3
    hi = max(max(p) for p in allpts) * 1.3
    left, right, top, bottom = 60, 120, 30, 50
    c = _Canvas(520, 420)
    pw, ph = c.w - left - right, c.h - top - bottom
    span = math.log10(hi / lo)

    def pos(x: float, y: float) -> tuple[float, float]:
        return (left + pw * math.log10(x / lo) / span,
                top + ph * (1 - math.log10(y / lo) / span))

    for t in _log_ticks(lo, hi):
        x, y = pos(t, t)
        c.line(left, y, left + pw, y, color="#ddd")
        c.line(x, top, x, top + ph, color="#ddd")
        c.text(left - 5, y + 4, _fmt(t), anchor="end")
        c.text(x, top + ph + 15, _fmt(t))
    c.line(left, top, left, top + ph)
    c.line(left, top + ph, left + pw, top + ph)
    if diagonal:
        c.line(*pos(lo, lo), *pos(hi, hi), color="#444", dash="4,3")
    c.text(left + pw / 2, c.h - 12, xlabel)
    c.text(15, top + ph / 2, ylabel, rotate=-90)
    if title:
        c.text(left + pw / 2, 18, title, size=13)

    def marker(i: int, x: float, y: float) -> str:
        col = PALETTE[i % len(PALETTE)]
        if i % 2:
            return (f'<path d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},'
                    f'{y + 4:.1f}L{x + 4:.1f},{y - 4:.1f}" stroke="{col}" stroke-width="1.5"/>')
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{col}" fill-opacity="0.8"/>'

    for i, (_, ps) in enumerate(points.items()):
        for x, y in ps:
            if x > 0 and y > 0:
                c.add(marker(i, *pos(x, y)))
    _legend(c, list(points), left + pw + 15, top + 10, markers=marker)
    return c.svg()
