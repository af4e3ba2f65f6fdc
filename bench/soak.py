"""Load and soak: hundreds of WebSocket agent chains at once, every response checked.

    python -m bench.soak --connections 200 --turns 30 [--per-actor 64] [--duration 180]

Starts an embedded server (its own Ray; stopped at the end) unless ``--url`` is given and
opens ``--connections`` raw WebSockets from this one asyncio process, staggered over
``--ramp-s``.  Each runs an agent-like chain of ``--turns`` turns: ``response.create`` with
``store:false``, ``previous_response_id`` of its last response and only the new input (the
tool's ``function_call_output`` after a function call), a think/tool pause in between
(``--think-ms``, ±50 %).  The emulated model calls a tool on every turn but the last
(``metadata["emulator.tool_rounds"] = turns - 1``), so both event orders of spec §3.2/§3.3
occur.  With ``--duration`` a finished chain reconnects and starts a fresh one until the
duration is over (a soak with connection churn); without it each connection runs one chain.

Every event of every response goes through :mod:`bench.invariants`; any violation makes
the command exit 1.  Measured: connections held at once, turns and turns/s, TTFT as the
client sees it (create sent → first output delta), and TTFT overhead = client TTFT minus
the emulator's own time to first token for that request (``queue + prefill``, which the
inference replica reports per response through the server's ``responses_ws.timings``
metadata; the emulator's profile formula on the reported usage is the fallback); and the
private memory (USS) of the session actors and the gateway, sampled every ``--sample-s``:
per connection, and flat or not over time (:func:`bench.memory.flatness`).
Writes JSON (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import workload as wl
from .agentloop import TIMINGS_KEY, server_timings
from .invariants import ConnectionCheck, RunCheck
from .memory import CpuMeter, flatness, sample_uss
from .report import pct
from .transports import TurnOutcome, WebSocketTransport

APP = "responses-ws-soak"
HELD_SHARE = 0.9  # a memory sample counts as "all connections held" from this share open


@dataclass(frozen=True)
class SoakPlan:
    connections: int = 200
    turns: int = 30                  # per chain (one connection)
    duration_s: float | None = None  # reconnect with fresh chains until this much time passed
    ramp_s: float = 20.0             # connections open evenly spread over this
    think_ms: float = 5000.0         # client tool time between turns, mean (uniform ±50 %)
    system_tokens: int = 300
    tool_def_tokens: int = 600
    tool_output_tokens: int = 150
    text_tokens: int = 24
    model: str = "emu-fast"
    seed: int = 0
    sample_s: float | None = 3.0     # memory sampling period; None: no sampling
    drain_s: float = 0.05            # after a chain's last turn, wait this long for stray events

    def workload(self) -> wl.Workload:
        return wl.Workload(model=self.model, tool_rounds=self.turns - 1, system_tokens=self.system_tokens,
                           tool_def_tokens=self.tool_def_tokens, task_tokens=40,
                           tool_output_tokens=self.tool_output_tokens, text_tokens=self.text_tokens,
                           tool_time_ms=self.think_ms, seed=self.seed)


@dataclass
class Load:
    """What the client measured, besides the invariants."""

    open: int = 0
    peak_open: int = 0
    opened: int = 0
    turns: int = 0  # completed responses
    connect_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    model_ttft_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    api_overhead_ms: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)  # monotonic time of each completed turn
    overhead_by_turn: dict[int, list[float]] = field(default_factory=dict)  # turn of its chain → ms
    model_ttft_source: Counter[str] = field(default_factory=Counter)

    def connected(self, ms: float) -> None:
        self.open += 1
        self.opened += 1
        self.peak_open = max(self.peak_open, self.open)
        self.connect_ms.append(ms)

    def record(self, turn: int, out: TurnOutcome, profile: Any) -> None:
        if out.error or out.response is None:
            return
        self.turns += 1
        self.done_at.append(time.monotonic())
        model, source = model_ttft_ms(out.response, profile)
        self.model_ttft_source[source] += 1
        timings = server_timings(out.response) or {}
        if "api_overhead" in timings:
            self.api_overhead_ms.append(timings["api_overhead"])
        if "queue" in timings:
            self.queue_ms.append(timings["queue"])
        if out.ttft_s is not None:
            self.ttft_ms.append(out.ttft_s * 1000)
            if model is not None:
                self.model_ttft_ms.append(model)
                self.overhead_ms.append(out.ttft_s * 1000 - model)
                self.overhead_by_turn.setdefault(turn, []).append(self.overhead_ms[-1])


def model_ttft_ms(response: dict[str, Any], profile: Any) -> tuple[float | None, str]:
    """The emulator's own time to first token for this response: ``queue + prefill`` as the
    replica reported them (``timings``), else the profile's prefill formula on the reported
    usage (``profile``; no queue, and cached tokens rounded down to 128, so it may charge up
    to 127 tokens of prefill too many)."""
    t = server_timings(response)
    if t and "prefill" in t:
        return t.get("queue", 0.0) + t["prefill"], "timings"
    if profile is not None:
        from inference.pacing import ttft_ms

        usage = response.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        return ttft_ms(profile, usage.get("input_tokens", 0), cached), "profile"
    return None, "none"


class CheckedWebSocket(WebSocketTransport):
    """The benchmark's ``ws`` transport with every create and event shown to a checker."""

    def __init__(self, base_url: str, check: ConnectionCheck) -> None:
        super().__init__(base_url)
        self.check = check

    async def _events(self):
        async for ev in super()._events():
            self.check.feed(ev)
            yield ev

    async def turn(self, base, new_items):
        self.check.create_sent(self._prev)
        return await super().turn(base, new_items)

    async def drain(self, timeout_s: float) -> None:
        """Events that arrive after the last terminal are stray: let the checker see them."""
        with contextlib.suppress(TimeoutError):
            while True:  # websockets' recv() is cancellation-safe
                self.check.feed(json.loads(await asyncio.wait_for(self._ws.recv(), timeout_s)))


