"""``bench admission``'s figures from the load runner's results (pure), its plot and its
printed summary.

The connects a phase opened are the runner's ``connects`` (each open's start and time) and its
``connect_failures`` (by type: ``connect:http_503``, ``connect:TimeoutError``, ...); the turns
are its records: ``first`` the create a connection sent as it opened (``--ramp-create``),
``held`` the turns on the held connections afterwards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import plotting
from .runner import LoadResult, TurnRecord
from .stats import pct


def quantiles(ms: Sequence[float], qs: tuple[str, ...] = ("p50", "p90", "p99")) -> dict[str, float | None]:
    v = sorted(ms)
    out: dict[str, float | None] = {q: pct(v, int(q[1:]) / 100) for q in qs}
    return out


def per_second(started: Sequence[float], took_ms: Sequence[float]) -> list[list[float]]:
    """[second of the arrival, connects started in it, their p50 ms, their max ms] for each
    second from the first start: where in a ramp the slow connects were (a host starting)."""
    if not started:
        return []
    t0 = min(started)
    bins: dict[int, list[float]] = {}
    for t, ms in zip(started, took_ms):
        bins.setdefault(int(t - t0), []).append(ms)
    return [
        [sec, len(v), round(pct(sorted(v), 0.5) or 0.0, 1), round(max(v), 1)]
        for sec, v in sorted(bins.items())
    ]


def connects(result: LoadResult) -> dict[str, Any]:
    """The connections a phase opened: how many, failures by type, latency percentiles and
    per second of the arrivals; with the creates sent on open when there were any."""
    began = [b for b, _ in result.connects]
    ms = [m for _, m in result.connects]
    out: dict[str, Any] = {
        "opened": len(ms),
        "failures": dict(result.connect_failures),
        "connect_ms": {**quantiles(ms), "max": max(ms, default=None)},
        "per_second": per_second(began, ms),
    }
    first = [r for r in result.records if r.kind == "first"]
    if first:
        out["create_on_open"] = {
            "completed": sum(r.ok for r in first),
            "failures": failures(first),
            "turn_ms": {
                **quantiles([r.total_ms for r in first if r.ok]),
                "max": max((r.total_ms for r in first if r.ok), default=None),
            },
        }
    return out


def failures(records: Sequence[TurnRecord]) -> dict[str, int]:
    return dict(Counter(r.error_code or "error" for r in records if not r.ok))


def held_turns(records: Sequence[TurnRecord], wanted: int, wall_s: float) -> dict[str, Any]:
    """The turns on the held connections (kind ``held``), sent all at once: completed of
    ``wanted``, failures by type, the rate over ``wall_s`` and the turn time's percentiles."""
    held = [r for r in records if r.kind == "held"]
    done = sum(r.ok for r in held)
    return {
        "turns_completed": done,
        "turns_wanted": wanted,
        "failures": failures(held),
        "wall_s": wall_s,
        "turns_per_s": done / wall_s if wall_s else None,
        "turn_ms": quantiles([r.total_ms for r in held if r.ok], ("p50", "p99")),
    }


def plot(result: dict, path: Path) -> None:
    ramps = result.get("ramp", [])
    fig, (ax1, ax2) = plotting.pyplot().subplots(1, 2, figsize=(11, 4))
    if ramps:
        rates = [r["rate"] for r in ramps]
        for q in ("p50", "p90", "p99"):
            ax1.plot(rates, [r["connect_ms"][q] for r in ramps], marker="o", label=q)
        ax1.set_xlabel("arrival rate (connections/s)")
        ax1.set_ylabel("connect latency (ms)")
        ax1.set_yscale("log")
        ax1.legend()
        ax1.set_title("connect latency vs arrival rate")
    curves = [(r["rate"], r["memory_curve"]) for r in ramps if r.get("memory_curve")]
    for rate, curve in curves[:1]:  # the first ramp starts from the freshest server
        xs, ys = zip(*curve)
        ax2.plot(xs, ys, marker=".", label=f"ramp at {rate:.0f}/s")
        ax2.set_xlabel("connections open")
        ax2.set_ylabel("server private memory added (MiB)")
        ax2.legend()
        ax2.set_title("memory vs connections")
    plotting.save(fig, path)


