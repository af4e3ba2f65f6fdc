"""The report as HTML: :func:`report_html` (``report.html``, self-contained: its charts inline
SVG, its style inline, no script, nothing fetched) and :func:`body_html`, the part the live
page redraws as steps arrive."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from html import escape
from importlib import resources
from typing import Any

from .figures import charts
from .progress import fmt_ms
from .tables import NODE_COLUMNS, STEP_COLUMNS, Column, cell, dig, node_rows, versus

Doc = Mapping[str, Any]
DATA_FILES = (
    "scaling.json",
    "scaling.csv",
    "scaling-nodes.csv",
    "scaling.md",
)  # write.py writes them beside it


@cache
def style() -> str:
    return resources.files(__package__).joinpath("style.css").read_text(encoding="utf-8")


def planned_steps(doc: Doc) -> int | None:
    """The steps the sweep asked for, when the document gives the sweep."""
    sweep = doc.get("sweep") or {}
    try:
        return (
            len(sweep["session_nodes"])
            * len(sweep["loops_per_node"])
            * len(sweep.get("transports") or ["ws"])
            * int(sweep.get("repeats", 1))
        )
    except KeyError:
        return None


def finished(doc: Doc) -> bool:
    return dig(doc, "provenance", "finished_at") is not None


def banner(doc: Doc, live: bool) -> str:
    done, planned = len(doc["steps"]), planned_steps(doc)
    of = f" of {planned}" if planned is not None else ""
    if live and not finished(doc):
        return f'<div class="banner live" id="status" data-state="running">Running: {done}{of} steps measured so far.</div>'
    if doc.get("complete") is False:
        return (
            f'<div class="banner partial" id="status" data-state="partial">Partial run: it ended after '
            f"{done}{of} steps ({escape(doc.get('error') or 'interrupted, or a step failed')}). "
            "The figures below are the steps it measured.</div>"
        )
    return f'<div class="banner done" id="status" data-state="complete">Complete: {done}{of} steps.</div>'


def card(value: str, key: str) -> str:
    return f'<div class="card"><div class="v">{value}</div><div class="k">{escape(key)}</div></div>'


def cards(doc: Doc) -> str:
    steps = doc["steps"]
    valid = [s for s in steps if s["valid"]]
    out = [card(f"{len(valid)} / {len(steps)}", "valid steps / steps")]
    if valid:
        best = max(valid, key=lambda s: s["turns_per_s"])
        out.append(
            card(
                f"{best['turns_per_s']:,.1f}",
                f"best turns/s (step {best['index']}, {best['session_nodes']} session nodes, {best['loops']} loops)",
            )
        )
        out.append(
            card(
                f"{best['turns_per_s'] / best['session_nodes']:,.1f}", "turns/s per session node at that step"
            )
        )
        out.append(card(f"{fmt_ms(dig(best, 'nonmodel_ms', 'p99'))} ms", "p99 non-model time at that step"))
        out.append(card(f"{fmt_ms(dig(best, 'ttft_ms', 'p99'))} ms", "p99 time to first token at that step"))
    for v in versus(doc):
        if v["nonmodel_p50"] is not None and v["turns_per_s"] is not None:
            out.append(
                card(
                    f"{v['nonmodel_p50']:+.0%} / {v['turns_per_s']:+.0%}",
                    f"ws against {v['transport']}: non-model p50 / turns/s "
                    f"(median of {v['pairs']} matched valid step pairs)",
                )
            )
    failed = sum(sum((s.get("failures") or {}).values()) for s in steps)
    out.append(
        card(f'<span class="{"bad" if failed else "good"}">{failed:,}</span>', "failed turns, all steps")
    )
    nodes = doc["provenance"]["nodes"]
    roles = Counter(role for n in nodes for role in n["roles"])
    composition = ", ".join(f"{count} {role}" for role, count in roles.most_common())
    out.append(card(str(len(nodes)), f"nodes in the cluster ({composition or 'roles not recorded'})"))
    out.append(card(str(len(doc["load_nodes"])), "nodes the load ran on"))
    return '<div class="cards">' + "".join(out) + "</div>"


def html_table(rows: Sequence[Any], columns: Sequence[Column], classes: Sequence[str] | None = None) -> str:
    """A table of ``rows``; ``classes``: a CSS class a row (``invalid``, ``out``, or none).
    A column of text (any value a string) is aligned left, one of numbers right."""
    values = [[get(row) for _, get in columns] for row in rows]
    text = [any(isinstance(v[c], str) for v in values) for c in range(len(columns))]
    head = "".join(
        f'<th class="{"l" if text[c] else ""}">{escape(name)}</th>' for c, (name, _) in enumerate(columns)
    )
    body = []
    for i, row_values in enumerate(values):
        cls = f' class="{classes[i]}"' if classes is not None and classes[i] else ""
        cells = "".join(td(name, row_values[c], text[c]) for c, (name, _) in enumerate(columns))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def td(name: str, value: Any, left: bool) -> str:
    """A table cell; a node id shortened to its first 12 characters (the whole one its title)."""
    cls = ' class="l"' if left else ""
    text = cell(value)
    if name == "node_id" and len(text) > 12:
        return f'<td{cls} title="{escape(text)}"><code>{escape(text[:12])}…</code></td>'
    return f"<td{cls}>{escape(text)}</td>"


def resource(name: str, value: float) -> str:
    """``CPU=2``, ``memory=4.0 GB``."""
    if "memory" in name:
        return f"{name}={value / 1e9:.1f} GB"
    return f"{name}={value:g}"


def invalid_section(doc: Doc) -> str:
    saturation = dig(doc, "sweep", "saturation") or {}
    rules = []
    if saturation.get("lag_p99_ms") is not None:
        rules.append(f"event-loop lag p99 over {saturation['lag_p99_ms']:g} ms")
    if saturation.get("cpu_fraction") is not None:
        rules.append(f"a client process over {saturation['cpu_fraction']:.0%} of a core")
    rule = " or ".join(rules) if rules else "their event loops lagged or a client core was full"
    text = (
        f"A step is <b>invalid</b> when its load clients were saturated ({escape(rule)}) or the step failed: "
        "its latencies would measure the clients, not the server. Invalid steps are drawn as hollow red "
        "points, left out of the lines, and marked in the tables."
    )
    bad = [s for s in doc["steps"] if not s["valid"]]
    if not bad:
        return f'<p id="invalid-steps">{text} <span class="good">Every step of this run is valid.</span></p>'
    items = "".join(
        f"<li>step {s['index']} ({escape(s['transport'])}, {s['session_nodes']} session nodes, {s['loops']} loops): "
        f"{escape(s.get('invalid_reason') or 'clients saturated')}</li>"
        for s in bad
    )
    return f'<div id="invalid-steps"><p>{text}</p><p class="bad">{len(bad)} invalid step(s):</p><ul>{items}</ul></div>'


def kv(pairs: Sequence[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def duration(prov: Doc) -> str:
    try:
        start = datetime.fromisoformat(prov["started_at"])
        end = datetime.fromisoformat(prov["finished_at"])
    except (TypeError, ValueError, KeyError):
        return "—"
    return f"{(end - start).total_seconds():,.0f} s"


CLUSTER_COLUMNS: Sequence[Column] = (
    ("node_ip", lambda n: n["node_ip"]),
    ("node_id", lambda n: n["node_id"]),
    ("roles", lambda n: ", ".join(n["roles"])),
    ("cpus", lambda n: n["cpus"]),
    ("resources", lambda n: ", ".join(resource(k, v) for k, v in sorted(n["resources"].items()))),
)
ACCELERATOR_COLUMNS: Sequence[Column] = (
    ("step", lambda r: r["step"]["index"]),
    ("node_ip", lambda r: r["node"]["node_ip"]),
    ("node_id", lambda r: r["node"]["node_id"]),
    ("replica_cpu_ms_per_turn", lambda r: r["node"].get("replica_cpu_ms_per_turn")),
    ("batch_occupancy", lambda r: r["node"].get("batch_occupancy")),
)


def key_column(key: str) -> Column:
    """A column of a row's value under ``key``."""
    return (key, lambda row: row.get(key))