async def run_slot(slot: int, url: str, plan: SoakPlan, check: RunCheck, load: Load,
                   t_end: float | None, profile: Any) -> None:
    """One connection slot: chains, one connection each, until ``t_end`` (or one chain)."""
    await asyncio.sleep(slot * plan.ramp_s / max(1, plan.connections))
    w = plan.workload()
    instructions, tools = wl.instructions(w.system_tokens, w.seed), wl.tools(w)
    chain = 0
    while True:
        rollout = slot * 100_000 + chain
        conn = check.connection(f"c{slot}.{chain}")
        ws = CheckedWebSocket(url, conn)
        base = {"model": w.model, "instructions": instructions, "tools": tools,
                "metadata": {**wl.metadata(w, rollout), TIMINGS_KEY: "1"}}
        items: list[dict[str, Any]] = [{"role": "user", "content": wl.task(w, rollout)}]
        t0 = time.perf_counter()
        try:
            await ws.open()
        except Exception as exc:  # noqa: BLE001 - a refused connection is a result
            check.violate("connection", conn.name, None, f"connect: {type(exc).__name__}: {exc}")
            return
        load.connected((time.perf_counter() - t0) * 1000)
        try:
            for turn in range(1, plan.turns + 1):
                out = await ws.turn(base, items)
                load.record(turn, out, profile)
                if out.error or out.response is None or turn == plan.turns:
                    break
                await asyncio.sleep(wl.tool_time_s(w, rollout, turn))
                calls = [o for o in out.response["output"] if o.get("type") == "function_call"]
                items = ([{"type": "function_call_output", "call_id": c["call_id"],
                           "output": wl.tool_output(w, rollout, turn, i, c["name"])} for i, c in enumerate(calls)]
                         or [{"role": "user", "content": "Go on."}])
            await ws.drain(plan.drain_s)
        except Exception as exc:  # noqa: BLE001 - e.g. the server closed the socket mid-chain
            check.violate("connection", conn.name, None, f"{type(exc).__name__}: {exc}"[:300])
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await ws.close()
            load.open -= 1
        chain += 1
        if t_end is None or time.monotonic() >= t_end:
            return


def process_groups(app: str) -> dict[str, str]:
    return {"session_actors": "SessionHost", "gateway": f"ServeReplica:{app}:Gateway",
            "inference": f"ServeReplica:{app}:InferenceDeployment"}


