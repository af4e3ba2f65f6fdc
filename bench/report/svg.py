"""Charts as inline SVG, drawn in Python with no library and nothing fetched: a line chart of
points (one ``<circle class="point" data-step=…>`` a point, so a page's points can be counted)
and a chart of stacked bars.  Pure functions of their inputs; :mod:`bench.report.figures`
decides what to draw."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from ..stats import pct

WIDTH, HEIGHT = 560, 330
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 14, 58
INVALID = "#d62728"  # the one colour that means "not the server's figure"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    step: int | None  # the step it stands for: its data-step
    valid: bool = True
    tip: str = ""


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[Point]
    color: str
    dash: str = ""  # the line's stroke-dasharray
    kind: str = ""  # an extra class of its points (p50, p99)
    markers: bool = True  # False: a line only (the model's curve)
    line: bool = True  # False: points only
    radius: float = 4.5
    opacity: float = 1.0
    in_legend: bool = True


@dataclass(frozen=True)
class LineChart:
    id: str
    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    integer_x: bool = False
    note: str = ""


@dataclass(frozen=True)
class Segment:
    name: str
    value: float
    color: str
    tip: str = ""


@dataclass(frozen=True)
class Bar:
    segments: Sequence[Segment]
    label: str = ""  # under the bar (a node), small


@dataclass(frozen=True)
class BarGroup:
    label: Sequence[str]  # lines under the group
    bars: Sequence[Bar]
    step: int
    valid: bool = True


@dataclass(frozen=True)
class BarChart:
    id: str
    title: str
    y_label: str
    groups: Sequence[BarGroup]
    legend: Sequence[tuple[str, str]]  # (name, colour)
    y_max: float | None = None
    percent: bool = False
    note: str = ""
    extra_legend: Sequence[str] = field(default_factory=tuple)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 × a power of ten apart)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks, value = [], first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 10))
    return ticks


def fmt_tick(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:g}"


class Scale:
    """A linear map from data to pixels."""

    def __init__(self, lo: float, hi: float, px_lo: float, px_hi: float):
        self.lo, self.hi, self.px_lo, self.px_hi = lo, hi, px_lo, px_hi

    def __call__(self, value: float) -> float:
        span = self.hi - self.lo or 1.0
        return self.px_lo + (value - self.lo) / span * (self.px_hi - self.px_lo)


def attrs(**values: object) -> str:
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in values.items())


def frame(y_ticks: list[float], y: Scale, y_label: str, x_label: str, percent: bool = False) -> list[str]:
    """The y grid and labels, the axes' titles."""
    out = []
    for t in y_ticks:
        py = y(t)
        text = f"{t * 100:.0f}%" if percent else fmt_tick(t)
        out.append(f'<line class="gridline" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{text}</text>')
    mid = (TOP + HEIGHT - BOTTOM) / 2
    out.append(
        f'<text class="axis-title" transform="translate(14,{mid:.0f}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    if x_label:
        out.append(
            f'<text class="axis-title" x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 8}" '
            f'text-anchor="middle">{escape(x_label)}</text>'
        )
    out.append(
        f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}"/>'
    )
    return out


