"""What a replay measured: per session and in total, per transport, the time split (tool,
model, API overhead), bytes uploaded, prefill and cached tokens, what WebSocket mode saves;
the fidelity of each step (recorded against replayed sizes); the text report, the JSON
payload and the time-per-step chart.

``api_overhead_s`` is the end-to-end time minus tool time, the server-reported model time
(queue + prefill + decode) and any human gaps waited for: the API's own work, connecting,
the network and the client between steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .driver import SessionRun
from .shape import SessionShape

SUMMED = (
    "steps",
    "e2e_s",
    "tool_s",
    "model_s",
    "gap_s",
    "api_overhead_s",
    "bytes_sent",
    "prefill_tokens",
    "cached_tokens",
    "write_30m_tokens",
    "write_12h_tokens",
    "output_tokens",
    "reasoning_tokens",
)


def summarise(run: SessionRun) -> dict[str, Any]:
    done = [s for s in run.steps if s.error is None]
    models = [s.model_ms for s in done if s.model_ms is not None]
    model_s = sum(models) / 1000 if models and len(models) == len(done) else None
    tool_s = sum(s.tool_ms for s in done) / 1000
    gap_s = sum(s.gap_ms for s in done) / 1000
    return {
        "steps": len(done),
        "e2e_s": run.e2e_s,
        "tool_s": tool_s,
        "model_s": model_s,
        "gap_s": gap_s,
        "api_overhead_s": None if model_s is None else max(0.0, run.e2e_s - tool_s - model_s - gap_s),
        "bytes_sent": sum(s.request_bytes for s in done),
        "bytes_per_step": [s.request_bytes for s in done],
        "prefill_tokens": sum(s.input_tokens - s.cached_tokens for s in done),
        "cached_tokens": sum(s.cached_tokens for s in done),
        # Written to the prompt cache, by lifetime (bench.breakpoints.figures).
        "write_30m_tokens": sum(s.write_30m_tokens for s in done),
        "write_12h_tokens": sum(s.write_12h_tokens for s in done),
        "output_tokens": sum(s.output_tokens for s in done),
        "reasoning_tokens": sum(s.reasoning_tokens for s in done),
        "connect_ms": run.connect_ms,
        "skipped": run.skipped,
        "error": run.error,
        "per_step": [vars(s) for s in run.steps],
    }


def savings(transports: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """What ``ws`` saves against each other transport: end-to-end and API-overhead
    seconds (absolute and as a share of the other's) and bytes uploaded."""
    ws = transports.get("ws")
    out: dict[str, dict[str, float | None]] = {}
    if ws is None:
        return out
    for name, other in transports.items():
        if name == "ws":
            continue
        e2e = other["e2e_s"] - ws["e2e_s"]
        api = (
            other["api_overhead_s"] - ws["api_overhead_s"]
            if other["api_overhead_s"] is not None and ws["api_overhead_s"] is not None
            else None
        )
        out[name] = {
            "e2e_s": e2e,
            "e2e_share": e2e / other["e2e_s"] if other["e2e_s"] else None,
            "api_overhead_s": api,
            "api_overhead_share": api / other["api_overhead_s"]
            if api is not None and other["api_overhead_s"]
            else None,
            "bytes_sent": other["bytes_sent"] - ws["bytes_sent"],
        }
    return out


def fidelity(session: SessionShape, runs: dict[str, SessionRun]) -> list[dict[str, Any]]:
    """Per step: the recorded usage (the provider's tokenizer), the planned output (cl100k:
    what the replay asked for), what each transport's response reported, calls and tool time."""
    rows = []
    for step in session.steps:
        row: dict[str, Any] = {
            "step": step.index,
            "new_chain": step.new_chain,
            "recorded_output_tokens": step.recorded.output_tokens if step.recorded else None,
            "recorded_input_tokens": step.recorded.input_tokens if step.recorded else None,
            "planned": {
                "reasoning": step.reasoning_tokens,
                "text": step.text_tokens,
                "arguments": sum(c.argument_tokens for c in step.calls),
                "total": step.output_tokens,
                "calls": len(step.calls),
                "reasoning_source": step.reasoning_source,
                "reasoning_reported": step.reasoning_reported,
            },
            "recorded_tool_s": step.tool_s,
            "replayed": {},
        }
        for name, run in runs.items():
            rec = next((s for s in run.steps if s.step == step.index), None)
            row["replayed"][name] = (
                None
                if rec is None or rec.error
                else {
                    "output_tokens": rec.output_tokens,
                    "reasoning_tokens": rec.reasoning_tokens,
                    "calls": rec.calls,
                    "tool_s": rec.tool_ms / 1000,
                    "input_tokens": rec.input_tokens,
                }
            )
        rows.append(row)
    return rows


def session_payload(session: SessionShape, runs: dict[str, SessionRun]) -> dict[str, Any]:
    transports = {name: summarise(run) for name, run in runs.items()}
    return {
        "label": session.label,
        "format": session.format,
        "model": session.model,
        "recorded_steps": len(session.steps),
        "chains": 1 + sum(s.new_chain for s in session.steps),
        "instructions_tokens": session.instructions_tokens,
        "instructions_source": session.instructions_source,
        "transports": transports,
        "websocket_saves": savings(transports),
        "fidelity": fidelity(session, runs),
        "skipped": [s.model_dump() for s in session.skipped],
    }


def total(sessions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    transports: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for name, t in s["transports"].items():
            acc = transports.setdefault(name, dict.fromkeys(SUMMED, 0))
            for key in SUMMED:
                acc[key] = None if acc[key] is None or t[key] is None else acc[key] + t[key]
    return {"transports": transports, "websocket_saves": savings(transports)}


# --------------------------------------------------------------------------- text


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(payload: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for s in payload["sessions"]:
        lines += [
            f"session {s['label']} ({s['format']}, recorded model {s['model']}): {s['recorded_steps']} steps, "
            f"{s['chains']} chain(s), instructions {s['instructions_tokens']} tokens "
            f"({s['instructions_source']})",
            *_table(s["transports"]),
            *_saves(s["websocket_saves"]),
            *_per_step(s["transports"]),
            *_fidelity(s["fidelity"], list(s["transports"])),
            *_skipped(s),
            "",
        ]
    if len(payload["sessions"]) > 1:
        lines += [
            "all sessions",
            *_table(payload["total"]["transports"]),
            *_saves(payload["total"]["websocket_saves"]),
        ]
    return lines


def _table(transports: dict[str, dict[str, Any]]) -> list[str]:
    head = (
        f"  {'transport':<13}{'steps':>6}{'e2e s':>9}{'tool s':>9}{'model s':>9}{'API s':>8}"
        f"{'sent KB':>10}{'prefill':>9}{'cached':>9}{'output':>8}"
    )
    rows = [head]
    for name, t in transports.items():
        rows.append(
            f"  {name:<13}{t['steps']:>6}{_s(t['e2e_s']):>9}{_s(t['tool_s']):>9}{_s(t['model_s']):>9}"
            f"{_s(t['api_overhead_s']):>8}{t['bytes_sent'] / 1000:>10.1f}{t['prefill_tokens']:>9}"
            f"{t['cached_tokens']:>9}{t['output_tokens']:>8}"
            + (f"  ERROR {t['error']}" if t.get("error") else "")
        )
    return rows


def _saves(saves: dict[str, dict[str, float | None]]) -> list[str]:
    out = []
    for name, v in saves.items():
        share = "" if v["e2e_share"] is None else f" ({v['e2e_share']:.1%})"
        api = (
            ""
            if v["api_overhead_s"] is None
            else (
                f", API overhead {v['api_overhead_s']:.2f} s"
                + ("" if v["api_overhead_share"] is None else f" ({v['api_overhead_share']:.1%})")
            )
        )
        sent = v["bytes_sent"]
        assert sent is not None  # every transport counts what it sent
        out.append(
            f"  WebSocket saves vs {name}: {v['e2e_s']:.2f} s end to end{share}{api}, "
            f"{sent / 1000:.1f} KB uploaded"
        )
    return out


def _per_step(transports: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for label, key, scale, fmt in (
        ("ms per step", "total_ms", 1, "{:.0f}"),
        ("KB sent per step", "request_bytes", 1000, "{:.1f}"),
    ):
        out.append(f"  {label}")
        for name, t in transports.items():
            values = " ".join(fmt.format(p[key] / scale) for p in t["per_step"] if p["error"] is None)
            out.append(f"    {name:<13}{values}")
    return out


def _fidelity(rows: list[dict[str, Any]], transports: list[str]) -> list[str]:
    out = [
        "  fidelity per step (output tokens: recorded by the provider | planned reasoning/text/arguments "
        "in cl100k, and where the reasoning figure came from: the log's usage breakdown (u), its "
        "readable reasoning (t), or the recorded output beyond the visible part alone (r), with the "
        "log's own figure | replayed per transport; calls; tool s recorded/replayed)"
    ]
    for r in rows:
        p = r["planned"]
        replayed = " ".join(
            "-" if r["replayed"].get(t) is None else str(r["replayed"][t]["output_tokens"])
            for t in transports
        )
        first = r["replayed"].get(transports[0]) if transports else None
        calls = f"{p['calls']}/{'-' if first is None else first['calls']}"
        tool = f"{r['recorded_tool_s']:.2f}/{'-' if first is None else format(first['tool_s'], '.2f')}"
        chain = "*" if r["new_chain"] else " "
        source = {"usage": "u", "text": "t", "residual": "r", "none": "-"}[p["reasoning_source"]]
        reported = "" if p["reasoning_reported"] is None else str(p["reasoning_reported"])
        out.append(
            f"  {chain}{r['step']:>3}  rec {_n(r['recorded_output_tokens']):>5} | plan "
            f"{p['reasoning']:>4}/{p['text']:>4}/{p['arguments']:>4} = {p['total']:>5}"
            f" {source}{reported:<5} | {replayed:<18} calls {calls:<5} tool {tool}"
        )
    recorded = [r for r in rows if r["recorded_output_tokens"] is not None]
    if recorded:
        rec = sum(r["recorded_output_tokens"] for r in recorded)
        plan = sum(r["planned"]["total"] for r in recorded)
        out.append(
            f"  output tokens of the steps with usage: recorded {rec}, planned {plan} ({plan / rec:.1%})"
        )
    out.append("  (* a new chain after a compaction)")
    return out


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def _skipped(s: dict[str, Any]) -> list[str]:
    out = [
        f"  skipped in the log: {k['count']}x {k['kind']} (first at line {k['first_line']}): {k['reason']}"
        for k in s["skipped"]
    ]
    for name, t in s["transports"].items():
        out += [f"  skipped by the replay on {name}: {n}x {reason}" for reason, n in t["skipped"].items()]
    return out


# --------------------------------------------------------------------------- chart


def plot(path: Path, payload: dict[str, Any]) -> Path:
    """Time per step (bars, per transport) and bytes uploaded per step, a row per session."""
    from ..plotting import pyplot, save

    plt = pyplot()
    sessions = payload["sessions"]
    fig, axes = plt.subplots(len(sessions), 2, figsize=(12, 3.2 * len(sessions)), squeeze=False)
    for row, s in zip(axes, sessions):
        names = list(s["transports"])
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            steps = [p for p in s["transports"][name]["per_step"] if p["error"] is None]
            xs = [p["step"] + (k - (len(names) - 1) / 2) * width for p in steps]
            row[0].bar(xs, [p["total_ms"] for p in steps], width, label=name)
            row[1].plot(
                [p["step"] for p in steps], [p["request_bytes"] / 1000 for p in steps], marker="o", label=name
            )
        row[0].set(
            title=f"{s['label'][:40]}: time per step", xlabel="step", ylabel="request → terminal event (ms)"
        )
        row[1].set(title="bytes uploaded per step", xlabel="step", ylabel="KB")
        row[0].legend(fontsize=8)
        row[1].legend(fontsize=8)
    return save(fig, path)