FAILURE_COLUMNS: Sequence[Column] = tuple(map(key_column, ("step", "code", "count")))


def provenance(doc: Doc) -> str:
    prov = doc["provenance"]
    pairs = [
        ("command", f"<code>{escape(prov['command'])}</code>"),
        ("responses-ws", escape(prov["project_version"])),
        ("git commit", f"<code>{escape(prov.get('git_commit') or 'not a git checkout')}</code>"),
        ("Ray", escape(prov["ray_version"])),
        ("started", escape(prov["started_at"])),
        ("finished", escape(prov.get("finished_at") or "not yet")),
        ("duration", duration(prov)),
    ]
    sweep = doc.get("sweep") or {}
    pairs += [(f"sweep: {k}", escape(json.dumps(v))) for k, v in sweep.items()]
    load = ", ".join(f"{n['node_ip']} ({n['node_id'][:12]})" for n in doc["load_nodes"]) or "none"
    pairs.append(("load ran on", escape(load)))
    serve = prov.get("serve_config")
    serve_html = (
        f"<details><summary>The Serve config in force</summary><pre>{escape(json.dumps(serve, indent=2))}</pre></details>"
        if serve
        else "<p>No Serve config recorded.</p>"
    )
    return (
        f'<section id="provenance"><h2>Provenance</h2>{kv(pairs)}<h3>The cluster\'s nodes</h3>'
        f"{html_table(prov['nodes'], CLUSTER_COLUMNS)}<h3>Serve</h3>{serve_html}</section>"
    )


