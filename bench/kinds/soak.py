"""Load and soak: hundreds of WebSocket agent chains at once, every event of every response checked.

    responses-ws bench soak --connections 200 --turns 30 [--per-actor 128] [--duration 60] [--runs 1] [--chains N]

Starts an embedded server (its own Ray, stopped at the end) unless ``--url`` is given and
runs ``--connections`` agent loops on the lab's load runner (bench/runner, ``run_local``,
``--clients`` client processes), their first turns spread over ``--ramp-s``: each loop runs
chains of ``--turns`` turns (``store:false``, each turn after the first chained on the
previous response and carrying the tool outputs, ``--think-ms`` of tool time between turns),
one connection per chain, a new chain on a new connection after each, until ``--duration``
seconds after the ramp, when every loop stops at its next turn boundary (a soak with
connection churn); with ``--chains N`` each loop stops after N chains instead (every turn
counted, ``--duration`` then only caps the run).  ``--runs N`` repeats all of it N times on the same server and samples the
server's memory with no connection open after each run (a leak grows it run after run).

Every create and event goes through bench/invariants.py (the runner's ``check_events``); any
violation makes the command exit 1.  Measured, after the ramp: turns and turns/s, TTFT as the
client sees it (create sent → first output delta) and TTFT overhead = client TTFT minus the
emulator's own time to first token for that request (``queue + prefill``, which the inference
replica reports per response through the server's ``responses_ws.timings`` metadata), each
client process's own CPU and event-loop lag (a saturated client makes the run's latencies
invalid: bench/runner), and the private memory (USS) of the session actors and the gateway,
sampled every ``--sample-s``: per connection, and flat or not over time (bench/processes.py
``flatness``).  Writes JSON (``--out``) and prints a table (bench/soak_report.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from serve.embedded import embedded_server, local_config

from .. import results
from ..invariants import RunCheck
from ..processes import CpuMeter, sample_uss
from ..runner import LoadResult, TurnRecord, run_local
from ..soak_report import SoakPlan, model_ttft_ms, render_table, summarise
from ..stats import pct

APP = "responses-ws-soak"
CHAINS_CAP_S = 3600.0  # with --chains and no --duration: the run's cap


def process_groups(app: str) -> dict[str, str]:
    return {
        "session_actors": "SessionHost",
        "gateway": f"ServeReplica:{app}:Gateway",
        "inference": f"ServeReplica:{app}:InferenceDeployment",
    }


class Sampler:
    """Every ``every`` seconds until stopped (and once more then), in a thread of its own:
    the server's memory and CPU, the turns so far and the machine's load."""

    def __init__(self, groups: dict[str, str], every: float, records: list[TurnRecord]) -> None:
        self.groups, self.every, self.records = groups, every, records
        self.timeline: list[dict[str, Any]] = []
        self.cpu = CpuMeter()
        self.stop = threading.Event()
        self.t0 = time.time()
        self.thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def _run(self) -> None:
        seen = 0
        while True:  # one sample more once stopped: the end's
            stopped = self.stop.is_set()
            snap = sample_uss(self.groups)
            recent, seen = self.records[seen:], len(self.records)
            for v in snap.values():
                self.cpu.add(v["cpu_s"])
            now = time.time()
            self.timeline.append(
                {
                    "t": now,
                    "t_s": round(now - self.t0, 2),
                    "turns": seen,
                    "load_avg_1m": os.getloadavg()[0],
                    "ttft_overhead_p50_ms": pct(
                        (o for r in recent if (o := overhead_ms(r)) is not None), 0.5
                    ),
                    **{f"{g}_uss_mb": round(v["uss_mb"], 1) for g, v in snap.items()},
                    **{f"{g}_processes": v["processes"] for g, v in snap.items()},
                }
            )
            if stopped:
                return
            self.stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def overhead_ms(r: TurnRecord) -> float | None:
    model = model_ttft_ms(r.server)
    return None if r.ttft_ms is None or model is None else r.ttft_ms - model


def soak(url: str, plan: SoakPlan, *, app: str = APP, runs: int = 1) -> dict[str, Any]:
    """Run the plan ``runs`` times against the server at ``url``; the result as a JSON-able
    dict (bench/soak_report.py).  One invariant check spans all runs (ids stay unique)."""
    check, loads, per_run = RunCheck(), [], []
    records: list[TurnRecord] = []
    groups = process_groups(app)
    sampling = plan.sample_s is not None
    baseline = sample_uss(groups) if sampling else None
    me = psutil.Process()
    me0, t0 = me.cpu_times(), time.time()
    sampler = Sampler(groups, plan.sample_s or 1.0, records)
    with sampler if sampling else contextlib.nullcontext():
        for run in range(runs):
            result: LoadResult = run_local(plan.spec(url, run), plan.clients, on_records=records.extend)
            assert result.check is not None  # check_events
            check.merge(result.check)
            loads.append(result)
            s = result.summary()
            entry: dict[str, Any] = {
                "run": run,
                "window_s": s["window_s"],
                "turns": s["turns"],
                "valid": s["valid"],
                "invalid_reason": s["invalid_reason"],
            }
            if sampling and runs > 1:
                time.sleep(plan.settle_s)
                idle = sample_uss(groups)
                entry["idle_mb"] = {g: round(v["uss_mb"], 1) for g, v in idle.items()}
                print(
                    f"run {run + 1}/{runs}: {entry['turns']} turns in {entry['window_s']:.0f} s, idle USS "
                    f"{entry['idle_mb']}, violations so far {dict(check.violations)}",
                    flush=True,
                )
            per_run.append(entry)
    wall = time.time() - t0
    me1 = me.cpu_times()
    cpu = {
        "server_cores": sampler.cpu.used_s() / wall if sampling else None,
        "client_process_cores": sum(c.cpu_fraction for r in loads for c in r.clients) / max(1, runs),
        "driver_cores": (me1.user + me1.system - me0.user - me0.system) / wall,
    }
    return summarise(plan, check, loads, sampler.timeline, baseline, per_run, cpu)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SoakPlan()
    p.add_argument("--connections", type=int, default=d.connections, help="agent loops, one connection each")
    p.add_argument("--turns", type=int, default=d.turns, help="turns per chain (one connection)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds after the ramp (default {d.duration_s:g}); each chain is followed by a fresh one "
        f"on a new connection until then; with --chains a cap (default {CHAINS_CAP_S:g})",
    )
    p.add_argument("--chains", type=int, default=None, help="chains per loop, then the loop stops")
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
    p.add_argument("--ramp-s", type=float, default=d.ramp_s, help="the first turns spread over this long")
    p.add_argument("--think-ms", type=float, default=d.think_ms)
    p.add_argument("--tool-output-tokens", type=int, default=d.tool_output_tokens)
    p.add_argument("--sample-s", type=float, default=d.sample_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--clients", type=int, default=d.clients, help="client processes sharing the loops")
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
        duration_s=args.duration or (SoakPlan.duration_s if args.chains is None else CHAINS_CAP_S),
        ramp_s=args.ramp_s,
        think_ms=args.think_ms,
        tool_output_tokens=args.tool_output_tokens,
        sample_s=None if args.url else args.sample_s,
        seed=args.seed,
        clients=args.clients,
        chains=args.chains,
    )
    server: dict[str, Any] = {"url": args.url or "embedded"}
    if args.url:
        result = soak(args.url, plan, runs=args.runs)
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
                result = soak(url, plan, runs=args.runs)
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
