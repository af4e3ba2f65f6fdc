"""What the report draws from a ``scaling.json`` document: the charts (as :mod:`svg` figures),
one point a step in each line chart of steps, invalid steps marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .svg import (
    INVALID,
    PALETTE,
    Bar,
    BarChart,
    BarGroup,
    LineChart,
    Point,
    Segment,
    Series,
    bar_chart,
    line_chart,
)
from .tables import dig, served_turns

Doc = Mapping[str, Any]
Step = Mapping[str, Any]

DASHES = {"ws": "", "http-full": "6 4", "http-chained": "9 3 2 3"}  # p50: "3 3"
ROLES = (  # (key in cpu_ms_per_turn, legend, colour)
    ("gateway", "gateway", "#4e79a7"),
    ("session_host", "session host", "#f28e2b"),
    ("ray", "Ray's own", "#59a14f"),
)
OTHER_COLOR = "#bab0ac"
STEP_LABELS = "Under each step: #its index, then n session nodes · L loops; red: invalid."
PERCENTILES = "Large points: p99; small faded points on finely dotted lines: p50."


def step_tip(step: Step) -> str:
    text = (
        f"step {step['index']}: {step['transport']}, {step['session_nodes']} session node(s), "
        f"{step['loops']} loops — {step['turns_per_s']:.1f} turns/s"
    )
    if not step["valid"]:
        text += f" — INVALID: {step.get('invalid_reason') or 'clients saturated'}"
    return text


def transports(doc: Doc) -> list[str]:
    return list(dict.fromkeys(s["transport"] for s in doc["steps"]))


def color_of(values: Sequence[Any], value: Any) -> str:
    return PALETTE[values.index(value) % len(PALETTE)]


def series_name(transport: str, label: str, many_transports: bool) -> str:
    return f"{transport}, {label}" if many_transports else label


def throughput(doc: Doc) -> LineChart:
    """Turns/s against session nodes in service: a series a (transport, loops per node)."""
    steps = doc["steps"]
    loads = sorted({s["loops_per_node"] for s in steps})
    many = len(transports(doc)) > 1
    series = []
    for transport in transports(doc):
        for load in loads:
            mine = [s for s in steps if s["transport"] == transport and s["loops_per_node"] == load]
            if mine:
                series.append(
                    Series(
                        series_name(transport, f"{load} loop{'s' if load != 1 else ''} per node", many),
                        [
                            Point(s["session_nodes"], s["turns_per_s"], s["index"], s["valid"], step_tip(s))
                            for s in mine
                        ],
                        color_of(loads, load),
                        DASHES.get(transport, ""),
                    )
                )
    return LineChart(
        "fig-throughput",
        "Throughput against session nodes in service",
        "session nodes in service",
        "turns/s",
        series,
        integer_x=True,
        note="One point a step; the line joins the median of the valid steps at each node count.",
    )


def per_node(doc: Doc) -> LineChart:
    """Turns/s a session node carries: flat lines are linear scaling."""
    base = throughput(doc)
    series = [
        Series(s.name, [Point(p.x, p.y / p.x, p.step, p.valid, p.tip) for p in s.points], s.color, s.dash)
        for s in base.series
    ]
    return LineChart(
        "fig-per-node",
        "Throughput a session node carries",
        "session nodes in service",
        "turns/s per session node",
        series,
        integer_x=True,
        note="Turns/s divided by the session nodes in service: a flat line is linear scaling.",
    )


def latency(doc: Doc, key: str, chart_id: str, title: str, note: str) -> LineChart:
    """p50 (dashed, small points) and p99 of ``key`` against the loops in flight: a series a
    (transport, session nodes)."""
    steps = doc["steps"]
    counts = sorted({s["session_nodes"] for s in steps})
    many = len(transports(doc)) > 1
    series = []
    for transport in transports(doc):
        for count in counts:
            mine = [s for s in steps if s["transport"] == transport and s["session_nodes"] == count]
            label = series_name(transport, f"{count} session node{'s' if count != 1 else ''}", many)
            for pct, dash, radius, opacity in (
                ("p99", DASHES.get(transport, ""), 4.5, 1.0),
                ("p50", "3 3", 3.0, 0.6),
            ):
                points = [
                    Point(s["loops"], v, s["index"], s["valid"], f"{pct} {v:.1f} ms — {step_tip(s)}")
                    for s in mine
                    if (v := dig(s, key, pct)) is not None
                ]
                if points:
                    series.append(
                        Series(
                            f"{label} {pct}",
                            points,
                            color_of(counts, count),
                            dash,
                            pct,
                            radius=radius,
                            opacity=opacity,
                            in_legend=pct == "p99",
                        )
                    )
    return LineChart(chart_id, title, "loops in flight (load)", "ms", series, integer_x=True, note=note)


def step_label(step: Step) -> list[str]:
    return [f"#{step['index']}", f"{step['session_nodes']}n·{step['loops']}L"]


def node_order(doc: Doc) -> list[str]:
    return list(dict.fromkeys(n["node_id"] for s in doc["steps"] for n in s.get("nodes") or ()))


def node_names(doc: Doc) -> dict[str, str]:
    """Each session node's name in the charts: its IP, and the start of its id where nodes
    share an IP (raylets on one machine)."""
    ips = {n["node_id"]: n["node_ip"] for s in doc["steps"] for n in s.get("nodes") or ()}
    shared = {ip for ip in ips.values() if list(ips.values()).count(ip) > 1}
    return {i: f"{ip} ({i[:6]})" if ip in shared else ip for i, ip in ips.items()}


def share(doc: Doc) -> BarChart:
    """Each step's turns split by the session node that served them."""
    order, names = node_order(doc), node_names(doc)
    groups = []
    for s in doc["steps"]:
        served = served_turns(s)
        segments = [
            Segment(
                names[n["node_id"]],
                n["turns"] / served,
                color_of(order, n["node_id"]),
                f"{names[n['node_id']]}: {n['turns']} turns ({n['turns'] / served:.0%}) — step {s['index']}",
            )
            for n in s.get("nodes") or ()
            if served and n.get("turns") is not None
        ]
        groups.append(BarGroup(step_label(s), [Bar(segments)], s["index"], s["valid"]))
    return BarChart(
        "fig-share",
        "Each session node's share of the turns",
        "share of the step's turns",
        groups,
        [(names[node], color_of(order, node)) for node in order],
        y_max=1.0,
        percent=True,
        note="An even split is 1/N for N session nodes in service. " + STEP_LABELS,
    )


