"""The soak's result: numbers from the client's :class:`~bench.chains.Load`, the invariant
check and the memory timeline, as a JSON-able dict and as a table."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from .chains import Load, SoakPlan
from .invariants import RunCheck
from .processes import flatness
from .stats import pct

HELD_SHARE = 0.9  # a memory sample counts as "all connections held" from this share open


def _dist(values: list[float]) -> dict[str, float | None]:
    return {"p50": pct(values, 0.5), "p90": pct(values, 0.9), "p99": pct(values, 0.99), "n": len(values)}


def memory_summary(
    plan: SoakPlan, timeline: list[dict[str, Any]], baseline: dict | None
) -> dict[str, Any] | None:
    if not timeline or baseline is None:
        return None
    held = [s for s in timeline if s["open"] >= HELD_SHARE * plan.connections]
    served = [s["session_actors_uss_mb"] + s["gateway_uss_mb"] for s in held]
    base = baseline["session_actors"]["uss_mb"] + baseline["gateway"]["uss_mb"]
    peak_actors = max(s["session_actors_processes"] for s in timeline)
    # What the connections themselves hold: the held USS less an idle actor's worth per
    # session-actor process (an idle actor's USS as at the start) and the idle gateway.
    idle_actor = baseline["session_actors"]["uss_mb"] / max(1, baseline["session_actors"]["processes"])
    state = [
        s["session_actors_uss_mb"]
        - s["session_actors_processes"] * idle_actor
        + s["gateway_uss_mb"]
        - baseline["gateway"]["uss_mb"]
        for s in held
    ]
    return {
        "baseline_mb": {g: round(v["uss_mb"], 1) for g, v in baseline.items()},
        "baseline_session_actors": baseline["session_actors"]["processes"],
        "held_samples": len(held),
        "peak_session_actors": peak_actors,
        "held_uss_mb_median": statistics.median(served) if served else None,
        "per_connection_mb": (statistics.median(served) - base) / plan.connections if served else None,
        "per_connection_without_actor_processes_mb": statistics.median(state) / plan.connections
        if state
        else None,
        "session_and_gateway": flatness(served),
        "inference": flatness([s["inference_uss_mb"] for s in held]),
        "sample_s": plan.sample_s,
    }


def idle_summary(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """USS with no connection open, after each run of the plan: a leak grows it run after
    run; the first run sets the allocators' high-water mark, so it is left out."""
    idle = [r["idle_mb"]["session_actors"] + r["idle_mb"]["gateway"] for r in runs if r.get("idle_mb")]
    if len(idle) < 2:
        return None
    return {
        "session_and_gateway_mb": idle,
        "after_first": flatness(idle[1:]),
        "change_after_first_mb": idle[-1] - idle[1] if len(idle) > 2 else None,
    }


def summarise(
    plan: SoakPlan,
    check: RunCheck,
    load: Load,
    timeline: list[dict[str, Any]],
    baseline: dict | None,
    runs: list[dict[str, Any]],
    cpu: dict[str, Any],
) -> dict[str, Any]:
    active = sum(r["wall_s"] for r in runs)
    return {
        "plan": asdict(plan),
        "wall_s": timeline[-1]["t_s"] if timeline else active,
        "runs": runs,
        "invariants": check.summary(),
        "connections": {
            "peak_held": load.peak_open,
            "opened": load.opened,
            "connect_ms": _dist(load.connect_ms),
        },
        "turns": {
            "completed": load.turns,
            "per_s": load.turns / active if active else None,
            "creates": check.counts["creates"],
        },
        "ttft_ms": _dist(load.ttft_ms),
        "model_ttft_ms": _dist(load.model_ttft_ms),
        "ttft_overhead_ms": _dist(load.overhead_ms),
        "queue_ms": _dist(load.queue_ms),
        "ttft_overhead_p50_ms_by_turn": {t: pct(v, 0.5) for t, v in sorted(load.overhead_by_turn.items())},
        "load_avg_1m_median": statistics.median(s["load_avg_1m"] for s in timeline) if timeline else None,
        "server_api_overhead_ms": _dist(load.api_overhead_ms),
        "model_ttft_source": dict(load.model_ttft_source),
        "memory": memory_summary(plan, timeline, baseline),
        "idle_memory": idle_summary(runs),
        "cpu": cpu,
        "timeline": timeline,
    }


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def render_table(result: dict[str, Any]):
    from rich.table import Table

    inv, mem = result["invariants"], result["memory"] or {}
    idle = (result["idle_memory"] or {}).get("session_and_gateway_mb", [])
    flat = mem.get("session_and_gateway") or {}
    runs = len(result["runs"])
    t = Table(
        title=f"Soak: {result['plan']['connections']} connections × {result['plan']['turns']} turns"
        + (f" × {runs} runs" if runs > 1 else "")
        + f" ({result['server'].get('connections_per_actor', '?')} per actor)"
    )
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("invariants", "OK" if inv["ok"] else f"VIOLATED {inv['violations']}"),
        (
            "creates / completed responses",
            f"{inv['counts'].get('creates', 0)} / {inv['counts'].get('completed', 0)}",
        ),
        (
            "connections held at once (peak) / opened",
            f"{result['connections']['peak_held']} / {result['connections']['opened']}",
        ),
        ("turns/s", _f(result["turns"]["per_s"])),
    ]
    for label, key in (
        ("client TTFT ms", "ttft_ms"),
        ("emulator TTFT (queue+prefill) ms", "model_ttft_ms"),
        ("TTFT overhead ms", "ttft_overhead_ms"),
        ("server api_overhead ms", "server_api_overhead_ms"),
    ):
        d = result[key]
        rows.append((f"{label} p50 / p99", f"{_f(d['p50'])} / {_f(d['p99'])}"))
    rows += [
        ("session actors (peak)", str(mem.get("peak_session_actors", "–"))),
        (
            "USS per connection MiB (actors+gateway) / without actor processes",
            f"{_f(mem.get('per_connection_mb'), '.2f')} / {_f(mem.get('per_connection_without_actor_processes_mb'), '.2f')}",
        ),
        (
            "USS middle → last third MiB",
            (
                f"{_f(flat.get('middle_mb'))} → {_f(flat.get('last_mb'))} "
                f"(band ±{_f(flat.get('band_mb'))}; flat: {flat.get('flat')})"
            ),
        ),
        ("idle USS after each run MiB (actors+gateway)", " ".join(f"{v:.0f}" for v in idle) or "–"),
        (
            "server / client CPU, cores",
            (
                f"{_f(result['cpu']['server_cores'], '.2f')} / "
                f"{_f(result['cpu']['client_process_cores'], '.2f')}"
            ),
        ),
        ("machine load average, 1 min (median)", _f(result["load_avg_1m_median"])),
        ("wall s", _f(result["wall_s"])),
    ]
    for row in rows:
        t.add_row(*row)
    return t