def svg(chart_id: str, body: list[str], title: str) -> str:
    return (
        f'<svg class="plot" id="svg-{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )


def figure(chart_id: str, title: str, drawing: str, legend: list[str], note: str) -> str:
    items = "".join(f'<span class="key">{item}</span>' for item in legend)
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    return (
        f'<figure class="chart" id="{escape(chart_id)}"><figcaption>{escape(title)}</figcaption>'
        f'{drawing}<div class="legend">{items}</div>{note_html}</figure>'
    )


def swatch(color: str, dash: str = "", marker: bool = True) -> str:
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    dot = f'<circle cx="13" cy="6" r="3.5" fill="{color}"/>' if marker else ""
    return (
        f'<svg class="swatch" width="26" height="12" viewBox="0 0 26 12"><line x1="1" x2="25" y1="6" y2="6" '
        f'stroke="{color}" stroke-width="2"{dash_attr}/>{dot}</svg>'
    )


INVALID_KEY = (
    f'<svg class="swatch" width="26" height="12" viewBox="0 0 26 12"><circle cx="13" cy="6" r="4" '
    f'fill="#fff" stroke="{INVALID}" stroke-width="2"/></svg>invalid step: clients saturated, '
    "not the server's figure"
)


def line_chart(chart: LineChart) -> str:
    """The chart's figure: each series' points (invalid ones hollow and red, left out of its
    line) and a line through the median of its valid points at each x."""
    points = [p for s in chart.series for p in s.points]
    if not points:
        return figure(chart.id, chart.title, '<p class="empty">no step yet</p>', [], chart.note)
    xs = [p.x for p in points]
    x_lo, x_hi = min(xs), max(xs)
    distinct = sorted(set(xs))
    if chart.integer_x and len(distinct) <= 12:
        x_ticks = distinct
    else:
        x_ticks = [t for t in nice_ticks(x_lo, x_hi) if x_lo <= t <= x_hi] or distinct
    pad = (x_hi - x_lo) * 0.08 or 0.5
    x = Scale(x_lo - pad, x_hi + pad, LEFT, WIDTH - RIGHT)
    low = min(0.0, min(p.y for p in points) * 1.05)  # 0, unless a line (a fit) goes below it
    y_ticks = nice_ticks(low, max(p.y for p in points) * 1.05 or 1.0)
    y = Scale(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP)
    body = frame(y_ticks, y, chart.y_label, chart.x_label)
    for t in x_ticks:
        px = x(t)
        body.append(
            f'<line class="tick-mark" x1="{px:.1f}" x2="{px:.1f}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM + 4}"/>'
        )
        body.append(
            f'<text class="tick" x="{px:.1f}" y="{HEIGHT - BOTTOM + 17}" text-anchor="middle">{fmt_tick(t)}</text>'
        )
    marked = [s for s in chart.series if s.markers]
    for i, s in enumerate(chart.series):
        dodge = (marked.index(s) - (len(marked) - 1) / 2) * 3.0 if s.markers and len(marked) > 1 else 0.0
        by_x: dict[float, list[float]] = {}
        for p in s.points:
            if p.valid:
                by_x.setdefault(p.x, []).append(p.y)
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{x(px) + dodge:.1f},{y(pct(ys, 0.5) or 0.0):.1f}"
            for j, (px, ys) in enumerate(sorted(by_x.items()))
        )
        if path and s.line:
            dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            body.append(
                f'<path class="series-line" d="{path}" stroke="{s.color}"{dash} opacity="{s.opacity}" data-series="{i}"/>'
            )
        if not s.markers:
            continue
        for p in s.points:
            cx, cy = x(p.x) + dodge, y(p.y)
            kind = f" {s.kind}" if s.kind else ""
            tip = f"<title>{escape(p.tip)}</title>" if p.tip else ""
            step = "" if p.step is None else f' data-step="{p.step}"'
            if p.valid:
                body.append(
                    f'<circle class="point{kind}"{step} data-valid="true" cx="{cx:.1f}" cy="{cy:.1f}" '
                    f'r="{s.radius}" fill="{s.color}" opacity="{s.opacity}">{tip}</circle>'
                )
            else:
                body.append(
                    f'<circle class="point invalid{kind}"{step} data-valid="false" cx="{cx:.1f}" '
                    f'cy="{cy:.1f}" r="{s.radius + 0.5}" fill="#fff" stroke="{INVALID}" '
                    f'stroke-width="2">{tip}</circle>'
                )
    legend = [swatch(s.color, s.dash, s.markers) + escape(s.name) for s in chart.series if s.in_legend]
    if any(not p.valid for p in points):
        legend.append(INVALID_KEY)
    return figure(chart.id, chart.title, svg(chart.id, body, chart.title), legend, chart.note)


def bar_chart(chart: BarChart) -> str:
    """Groups of stacked bars, one group a step (its label under it; an invalid step's bars
    faded and its label red)."""
    if not chart.groups:
        return figure(chart.id, chart.title, '<p class="empty">no step yet</p>', [], chart.note)
    top = chart.y_max
    if top is None:
        totals = [sum(seg.value for seg in bar.segments) for g in chart.groups for bar in g.bars]
        top = max(totals, default=0.0) * 1.05 or 1.0
    y_ticks = nice_ticks(0.0, top)
    y = Scale(0.0, y_ticks[-1], HEIGHT - BOTTOM, TOP)
    body = frame(y_ticks, y, chart.y_label, "", chart.percent)
    slot = (WIDTH - RIGHT - LEFT) / len(chart.groups)
    for gi, group in enumerate(chart.groups):
        x0 = LEFT + gi * slot
        inner = slot * 0.8
        bar_w = inner / max(len(group.bars), 1)
        validity = "true" if group.valid else "false"
        opacity = "" if group.valid else ' opacity="0.45"'
        body.append(
            f'<g class="bar-group{"" if group.valid else " invalid"}" data-step="{group.step}" data-valid="{validity}"{opacity}>'
        )
        for bi, bar in enumerate(group.bars):
            bx = x0 + slot * 0.1 + bi * bar_w
            base = 0.0
            for seg in bar.segments:
                if seg.value <= 0:
                    continue
                y_top, y_bottom = y(base + seg.value), y(base)
                tip = f"<title>{escape(seg.tip)}</title>" if seg.tip else ""
                body.append(
                    f'<rect class="segment" x="{bx + 0.5:.1f}" y="{y_top:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                    f'height="{max(y_bottom - y_top, 0.5):.1f}" fill="{seg.color}">{tip}</rect>'
                )
                base += seg.value
            if bar.label and bar_w >= 14:
                body.append(
                    f'<text class="bar-label" x="{bx + bar_w / 2:.1f}" y="{HEIGHT - BOTTOM + 11}" '
                    f'text-anchor="middle">{escape(bar.label)}</text>'
                )
        body.append("</g>")
        cls = "group-label" if group.valid else "group-label invalid"
        for li, line in enumerate(group.label):
            body.append(
                f'<text class="{cls}" x="{x0 + slot / 2:.1f}" y="{HEIGHT - BOTTOM + 24 + 12 * li}" '
                f'text-anchor="middle">{escape(line)}</text>'
            )
    legend = [
        f'<svg class="swatch" width="14" height="12" viewBox="0 0 14 12"><rect x="1" y="1" width="12" '
        f'height="10" fill="{color}"/></svg>{escape(name)}'
        for name, color in chart.legend
    ]
    legend += [escape(item) for item in chart.extra_legend]
    return figure(chart.id, chart.title, svg(chart.id, body, chart.title), legend, chart.note)
