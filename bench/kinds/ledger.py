"""Usage exactly once under faults: session hosts SIGKILLed during a soak, the ledger reconciled.

    responses-ws bench ledger [--ws 48] [--http 16] [--duration 60] [--kill-every 8]

Starts an embedded server (its own Ray and a fresh SQLite store, both gone at the end) with
``--per-actor`` connections per session host, then runs ``--ws`` WebSocket clients (short
turns, chained with ``previous_response_id``, ``store`` true for ``--store-share`` of them)
and ``--http`` HTTP clients (``POST /v1/responses`` with SSE) for ``--duration`` seconds, on
the load runner (bench/runner's ``chains`` workload; each turn's record holds its response
id, ``store`` flag, terminal event and usage).
Every ``--kill-every`` seconds one session host serving this server's port, picked at
random, gets SIGKILL; its clients see their sockets end and reconnect.  Afterwards every
ledger line is read from the store and reconciled against what the clients saw
(bench/reconcile.py): a line, with the same usage, for every terminal event that reported
usage; none for one that did not; none for a response no client saw start; no duplicates.
Billed responses whose terminal event never arrived (the kill came after the commit) are
counted apart, and each stored one fetched.  Exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from .. import results
from ..reconcile import Line, Response, Seen, read_ledger, reconcile
from ..runner import Chains, LoadResult, LoadRun, LoadSpec, start_local
from ..stats import pct

APP = "responses-ws-ledger"
MODEL = "emu-fast"
MAX_CHAIN = 12  # turns before a client starts a new conversation
CHAINS_A_CONNECTION = 1_000_000  # a WebSocket client keeps its connection while it lasts
RUN_LIMIT_S = 3600.0  # the clients' deadline if they are not stopped before (they are)


@dataclass(frozen=True)
class Plan:
    ws: int = 48
    http: int = 16
    duration_s: float = 60.0
    kill_every_s: float = 8.0
    store_share: float = 0.5
    max_text_tokens: int = 40
    seed: int = 0


def load_specs(url: str, plan: Plan, key: str | None = None) -> list[LoadSpec]:
    """The clients as the runner runs them (``key``: the API key they send): ``plan.ws``
    WebSocket clients, each on one connection while it lasts, chains of :data:`MAX_CHAIN`
    short turns (``previous_response_id``; a stored response continued on the next
    connection, a failed turn starting a new chain), and ``plan.http`` HTTP clients, each turn
    a streamed ``POST`` of its own; ``store`` true for ``plan.store_share`` of the turns."""
    chains = Chains(
        turns_per_chain=MAX_CHAIN,
        chains_per_connection=CHAINS_A_CONNECTION,
        think_s=0.0,
        text_tokens=(1, plan.max_text_tokens),
        store_share=plan.store_share,
        continue_stored=True,
        reconnect_s=0.2,
        ping_interval_s=20.0,
        compression="deflate",
        model=MODEL,
    )
    common: dict[str, Any] = {
        "targets": (url,),
        "workload": "chains",
        "chains": chains,
        "api_key": key,
        "warmup_s": 0.0,
        "duration_s": RUN_LIMIT_S,
        "open_timeout_s": 30.0,
        "connect_attempts": 1,
        "seed": plan.seed,
    }
    out = [LoadSpec(loops=plan.ws, transport="ws", **common)] if plan.ws else []
    return out + ([LoadSpec(loops=plan.http, transport="http-full", **common)] if plan.http else [])


class Clients:
    """The clients of a ledger run on the load runner (one client process per transport):
    :meth:`start`, then :meth:`stop` once the faults are done; what they saw."""

    def __init__(self, runs: list[LoadRun]) -> None:
        self.runs = runs

    @classmethod
    async def start(cls, url: str, plan: Plan, key: str | None = None) -> Clients:
        specs = load_specs(url, plan, key)
        return cls(list(await asyncio.gather(*(asyncio.to_thread(start_local, s) for s in specs))))

    async def stop(self) -> list[LoadResult]:
        """End every client (a turn in flight is answered first, or cut after the runner's
        grace); their results, the WebSocket clients' first."""
        return list(await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.runs)))


def seen_by(results: list[LoadResult]) -> tuple[Seen, dict[str, int], list[float]]:
    """Every response the clients saw start or end (its ``store`` flag, terminal event and
    usage), their turns and drops (a WebSocket connection the server or the network ended, or
    one that failed to open; an HTTP request that failed), and each WebSocket turn's wait from
    its last event to its terminal one (ms)."""
    seen, gaps = Seen(), []
    stats = {"turns": 0, "ws_dropped": 0, "http_dropped": 0}
    for result in results:
        for r in result.records:
            if r.response_id is not None:
                transport = "websocket" if r.connection is not None else "http"
                seen.responses[r.response_id] = Response(transport, bool(r.store), r.terminal, r.usage)
            code = r.error_code or ""
            if code.startswith("http_error:"):
                stats["http_dropped"] += 1
            elif not code.startswith("closed_"):
                stats["turns"] += 1
            if r.final_gap_ms is not None:
                gaps.append(r.final_gap_ms)
        # only the WebSocket clients open connections of their own (an HTTP client's pool counts none)
        stats["ws_dropped"] += sum(result.connect_failures.values())
        stats["ws_dropped"] += sum(1 for c in result.connections if c.close_code is not None)
    return seen, stats, gaps