async def _sample(groups: dict[str, str], load: Load, t0: float, every: float, stop: asyncio.Event,
                  timeline: list[dict[str, Any]], cpu: CpuMeter) -> None:
    """Every ``every`` seconds until ``stop`` (and once more then): memory, CPU, load."""
    seen = 0
    while True:
        snap = await asyncio.to_thread(sample_uss, groups)
        recent, seen = load.overhead_ms[seen:], len(load.overhead_ms)
        for v in snap.values():
            cpu.add(v["cpu_s"])
        timeline.append({"t_s": round(time.monotonic() - t0, 2), "open": load.open, "turns": load.turns,
                         "load_avg_1m": os.getloadavg()[0], "ttft_overhead_p50_ms": pct(recent, 0.5),
                         **{f"{g}_uss_mb": round(v["uss_mb"], 1) for g, v in snap.items()},
                         **{f"{g}_processes": v["processes"] for g, v in snap.items()}})
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def soak(url: str, plan: SoakPlan, *, app: str = APP) -> dict[str, Any]:
    """Run the plan against the server at ``url``; the result as a JSON-able dict."""
    profile = None
    with contextlib.suppress(Exception):
        from inference.profiles import load_inference_config

        profile = load_inference_config().profile(plan.model)
    check, load, timeline = RunCheck(), Load(), []
    groups = process_groups(app)
    sampling = plan.sample_s is not None
    baseline = await asyncio.to_thread(sample_uss, groups) if sampling else None
    meter, me = CpuMeter(), psutil.Process()
    me0 = me.cpu_times()
    stop = asyncio.Event()
    t0 = time.monotonic()
    t_end = t0 + plan.duration_s if plan.duration_s else None
    sampler = (asyncio.create_task(_sample(groups, load, t0, plan.sample_s, stop, timeline, meter))
               if sampling else None)
    await asyncio.gather(*(run_slot(s, url, plan, check, load, t_end, profile) for s in range(plan.connections)))
    wall = time.monotonic() - t0
    stop.set()
    if sampler is not None:
        await sampler
    me1 = me.cpu_times()
    cpu = {"server_cores": meter.used_s() / wall if sampling else None,
           "client_process_cores": (me1.user + me1.system - me0.user - me0.system) / wall}
    return summarise(plan, check, load, timeline, baseline, wall, cpu)


def _dist(values: list[float]) -> dict[str, float | None]:
    return {"p50": pct(values, 0.5), "p90": pct(values, 0.9), "p99": pct(values, 0.99), "n": len(values)}


def memory_summary(plan: SoakPlan, timeline: list[dict[str, Any]], baseline: dict | None) -> dict[str, Any] | None:
    if not timeline or baseline is None:
        return None
    held = [s for s in timeline if s["open"] >= HELD_SHARE * plan.connections]
    served = [s["session_actors_uss_mb"] + s["gateway_uss_mb"] for s in held]
    base = baseline["session_actors"]["uss_mb"] + baseline["gateway"]["uss_mb"]
    peak_actors = max(s["session_actors_processes"] for s in timeline)
    return {
        "baseline_mb": {g: round(v["uss_mb"], 1) for g, v in baseline.items()},
        "baseline_session_actors": baseline["session_actors"]["processes"],
        "held_samples": len(held), "peak_session_actors": peak_actors,
        "held_uss_mb_median": statistics.median(served) if served else None,
        "per_connection_mb": (statistics.median(served) - base) / plan.connections if served else None,
        "session_and_gateway": flatness(served),
        "inference": flatness([s["inference_uss_mb"] for s in held]),
        "sample_s": plan.sample_s,
    }