def cpu(doc: Doc) -> BarChart:
    """CPU a turn cost on each session node, by role (a bar a node, a group a step)."""
    order, names = node_order(doc), node_names(doc)
    groups = []
    other_seen = False
    for s in doc["steps"]:
        bars = []
        for n in s.get("nodes") or ():
            roles = n.get("cpu_ms_per_turn") or {}
            segments = [
                Segment(
                    legend, roles[key], color, f"{names[n['node_id']]} {legend}: {roles[key]:.2f} CPU ms/turn"
                )
                for key, legend, color in ROLES
                if roles.get(key) is not None
            ]
            rest = (roles.get("total") or 0.0) - sum(seg.value for seg in segments)
            if rest > 1e-9:
                other_seen = True
                segments.append(
                    Segment(
                        "other", rest, OTHER_COLOR, f"{names[n['node_id']]} other: {rest:.2f} CPU ms/turn"
                    )
                )
            bars.append(Bar(segments, str(order.index(n["node_id"]) + 1)))
        groups.append(BarGroup(step_label(s), bars, s["index"], s["valid"]))
    legend = [(legend, color) for _, legend, color in ROLES]
    if other_seen:
        legend.append(("other processes", OTHER_COLOR))
    return BarChart(
        "fig-cpu",
        "CPU a turn costs on each session node, by role",
        "CPU ms per turn",
        groups,
        legend,
        note="Bars numbered by node: "
        + ", ".join(f"{i + 1} = {names[n]}" for i, n in enumerate(order))
        + ". "
        + STEP_LABELS,
    )


