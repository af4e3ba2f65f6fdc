"""Load and soak: hundreds of WebSocket agent chains at once, every response checked.

    responses-ws bench soak --connections 200 --turns 30 [--per-actor 128] [--duration 240] [--runs 1]

Starts an embedded server (its own Ray, stopped at the end) unless ``--url`` is given and
opens ``--connections`` raw WebSockets from this one asyncio process, staggered over
``--ramp-s``, each running agent-like chains of ``--turns`` turns with ``--think-ms`` of
tool time between turns (bench/chains.py).  Without ``--duration`` each connection runs one
chain; with it, a finished chain reconnects and starts a fresh one until the duration is
over, when every chain stops at its next turn boundary (a soak with connection churn;
first chains are cut short to spread connection ages).
``--runs N`` repeats all of it N times on the same server and samples the server's memory
with no connection open after each run (a leak grows it run after run).

Every event of every response goes through bench/invariants.py; any violation makes the
command exit 1.  Measured: connections held at once, turns and turns/s, TTFT as the client
sees it (create sent → first output delta) and TTFT overhead = client TTFT minus the
emulator's own time to first token for that request (``queue + prefill``, which the
inference replica reports per response through the server's ``responses_ws.timings``
metadata; the emulator's profile formula on the reported usage is the fallback), and the
private memory (USS) of the session actors and the gateway, sampled every ``--sample-s``:
per connection, and flat or not over time (bench/processes.py ``flatness``).  Writes JSON
(``--out``) and prints a table (bench/soak_report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from serve.embedded import embedded_server, local_config

from .. import results
from ..chains import Load, SoakPlan, run_slot
from ..invariants import RunCheck
from ..processes import CpuMeter, sample_uss
from ..soak_report import render_table, summarise
from ..stats import pct

APP = "responses-ws-soak"
SETTLE_S = 3.0  # after a run, before sampling idle memory: closes and flushes finish


def process_groups(app: str) -> dict[str, str]:
    return {
        "session_actors": "SessionHost",
        "gateway": f"ServeReplica:{app}:Gateway",
        "inference": f"ServeReplica:{app}:InferenceDeployment",
    }


async def _sample(
    groups: dict[str, str],
    load: Load,
    t0: float,
    every: float,
    stop: asyncio.Event,
    timeline: list[dict[str, Any]],
    cpu: CpuMeter,
) -> None:
    """Every ``every`` seconds until ``stop`` (and once more then): memory, CPU, load."""
    seen = 0
    while True:
        snap = await asyncio.to_thread(sample_uss, groups)
        recent, seen = load.overhead_ms[seen:], len(load.overhead_ms)
        for v in snap.values():
            cpu.add(v["cpu_s"])
        timeline.append(
            {
                "t_s": round(time.monotonic() - t0, 2),
                "open": load.open,
                "turns": load.turns,
                "load_avg_1m": os.getloadavg()[0],
                "ttft_overhead_p50_ms": pct(recent, 0.5),
                **{f"{g}_uss_mb": round(v["uss_mb"], 1) for g, v in snap.items()},
                **{f"{g}_processes": v["processes"] for g, v in snap.items()},
            }
        )
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def soak(url: str, plan: SoakPlan, *, app: str = APP, runs: int = 1) -> dict[str, Any]:
    """Run the plan ``runs`` times against the server at ``url``; the result as a JSON-able
    dict (bench/soak_report.py).  One invariant check spans all runs (ids stay unique)."""
    profile = None
    with contextlib.suppress(Exception):
        from inference.emulator.profiles import load_inference_config

        profile = load_inference_config().profile(plan.model)
    check, load, per_run = RunCheck(), Load(), []
    timeline: list[dict[str, Any]] = []
    groups = process_groups(app)
    sampling = plan.sample_s is not None
    baseline = await asyncio.to_thread(sample_uss, groups) if sampling else None
    meter, me = CpuMeter(), psutil.Process()
    me0 = me.cpu_times()
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampler = (
        asyncio.create_task(_sample(groups, load, t0, plan.sample_s, stop, timeline, meter))
        if plan.sample_s is not None
        else None
    )
    for run in range(runs):
        start, turns = time.monotonic(), load.turns
        t_end = start + plan.duration_s if plan.duration_s else None
        await asyncio.gather(
            *(run_slot(s, url, plan, check, load, t_end, profile, run=run) for s in range(plan.connections))
        )
        entry: dict[str, Any] = {"run": run, "wall_s": time.monotonic() - start, "turns": load.turns - turns}
        if sampling and runs > 1:
            await asyncio.sleep(SETTLE_S)
            idle = await asyncio.to_thread(sample_uss, groups)
            entry["idle_mb"] = {g: round(v["uss_mb"], 1) for g, v in idle.items()}
            print(
                f"run {run + 1}/{runs}: {entry['turns']} turns in {entry['wall_s']:.0f} s, idle USS "
                f"{entry['idle_mb']}, violations so far {dict(check.violations)}",
                flush=True,
            )
        per_run.append(entry)
    wall = time.monotonic() - t0
    stop.set()
    if sampler is not None:
        await sampler
    me1 = me.cpu_times()
    cpu = {
        "server_cores": meter.used_s() / wall if sampling else None,
        "client_process_cores": (me1.user + me1.system - me0.user - me0.system) / wall,
    }
    return summarise(plan, check, load, timeline, baseline, per_run, cpu)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SoakPlan()
    p.add_argument("--connections", type=int, default=d.connections)
    p.add_argument("--turns", type=int, default=d.turns, help="turns per chain (one connection)")
    p.add_argument(
        "--duration", type=float, default=None, help="seconds; finished chains reconnect until then"
    )
    p.add_argument(
        "--runs", type=int, default=1, help="repeat the whole plan; idle memory is sampled after each"
    )
    # 128: at 200 connections x 10 turns on this machine (2 shared cores, other suites
    # running), 64 per actor gave the worst tails, 256 (one busy actor) the least memory
    # (0.9 vs 1.5 MiB per connection) but worse p99 when that one process was descheduled.
    p.add_argument(
        "--per-actor", type=int, default=128, help="session.connections_per_actor of the embedded server"
    )
    p.add_argument(
        "--warm",
        type=int,
        default=None,
        help="session.warm_actors, free connection slots kept ready (default: --per-actor / 8)",
    )
    p.add_argument("--ramp-s", type=float, default=d.ramp_s)
    p.add_argument("--think-ms", type=float, default=d.think_ms)
    p.add_argument("--tool-output-tokens", type=int, default=d.tool_output_tokens)
    p.add_argument("--sample-s", type=float, default=d.sample_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--url",
        default=None,
        help="a running server (default: start an embedded one); no memory sampling then",
    )
    p.add_argument("--out", type=Path, default=Path("results/soak.json"))


def run(args: argparse.Namespace) -> int:
    plan = SoakPlan(
        connections=args.connections,
        turns=args.turns,
        duration_s=args.duration,
        ramp_s=args.ramp_s,
        think_ms=args.think_ms,
        tool_output_tokens=args.tool_output_tokens,
        sample_s=None if args.url else args.sample_s,
        seed=args.seed,
    )
    server: dict[str, Any] = {"url": args.url or "embedded"}
    if args.url:
        result = asyncio.run(soak(args.url, plan, runs=args.runs))
    else:
        warm = args.warm if args.warm is not None else max(1, args.per_actor // 8)
        server.update(connections_per_actor=args.per_actor, warm_actors=warm)
        with tempfile.TemporaryDirectory(prefix="soak-store-", ignore_cleanup_errors=True) as store_dir:
            config = local_config(
                **{
                    "session.connections_per_actor": args.per_actor,
                    "session.warm_actors": warm,
                    "store.data_dir": store_dir,
                }
            )
            with embedded_server(config, name=APP, object_store_mb=200) as url:
                time.sleep(2.0)  # the warm pool fills
                result = asyncio.run(soak(url, plan, runs=args.runs))
    result["server"] = server
    result["command"] = args.command
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_at_end": os.getloadavg(),
    }
    from rich.console import Console

    Console(width=140).print(render_table(result))
    for ex in result["invariants"]["examples"][:10]:
        print("violation:", ex)
    results.write(args.out, result, args.run)
    print(f"wrote {args.out}")
    return 0 if result["invariants"]["ok"] else 1
