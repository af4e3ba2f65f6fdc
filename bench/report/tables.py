"""The steps of a run as tables: ``scaling.csv`` (one row a step), ``scaling-nodes.csv`` (one
row a session node a step) and ``scaling.md`` (both, in markdown).  The columns are the tables
below: a name and how a row's value is read from the document."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..stats import median

Row = Mapping[str, Any]
Column = tuple[str, Callable[[Row], Any]]


def dig(row: Row, *keys: str) -> Any:
    """``row[k1][k2]…``, None where a level is missing or null."""
    value: Any = row
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def client_max(step: Row, key: str) -> float | None:
    values = [c[key] for c in step.get("clients") or () if c.get(key) is not None]
    return max(values) if values else None


def role_ms(step: Row, role: str) -> float | None:
    """A role's CPU ms a turn over the step's session nodes, weighted by the turns each served."""
    weighted = [
        (n["turns"], v)
        for n in step.get("nodes") or ()
        if n.get("turns") and (v := dig(n, "cpu_ms_per_turn", role)) is not None
    ]
    turns = sum(t for t, _ in weighted)
    return sum(t * v for t, v in weighted) / turns if turns else None


STEP_COLUMNS: Sequence[Column] = (
    ("step", lambda s: s["index"]),
    ("repeat", lambda s: s.get("repeat", 0)),
    ("transport", lambda s: s["transport"]),
    ("session_nodes", lambda s: s["session_nodes"]),
    ("loops_per_node", lambda s: s["loops_per_node"]),
    ("loops", lambda s: s["loops"]),
    ("valid", lambda s: s["valid"]),
    ("invalid_reason", lambda s: s.get("invalid_reason")),
    ("turns", lambda s: s["turns"]),
    ("turns_per_s", lambda s: s["turns_per_s"]),
    ("nonmodel_p50_ms", lambda s: dig(s, "nonmodel_ms", "p50")),
    ("nonmodel_p99_ms", lambda s: dig(s, "nonmodel_ms", "p99")),
    ("ttft_p50_ms", lambda s: dig(s, "ttft_ms", "p50")),
    ("ttft_p99_ms", lambda s: dig(s, "ttft_ms", "p99")),
    ("failures", lambda s: sum((s.get("failures") or {}).values())),
    ("gateway_cpu_ms_per_turn", lambda s: role_ms(s, "gateway")),
    ("session_host_cpu_ms_per_turn", lambda s: role_ms(s, "session_host")),
    ("ray_cpu_ms_per_turn", lambda s: role_ms(s, "ray")),
    ("client_cpu_max", lambda s: client_max(s, "cpu_fraction")),
    ("client_lag_p99_max_ms", lambda s: client_max(s, "lag_p99_ms")),
    ("prefix_cache_hit_rate", lambda s: s.get("prefix_cache_hit_rate")),
    ("store_commands_per_turn", lambda s: dig(s, "store", "commands_per_turn")),
    ("store_bytes_per_turn", lambda s: dig(s, "store", "bytes_per_turn")),
)

NODE_COLUMNS: Sequence[Column] = (
    ("step", lambda r: r["step"]["index"]),
    ("transport", lambda r: r["step"]["transport"]),
    ("session_nodes", lambda r: r["step"]["session_nodes"]),
    ("loops", lambda r: r["step"]["loops"]),
    ("node_ip", lambda r: r["node"]["node_ip"]),
    ("node_id", lambda r: r["node"]["node_id"]),
    ("in_service", lambda r: r["in_service"]),
    ("turns", lambda r: r["node"].get("turns")),
    ("turns_share", lambda r: turns_share(r["step"], r["node"]) if r["in_service"] else None),
    ("connections_share", lambda r: r["node"].get("connections_share")),
    ("gateway_cpu_ms_per_turn", lambda r: dig(r["node"], "cpu_ms_per_turn", "gateway")),
    ("session_host_cpu_ms_per_turn", lambda r: dig(r["node"], "cpu_ms_per_turn", "session_host")),
    ("ray_cpu_ms_per_turn", lambda r: dig(r["node"], "cpu_ms_per_turn", "ray")),
    ("total_cpu_ms_per_turn", lambda r: dig(r["node"], "cpu_ms_per_turn", "total")),
)


def turns_share(step: Row, node: Row) -> float | None:
    served = served_turns(step)
    return node["turns"] / served if served and node.get("turns") is not None else None


def served_turns(step: Row) -> int:
    """The turns the step's session nodes served, as far as known (a node's may be null)."""
    return sum(n.get("turns") or 0 for n in step.get("nodes") or ())


def node_rows(doc: Row) -> list[Row]:
    """A row a session node a step: those in service, then those out of it (whose turns
    should be none)."""
    return [
        {"step": s, "node": n, "in_service": key == "nodes"}
        for s in doc["steps"]
        for key in ("nodes", "out_of_service")
        for n in s.get(key) or ()
    ]


def cell(value: Any) -> str:
    """A value as the tables write it: floats to 4 significant figures, nothing for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    return str(value)