def hosts_serving(port: int) -> list[psutil.Process]:
    """The ``ray::SessionHost`` processes holding a socket of the server on ``port`` (only
    this server's hosts: other Ray clusters on the machine are left alone)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if not (proc.info["cmdline"] or [""])[0].startswith("ray::SessionHost"):
            continue
        with contextlib.suppress(psutil.Error):
            if any(c.laddr and c.raddr and c.laddr.port == port for c in proc.net_connections(kind="tcp")):
                found.append(proc)
    return found


async def killer(
    port: int, plan: Plan, kills: list[dict[str, Any]], stop: asyncio.Event, rng: random.Random, t0: float
) -> None:
    wait = plan.kill_every_s
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            return
        hosts = await asyncio.to_thread(hosts_serving, port)
        wait = plan.kill_every_s if hosts else 0.5  # none serving yet (clients reconnecting): soon again
        if hosts:
            victim = rng.choice(hosts)
            with contextlib.suppress(psutil.Error):
                victim.send_signal(signal.SIGKILL)
                kills.append({"t_s": round(time.monotonic() - t0, 1), "pid": victim.pid, "hosts": len(hosts)})


async def fetch_billed_unseen(url: str, seen: Seen, lines: list[Line]) -> dict[str, int]:
    """Stored responses billed but whose terminal event never arrived: fetched by id, as
    their client could after reconnecting; counted if the record's usage is the line's."""
    by_id = {line.response_id: line for line in lines}
    ids = [rid for rid, r in seen.responses.items() if r.terminal is None and r.store and rid in by_id]
    same = 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for rid in ids:
            got = await http.get(f"/v1/responses/{rid}")
            if got.status_code == 200:
                u, line = got.json()["usage"], by_id[rid]
                same += (
                    u["input_tokens"],
                    u["input_tokens_details"]["cached_tokens"],
                    u["output_tokens"],
                ) == (line.input_tokens, line.cached_tokens, line.output_tokens)
    return {"billed_unseen_stored": len(ids), "billed_unseen_stored_fetched": same}


async def faults(url: str, data_dir: str | Path, plan: Plan) -> dict[str, Any]:
    """Run the clients and the killer against the server at ``url`` (whose SQLite store is
    ``data_dir``); the reconciled result."""
    port = int(url.rsplit(":", 1)[1])
    kills: list[dict[str, Any]] = []
    stop, rng, t0 = asyncio.Event(), random.Random(plan.seed), time.monotonic()
    clients = await Clients.start(url, plan)
    try:
        killing = asyncio.create_task(killer(port, plan, kills, stop, rng, t0))
        await asyncio.sleep(plan.duration_s)
        stop.set()
        await killing
    finally:
        results = await clients.stop()
    seen, stats, gaps = seen_by(results)
    await asyncio.sleep(1.0)  # connections closing: nothing more is written after a terminal event
    lines = read_ledger(data_dir)
    verdict = reconcile(seen, lines)
    verdict.update(await fetch_billed_unseen(url, seen, lines))
    wall = time.monotonic() - t0
    return {
        "plan": plan.__dict__,
        "wall_s": round(wall, 1),
        "kills": len(kills),
        "kill_log": kills,
        **stats,
        "turns_per_s": round(stats["turns"] / plan.duration_s, 1),
        "ws_terminal_gap_ms": {"p50": pct(gaps, 0.5), "p90": pct(gaps, 0.9)},
        "clients": [c.as_dict() for r in results for c in r.clients],
        "reconcile": verdict,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Plan()
    p.add_argument("--ws", type=int, default=d.ws, help="WebSocket clients")
    p.add_argument("--http", type=int, default=d.http, help="HTTP (SSE) clients")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of load")
    p.add_argument("--kill-every", type=float, default=d.kill_every_s, help="seconds between SIGKILLs")
    p.add_argument("--store-share", type=float, default=d.store_share, help="share of store:true turns")
    p.add_argument("--per-actor", type=int, default=16, help="session.connections_per_actor")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", type=Path, default=Path("results/ledger.json"))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from serve.embedded import embedded_server, local_config

    plan = Plan(
        ws=args.ws,
        http=args.http,
        duration_s=args.duration,
        kill_every_s=args.kill_every,
        store_share=args.store_share,
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory(prefix="ledger-store-", ignore_cleanup_errors=True) as store_dir:
        config = local_config(
            **{
                "session.connections_per_actor": args.per_actor,
                "session.warm_actors": 2,
                "store.data_dir": store_dir,
            }
        )
        with embedded_server(config, name=APP, object_store_mb=200) as url:
            time.sleep(2.0)  # the warm pool fills
            result = asyncio.run(faults(url, store_dir, plan))
    result["server"] = {"connections_per_actor": args.per_actor, "store": "sqlite"}
    result["load_avg_at_end"] = os.getloadavg()
    v = result["reconcile"]
    Console(width=120).print(
        f"{result['kills']} session hosts killed in {result['wall_s']} s; {result['turns']} turns; "
        f"{v['responses_seen']} responses seen, {v['ledger_lines']} ledger lines\n"
        f"seen billed {v['seen_billed']}, seen unbilled {v['seen_unbilled']}, cut by a kill: "
        f"{v['billed_unseen']} billed ({v['billed_unseen_stored_fetched']}/{v['billed_unseen_stored']} stored "
        f"ones fetched), {v['cut_unbilled']} unbilled\n"
        f"mismatches {v['mismatches']}: lost {v['lost_lines']}, duplicates {v['duplicate_lines']}, "
        f"usage {v['usage_mismatches']}, billed though seen unbilled {v['billed_but_seen_unbilled']}, "
        f"never seen {v['lines_never_seen']}"
    )
    for example in v["examples"]:
        print("mismatch:", example)
    results.write(args.out, result, args.run)
    print(f"wrote {args.out}")
    return 0 if v["mismatches"] == 0 else 1
