"""The soak's plan and result: numbers from the load runner's turn records and client
figures, the invariant check and the memory timeline, as a JSON-able dict and as a table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import workload as wl
from .invariants import RunCheck
from .processes import flatness
from .runner import LoadResult, LoadSpec, TurnRecord
from .stats import median, pct, spread


@dataclass(frozen=True)
class SoakPlan:
    connections: int = 200  # agent loops, one connection each at a time
    turns: int = 30  # per chain (one connection)
    duration_s: float = 60.0  # after the ramp; chains reconnect with fresh ones until then
    ramp_s: float = 20.0  # the loops' first turns evenly spread over this
    think_ms: float = 5000.0  # client tool time between turns, mean (uniform ±50 %)
    system_tokens: int = 300
    tool_def_tokens: int = 600
    tool_output_tokens: int = 150
    text_tokens: int = 24
    model: str = "emu-fast"
    seed: int = 0
    sample_s: float | None = 3.0  # memory sampling period; None: no sampling
    clients: int = 1  # client processes
    chains: int | None = None  # chains per loop, then it stops (duration_s: a cap); None: until duration_s
    settle_s: float = 3.0  # after a run, before sampling idle memory: closes and flushes finish

    def workload(self, run: int = 0) -> wl.Workload:
        return wl.Workload(
            model=self.model,
            tool_rounds=self.turns - 1,
            system_tokens=self.system_tokens,
            tool_def_tokens=self.tool_def_tokens,
            task_tokens=40,
            tool_output_tokens=self.tool_output_tokens,
            text_tokens=self.text_tokens,
            tool_time_ms=self.think_ms,
            seed=self.seed + run,
        )

    def spec(self, url: str, run: int = 0) -> LoadSpec:
        """Run ``run`` of the plan on the load runner: a chain per connection (its ``codex``
        workload), every event checked; the measured window starts after the ramp, or with
        ``chains`` at the first turn and ends when every loop ran its chains."""
        return LoadSpec(
            targets=(url,),
            loops=self.connections,
            workload="codex",
            duration_s=self.duration_s,
            warmup_s=self.ramp_s if self.chains is None else 0.0,
            ramp_s=self.ramp_s,
            rollouts_per_loop=self.chains,
            seed=self.seed + run,
            custom_workload=self.workload(run),
            check_events=True,
        )


def model_ttft_ms(server: dict[str, float] | None) -> float | None:
    """The emulator's own time to first token for a response: ``queue + prefill`` as the
    replica reported them (the response's ``responses_ws.timings``)."""
    if not server or "prefill" not in server:
        return None
    return server.get("queue", 0.0) + server["prefill"]


def turn_of_chain(records: Sequence[TurnRecord]) -> list[tuple[int, TurnRecord]]:
    """Each record with its turn's place in its chain (1 for a chain's first)."""
    out: list[tuple[int, TurnRecord]] = []
    place: dict[int, int] = {}
    for r in sorted(records, key=lambda r: r.sent):
        place[r.loop] = 1 if r.kind != "steady" else place.get(r.loop, 0) + 1
        out.append((place[r.loop], r))
    return out


DIST = ("p50", "p90", "p99", "n")  # the figures of each latency's spread


def memory_summary(
    plan: SoakPlan,
    timeline: list[dict[str, Any]],
    baseline: dict | None,
    windows: Sequence[tuple[float, float]],
) -> dict[str, Any] | None:
    """The samples taken in a measured window (every loop past the ramp holds its
    connection but between chains) against the baseline before the first run."""
    if not timeline or baseline is None:
        return None
    held = [s for s in timeline if any(a <= s["t"] <= b for a, b in windows)]
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
    held_mb, own_mb = median(served, None), median(state, None)
    return {
        "baseline_mb": {g: round(v["uss_mb"], 1) for g, v in baseline.items()},
        "baseline_session_actors": baseline["session_actors"]["processes"],
        "held_samples": len(held),
        "peak_session_actors": peak_actors,
        "held_uss_mb_median": held_mb,
        "per_connection_mb": None if held_mb is None else (held_mb - base) / plan.connections,
        "per_connection_without_actor_processes_mb": None if own_mb is None else own_mb / plan.connections,
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
    loads: Sequence[LoadResult],
    timeline: list[dict[str, Any]],
    baseline: dict | None,
    runs: list[dict[str, Any]],
    cpu: dict[str, Any],
) -> dict[str, Any]:
    turns = [r for load in loads for r in load.in_window() if r.ok]
    active = sum(load.window[1] - load.window[0] for load in loads)
    model = [(r, model_ttft_ms(r.server)) for r in turns]
    overhead = {id(r): r.ttft_ms - m for r, m in model if r.ttft_ms is not None and m is not None}
    by_turn: dict[int, list[float]] = {}
    for place, r in turn_of_chain(turns):
        if id(r) in overhead:
            by_turn.setdefault(place, []).append(overhead[id(r)])
    every = [r for load in loads for r in load.records]
    return {
        "plan": asdict(plan),
        "wall_s": timeline[-1]["t_s"] if timeline else active,
        "runs": runs,
        "invariants": check.summary(),
        "connections": {
            "loops": plan.connections,
            "opened": check.counts["connections"],
            "connect_ms": spread((r.connect_ms for r in every), DIST),
        },
        "turns": {
            "completed": len(turns),
            "per_s": len(turns) / active if active else None,
            "creates": check.counts["creates"],
        },
        "ttft_ms": spread((r.ttft_ms for r in turns), DIST),
        "model_ttft_ms": spread((m for _, m in model), DIST),
        "ttft_overhead_ms": spread(overhead.values(), DIST),
        "queue_ms": spread(((r.server or {}).get("queue") for r in turns), DIST),
        "ttft_overhead_p50_ms_by_turn": {t: pct(v, 0.5) for t, v in sorted(by_turn.items())},
        "load_avg_1m_median": median((s["load_avg_1m"] for s in timeline), None),
        "server_api_overhead_ms": spread(((r.server or {}).get("api_overhead") for r in turns), DIST),
        "clients": {
            "valid": all(not load.saturated for load in loads),
            "invalid_reason": "; ".join(x for load in loads if (x := load.reason)) or None,
            "processes": [c.as_dict() for load in loads for c in load.clients],
        },
        "memory": memory_summary(plan, timeline, baseline, [load.window for load in loads]),
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
            "loops (a connection each) / connections opened",
            f"{result['connections']['loops']} / {result['connections']['opened']}",
        ),
        ("turns/s (the measured window)", _f(result["turns"]["per_s"])),
        (
            "clients valid (not saturated)",
            "yes" if result["clients"]["valid"] else result["clients"]["invalid_reason"],
        ),
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