def model_section(doc: Doc) -> str:
    """The re-fitted capacity model: its fitted lines as a table, its other figures, the
    fit's error and the extrapolation (whatever keys its rows have)."""
    model = doc.get("model")
    if not model:
        return ""
    parts = ['<section id="model"><h2>Capacity model, re-fitted from this run</h2>']
    fit = dict(model.get("fit") or {})
    lines = fit.pop("lines", None)
    if isinstance(lines, Mapping) and lines:
        rows = [
            {"part": part, **(v if isinstance(v, Mapping) else {"value": v})} for part, v in lines.items()
        ]
        parts.append("<h3>Fitted lines</h3>" + html_table(rows, keyed_columns(rows)))
    if fit:
        parts.append(kv([(k, escape(cell(v))) for k, v in fit.items()]))
    others = [(k, v) for k, v in model.items() if k not in ("fit", "extrapolation")]
    if others:
        parts.append(
            kv([("fit error" if k == "error" else k.replace("_", " "), escape(cell(v))) for k, v in others])
        )
    rows = model.get("extrapolation") or []
    if rows:
        parts.append("<h3>Extrapolation</h3>" + html_table(rows, keyed_columns(rows)))
    parts.append("</section>")
    return "".join(parts)


def keyed_columns(rows: Sequence[Mapping[str, Any]]) -> list[Column]:
    """A column for every key of the rows, in their order."""
    return [key_column(k) for k in dict.fromkeys(k for r in rows for k in r)]


def notes_section(doc: Doc) -> str:
    """What the run noted and what its samplers could not read."""
    items = [escape(str(n)) for n in doc.get("notes") or ()]
    for node, errors in (doc.get("sampler_errors") or {}).items():
        items += [f"sampler on <code>{escape(node[:12])}</code>: {escape(str(e))}" for e in errors]
    if not items:
        return ""
    return (
        '<section id="notes"><h2>Notes</h2><ul>' + "".join(f"<li>{i}</li>" for i in items) + "</ul></section>"
    )


def row_kind(row: Mapping[str, Any]) -> str:
    """A session node's row: its step invalid, out of service, or out of service yet serving."""
    if not row["in_service"]:
        return "stray" if row["node"].get("turns") else "out"
    return "" if row["step"]["valid"] else "invalid"


def tables_section(doc: Doc) -> str:
    steps = doc["steps"]
    out = [
        '<section id="tables"><h2>Steps</h2>',
        html_table(steps, STEP_COLUMNS, ["" if s["valid"] else "invalid" for s in steps]),
        '<h2>Session nodes, step by step</h2><p class="note">In each step, the nodes in service first; greyed: the nodes out of service (red if they served turns all the same).</p>',
    ]
    rows = node_rows(doc)
    kinds = [row_kind(r) for r in rows]
    out.append(html_table(rows, NODE_COLUMNS, kinds))
    failures = [
        {"step": s["index"], "code": code, "count": n}
        for s in steps
        for code, n in sorted((s.get("failures") or {}).items())
        if n
    ]
    if failures:
        out += ["<h3>Failures by type</h3>", html_table(failures, FAILURE_COLUMNS)]
    accelerators = [{"step": s, "node": a} for s in steps for a in s.get("accelerators") or ()]
    if accelerators:
        out += ["<h2>Accelerator nodes</h2>", html_table(accelerators, ACCELERATOR_COLUMNS)]
    out.append("</section>")
    return "".join(out)


def body_html(doc: Doc, *, live: bool = False) -> str:
    """Everything below the title: the status, the headline figures, the charts, why steps
    are invalid, the tables, the model and the provenance."""
    return "".join(
        [
            subtitle(doc) if live else "",
            banner(doc, live),
            cards(doc),
            '<h2>Figures</h2><div class="charts">',
            *charts(doc),
            "</div>",
            "<h2>Valid and invalid steps</h2>",
            invalid_section(doc),
            tables_section(doc),
            model_section(doc),
            notes_section(doc),
            provenance(doc),
        ]
    )


def head(title: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{escape(title)}</title><style>{style()}</style></head>'
    )


def subtitle(doc: Doc) -> str:
    prov = doc["provenance"]
    return (
        f'<p class="sub">responses-ws {escape(prov["project_version"])} · Ray {escape(prov["ray_version"])}'
        f" · started {escape(prov['started_at'])} · <code>{escape(prov['command'])}</code></p>"
    )


def title_block(doc: Doc | None) -> str:
    return "<h1>Scaling experiment</h1>" + (subtitle(doc) if doc is not None else "")


def report_html(doc: Doc) -> str:
    """``report.html``: one file, nothing fetched, readable offline."""
    return (
        head("Scaling experiment — report")
        + f'<body><main>{title_block(doc)}<div id="content">{body_html(doc)}</div>'
        + "<footer>Written by <code>responses-ws bench scaling</code>. The data, beside this file: "
        + ", ".join(f'<a href="{name}">{name}</a>' for name in DATA_FILES)
        + " (scaling.json's schema: scaling.schema.json in the lab's bench/report package; "
        "<code>python -m bench.report scaling.json</code> writes this report again).</footer></main></body></html>"
    )
