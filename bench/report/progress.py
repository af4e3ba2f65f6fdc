"""One line a step for the driver's terminal, printed as each step finishes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONNECT = "connect:"  # a failed connection attempt's prefix in a step's failures (bench/runner)


def fmt_ms(value: Any) -> str:
    """``4.1`` ms, ``—`` when there is no figure."""
    if value is None:
        return "—"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def progress_line(step: Mapping[str, Any], total_steps: int) -> str:
    """``[ 3/12] ws  2 session nodes  16 loops (8/node)  412.3 turns/s  non-model p50 4.1
    p99 12.0 ms  TTFT p50 40.0 p99 90.0 ms  ok`` — ``INVALID (reason)`` when the step's clients
    were saturated, and the failures when there were any (failed turns, and failed connection
    attempts apart)."""
    width = len(str(total_steps))
    nonmodel = step.get("nonmodel_ms") or {}
    ttft = step.get("ttft_ms") or {}
    nodes = step["session_nodes"]
    parts = [
        f"[{step['index'] + 1:>{width}}/{total_steps}]",
        f"{step['transport']:<12}",
        f"{nodes} session node{'s' if nodes != 1 else ''}",
        f"{step['loops']} loop{'s' if step['loops'] != 1 else ''} ({step['loops_per_node']}/node)",
        f"{step['turns_per_s']:.1f} turns/s",
        f"non-model p50 {fmt_ms(nonmodel.get('p50'))} p99 {fmt_ms(nonmodel.get('p99'))} ms",
        f"TTFT p50 {fmt_ms(ttft.get('p50'))} p99 {fmt_ms(ttft.get('p99'))} ms",
    ]
    failures = step.get("failures") or {}
    connects = sum(n for k, n in failures.items() if k.startswith(CONNECT))
    failed = sum(failures.values()) - connects
    if failed:
        parts.append(f"{failed} failed")
    if connects:
        parts.append(f"{connects} connect attempt{'s' if connects != 1 else ''} failed")
    if step["valid"]:
        parts.append("ok")
    else:
        parts.append(f"INVALID ({step.get('invalid_reason') or 'clients saturated'})")
    return "  ".join(parts)