def print_summary(result: dict) -> None:
    from rich.console import Console

    c = Console(width=110)
    if "warm" in result:
        c.print(
            f"warm, idle server: connect p50 {result['warm']['connect_ms']['p50']:.1f} ms "
            f"(p90 {result['warm']['connect_ms']['p90']:.1f})"
        )
    if "burst" in result:
        b = result["burst"]
        t = b["turns"]
        c.print(
            f"burst {b['connections']}: opened {b['opened']}, failures {b['failures'] or 'none'}, connect p50 "
            f"{b['connect_ms']['p50']:.0f} / p99 {b['connect_ms']['p99']:.0f} ms; turns {t['turns_completed']}/"
            f"{t['turns_wanted']} in {t['wall_s']:.1f} s"
        )
    for r in result.get("ramp", []):
        h, t = r.get("held", {}), r["one_turn_on_all"]
        c.print(
            f"ramp {r['connections']} at {r['rate']:.0f}/s: opened {r['opened']}, failures {r['failures'] or 'none'}, "
            f"connect p50 {r['connect_ms']['p50']:.1f} / p99 {r['connect_ms']['p99']:.1f} ms; "
            + (
                f"{h['server_mib_per_conn']:.2f} MiB/conn held ({h['hosts_before']}→{h['hosts_after']} hosts), "
                f"CPU per conn: gateway {h['gateway_cpu_ms_per_conn']:.2f} + hosts {h['existing_hosts_cpu_ms_per_conn']:.2f} ms "
                f"(+ {h['new_hosts_cpu_s']:.1f} s starting hosts); "
                if h
                else ""
            )
            + f"one turn on all: {t['turns_completed']}/{t['turns_wanted']} in {t['wall_s']:.1f} s"
            + (f" (failed: {t['failures']})" if t.get("failures") else "")
        )
        if "create_on_open" in r:
            o = r["create_on_open"]
            c.print(
                f"  the create sent on open: {o['completed']} completed, failures {o['failures'] or 'none'}, "
                f"turn p50 {o['turn_ms']['p50']:.1f} / p99 {o['turn_ms']['p99']:.1f} ms"
            )
        c.print(
            "  per second of the ramp (connects started, p50 / max ms): "
            + " ".join(f"{sec}:{n} {p50:.0f}/{mx:.0f}" for sec, n, p50, mx in r.get("per_second", []))
        )
    if "idle" in result:
        i = result["idle"]
        h = i.get("held", {})
        c.print(
            f"idle {i['connections']}: opened {i['opened']}, failures {i['failures'] or 'none'}; "
            + (
                f"{h['server_mib_per_conn']:.2f} MiB/conn, idle CPU {i.get('idle_cpu_pct_of_a_core', 0):.1f}% of a core "
                f"({i.get('idle_cpu_us_per_conn_per_s', 0):.1f} µs/conn/s)"
                if h
                else ""
            )
            + (
                f"; one turn on all: {i['one_turn_on_all']['turns_completed']}/{i['one_turn_on_all']['turns_wanted']} "
                f"in {i['one_turn_on_all']['wall_s']:.1f} s (failed: {i['one_turn_on_all']['failures'] or 'none'})"
                if "one_turn_on_all" in i
                else ""
            )
        )
    if "http_load" in result:
        hl = result["http_load"]
        c.print(
            f"under {hl['http_clients']} HTTP clients (~{hl['http_tokens'] // 1000}k tokens, {hl['http_requests']} requests): "
            f"connect p50 {hl['idle']['connect_ms']['p50']:.1f} → {hl['under_http_load']['connect_ms']['p50']:.1f} ms, "
            f"/healthz p50 {hl['idle']['healthz_ms']['p50']:.1f} → {hl['under_http_load']['healthz_ms']['p50']:.1f} ms"
        )