def table(rows: Sequence[Row], columns: Sequence[Column]) -> list[list[str]]:
    """The header and one list of cells a row."""
    return [[name for name, _ in columns]] + [[cell(get(r)) for _, get in columns] for r in rows]


def to_csv(cells: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(cells)
    return out.getvalue()


def to_markdown(cells: list[list[str]]) -> str:
    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"

    header, *body = cells
    return "\n".join([line(header), "| " + " | ".join("---" for _ in header) + " |", *map(line, body)]) + "\n"


def steps_csv(doc: Row) -> str:
    return to_csv(table(doc["steps"], STEP_COLUMNS))


def nodes_csv(doc: Row) -> str:
    return to_csv(table(node_rows(doc), NODE_COLUMNS))


def markdown(doc: Row) -> str:
    """``scaling.md``: the command, then the steps and the session nodes as tables."""
    prov = doc["provenance"]
    status = "" if doc.get("complete", True) else "\n**Partial run**: it ended before the sweep did.\n"
    invalid = "".join(
        f"- step {s['index']}: {s.get('invalid_reason') or 'clients saturated'}\n"
        for s in doc["steps"]
        if not s["valid"]
    )
    invalid_md = (
        "\n## Invalid steps\n\nTheir load clients were saturated (or the step failed): their figures are "
        f"the clients', not the server's.\n\n{invalid}"
        if invalid
        else ""
    )
    savings = "".join(
        f"- ws against {v['transport']} ({v['pairs']} matched valid steps, medians): turns/s "
        f"{cell_change(v['turns_per_s'])}, non-model p50 {cell_change(v['nonmodel_p50'])}, "
        f"p99 {cell_change(v['nonmodel_p99'])}\n"
        for v in versus(doc)
    )
    savings_md = f"\n## Transports\n\n{savings}" if savings else ""
    return (
        "# Scaling experiment\n\n"
        f"`{prov['command']}`\n\n"
        f"responses-ws {prov['project_version']} (commit {prov.get('git_commit') or 'unknown'}), "
        f"Ray {prov['ray_version']}, started {prov['started_at']}.\n{status}\n"
        "## Steps\n\n"
        f"{to_markdown(table(doc['steps'], STEP_COLUMNS))}\n"
        "## Session nodes\n\n"
        f"{to_markdown(table(node_rows(doc), NODE_COLUMNS))}"
        f"{invalid_md}{savings_md}"
    )


def cell_change(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0%}"


def change(pairs: Sequence[tuple[Row, Row]], get: Callable[[Row], Any]) -> float | None:
    """The median of ``get(b) / get(o) - 1`` over the ``(o, b)`` pairs that have both."""
    ratios = [vb / vo - 1 for vo, vb in ((get(o), get(b)) for o, b in pairs) if vo and vb is not None]
    return median(ratios, None)


def versus(doc: Row, base: str = "ws") -> list[dict[str, Any]]:
    """What ``base`` changes against each other transport of the run: the median, over the
    valid steps that match (same session nodes, loops per node and repeat), of ``base``'s
    figure over the other's, less one (−0.4: 40 % less), for turns/s and p50/p99 non-model
    time; with the number of matched pairs."""
    by_key = {
        (s["transport"], s["session_nodes"], s["loops_per_node"], s.get("repeat", 0)): s
        for s in doc["steps"]
        if s["valid"]
    }
    out = []
    for other in dict.fromkeys(s["transport"] for s in doc["steps"]):
        if other == base:
            continue
        pairs = [
            (s, by_key[(base, *key[1:])])
            for key, s in by_key.items()
            if key[0] == other and (base, *key[1:]) in by_key
        ]
        if not pairs:
            continue

        out.append(
            {
                "transport": other,
                "pairs": len(pairs),
                "turns_per_s": change(pairs, lambda s: s["turns_per_s"]),
                "nonmodel_p50": change(pairs, lambda s: dig(s, "nonmodel_ms", "p50")),
                "nonmodel_p99": change(pairs, lambda s: dig(s, "nonmodel_ms", "p99")),
            }
        )
    return out