def summarise(plan: SoakPlan, check: RunCheck, load: Load, timeline: list[dict[str, Any]],
              baseline: dict | None, wall: float, cpu: dict[str, Any]) -> dict[str, Any]:
    done = sorted(load.done_at)
    span = (done[-1] - done[0]) if len(done) > 1 else 0.0
    return {
        "plan": asdict(plan), "wall_s": wall, "invariants": check.summary(),
        "connections": {"peak_held": load.peak_open, "opened": load.opened, "connect_ms": _dist(load.connect_ms)},
        "turns": {"completed": load.turns, "per_s": load.turns / span if span else None,
                  "creates": check.counts["creates"]},
        "ttft_ms": _dist(load.ttft_ms), "model_ttft_ms": _dist(load.model_ttft_ms),
        "ttft_overhead_ms": _dist(load.overhead_ms), "queue_ms": _dist(load.queue_ms),
        "ttft_overhead_p50_ms_by_turn": {t: pct(v, 0.5) for t, v in sorted(load.overhead_by_turn.items())},
        "load_avg_1m_median": statistics.median(s["load_avg_1m"] for s in timeline) if timeline else None,
        "server_api_overhead_ms": _dist(load.api_overhead_ms),
        "model_ttft_source": dict(load.model_ttft_source),
        "memory": memory_summary(plan, timeline, baseline), "cpu": cpu, "timeline": timeline,
    }


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def render_table(result: dict[str, Any]):
    from rich.table import Table

    inv, mem = result["invariants"], result["memory"] or {}
    flat = mem.get("session_and_gateway") or {}
    t = Table(title=f"Soak: {result['plan']['connections']} connections × {result['plan']['turns']} turns"
                    f" ({result['server'].get('connections_per_actor', '?')} per actor)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("invariants", "OK" if inv["ok"] else f"VIOLATED {inv['violations']}"),
        ("creates / completed responses", f"{inv['counts'].get('creates', 0)} / {inv['counts'].get('completed', 0)}"),
        ("connections held at once (peak) / opened", f"{result['connections']['peak_held']} / {result['connections']['opened']}"),
        ("turns/s", _f(result["turns"]["per_s"])),
    ]
    for label, key in (("client TTFT ms", "ttft_ms"), ("emulator TTFT (queue+prefill) ms", "model_ttft_ms"),
                       ("TTFT overhead ms", "ttft_overhead_ms"), ("server api_overhead ms", "server_api_overhead_ms")):
        d = result[key]
        rows.append((f"{label} p50 / p99", f"{_f(d['p50'])} / {_f(d['p99'])}"))
    rows += [
        ("session actors (peak)", str(mem.get("peak_session_actors", "–"))),
        ("USS per connection MiB (actors+gateway)", _f(mem.get("per_connection_mb"), ".2f")),
        ("USS middle → last third MiB", (f"{_f(flat.get('middle_mb'))} → {_f(flat.get('last_mb'))} "
                                         f"(band ±{_f(flat.get('band_mb'))}; flat: {flat.get('flat')})")),
        ("server / client CPU, cores", (f"{_f(result['cpu']['server_cores'], '.2f')} / "
                                        f"{_f(result['cpu']['client_process_cores'], '.2f')}")),
        ("machine load average, 1 min (median)", _f(result["load_avg_1m_median"])),
        ("wall s", _f(result["wall_s"])),
    ]
    for row in rows:
        t.add_row(*row)
    return t


def main(argv: list[str] | None = None) -> int:
    d = SoakPlan()
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=d.connections)
    p.add_argument("--turns", type=int, default=d.turns, help="turns per chain (one connection)")
    p.add_argument("--duration", type=float, default=None, help="seconds; finished chains reconnect until then")
    p.add_argument("--per-actor", type=int, default=128, help="session.connections_per_actor of the embedded server")
    p.add_argument("--warm", type=int, default=None,
                   help="session.warm_actors, free connection slots kept ready (default: --per-actor, a whole "
                        "spare actor, so a ramp never waits for actors started on demand: tests/bench/test_pool_burst.py)")
    p.add_argument("--ramp-s", type=float, default=d.ramp_s)
    p.add_argument("--think-ms", type=float, default=d.think_ms)
    p.add_argument("--tool-output-tokens", type=int, default=d.tool_output_tokens)
    p.add_argument("--sample-s", type=float, default=d.sample_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--url", default=None, help="a running server (default: start an embedded one)")
    p.add_argument("--out", type=Path, default=Path("docs/measurements/soak.json"))
    args = p.parse_args(argv)
    plan = SoakPlan(connections=args.connections, turns=args.turns, duration_s=args.duration, ramp_s=args.ramp_s,
                    think_ms=args.think_ms, tool_output_tokens=args.tool_output_tokens, sample_s=args.sample_s,
                    seed=args.seed)
    server: dict[str, Any] = {"url": args.url or "embedded"}
    url, stop = args.url, None
    store_dir = tempfile.TemporaryDirectory(prefix="soak-store-")
    if url is None:
        from serve.builder import init_ray, start
        from serve.builder import stop as stop_server
        from serve.cli import free_port
        from serve.config import load_app_config

        warm = args.warm if args.warm is not None else args.per_actor
        # Serve drains a direct-ingress deployment (the gateway) for 30 s when it is deleted;
        # this Ray is ours and ends with the run, so no drain is needed.
        os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")
        init_ray(object_store_mb=200)
        overrides = {"server.port": free_port(), "session.connections_per_actor": args.per_actor,
                     "session.warm_actors": warm, "store.data_dir": store_dir.name}
        url = start(load_app_config(None, **overrides), name=APP)
        stop = functools.partial(stop_server, APP)  # the embedded Ray is ours: shut it down
        server.update(connections_per_actor=args.per_actor, warm_actors=warm)
        time.sleep(2.0)  # the warm pool fills
    try:
        result = asyncio.run(soak(url, plan))
    finally:
        if stop is not None:
            stop()
        store_dir.cleanup()
    result["server"] = server
    result["command"] = "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "load_avg_at_end": os.getloadavg()}
    from rich.console import Console

    Console(width=140).print(render_table(result))
    for ex in result["invariants"]["examples"][:10]:
        print("violation:", ex)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0 if result["invariants"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