def clients(
    doc: Doc, key: str, chart_id: str, title: str, y_label: str, scale: float, limit: float | None
) -> LineChart:
    """The busiest load client of each step (its core use or its event-loop lag), against the
    threshold over which the step is invalid."""
    points = []
    for s in doc["steps"]:
        values = [c[key] for c in s.get("clients") or () if c.get(key) is not None]
        if values:
            v = max(values) * scale
            points.append(Point(s["index"], v, s["index"], s["valid"], f"{v:.1f} — {step_tip(s)}"))
    series = [Series("busiest client of the step", points, PALETTE[0], radius=4.0)]
    if limit is not None and points:
        xs = [p.x for p in points]
        series.append(
            Series(
                "saturation threshold",
                [Point(min(xs), limit * scale, None), Point(max(xs), limit * scale, None)],
                INVALID,
                "5 4",
                markers=False,
            )
        )
    return LineChart(chart_id, title, "step", y_label, series, integer_x=True)


def model_chart(doc: Doc) -> LineChart | None:
    """The capacity model's fitted lines (``model.fit.lines``: a shared part's busiest thread,
    ``base_ms_per_s + per_node_ms_per_s × n``), drawn to twice the run's largest node count,
    with what each valid step measured (its ``shared_cpu_ms_per_s``)."""
    lines = dig(doc, "model", "fit", "lines")
    if not isinstance(lines, Mapping) or not lines:
        return None
    parts = list(lines)
    reach = max(4, 2 * max((s["session_nodes"] for s in doc["steps"]), default=1))
    series = []
    for part in parts:
        color = color_of(parts, part)
        fit = lines[part] if isinstance(lines[part], Mapping) else {}
        base, slope = fit.get("base_ms_per_s"), fit.get("per_node_ms_per_s")
        if isinstance(base, int | float) and isinstance(slope, int | float):
            ends = [Point(0, base, None), Point(reach, base + slope * reach, None)]
            series.append(Series(part, ends, color, "6 4", markers=False))
        measured = [
            Point(s["session_nodes"], v, s["index"], True, f"{part}: {v:.1f} ms/s — {step_tip(s)}")
            for s in doc["steps"]
            if s["valid"] and isinstance(v := dig(s, "shared_cpu_ms_per_s", part), int | float)
        ]
        if measured:
            series.append(Series(f"{part} (measured)", measured, color, line=False, in_legend=False))
    if not series:
        return None
    return LineChart(
        "fig-model",
        "Capacity model: the shared parts' busiest thread against session nodes",
        "session nodes",
        "CPU ms per second (1000 = one core)",
        series,
        note="Points: what each valid step measured; dashed: the line fitted to them, drawn to "
        f"{reach} session nodes. The extrapolation further out is in the table below.",
    )


def charts(doc: Doc) -> list[str]:
    """Every figure of the report, as HTML, in reading order."""
    saturation = dig(doc, "sweep", "saturation") or {}
    out = [
        line_chart(throughput(doc)),
        line_chart(per_node(doc)),
        line_chart(
            latency(
                doc,
                "nonmodel_ms",
                "fig-nonmodel",
                "Non-model time a turn (server and network)",
                "A turn's time at the client less the model's own time. " + PERCENTILES,
            )
        ),
        line_chart(
            latency(
                doc,
                "ttft_ms",
                "fig-ttft",
                "Time to first token",
                "From the request sent to its first output token, at the client. " + PERCENTILES,
            )
        ),
        bar_chart(share(doc)),
        bar_chart(cpu(doc)),
        line_chart(
            clients(
                doc,
                "cpu_fraction",
                "fig-client-cpu",
                "Load clients: core use",
                "% of one core",
                100.0,
                saturation.get("cpu_fraction"),
            )
        ),
        line_chart(
            clients(
                doc,
                "lag_p99_ms",
                "fig-client-lag",
                "Load clients: event-loop lag p99",
                "ms",
                1.0,
                saturation.get("lag_p99_ms"),
            )
        ),
    ]
    model = model_chart(doc)
    if model is not None:
        out.append(line_chart(model))
    return out
