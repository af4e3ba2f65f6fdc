"""Usage exactly once under faults: session hosts SIGKILLed during a soak, the ledger reconciled.

    responses-ws bench ledger [--ws 48] [--http 16] [--duration 60] [--kill-every 8]

Starts an embedded server (its own Ray and a fresh SQLite store, both gone at the end) with
``--per-actor`` connections per session host, then runs ``--ws`` WebSocket clients (short
turns, chained with ``previous_response_id``, ``store`` true for ``--store-share`` of them)
and ``--http`` HTTP clients (``POST /v1/responses`` with SSE) for ``--duration`` seconds.
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
import json
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
from ..client import TERMINAL_EVENT_TYPES, ConnectionClosed, InvalidHandshake, connect
from ..reconcile import Line, Seen, read_ledger, reconcile
from ..stats import pct

APP = "responses-ws-ledger"
MODEL = "emu-fast"
MAX_CHAIN = 12  # turns before a client starts a new conversation
END_GRACE_S = 20.0  # for the turns running when the duration ends


@dataclass(frozen=True)
class Plan:
    ws: int = 48
    http: int = 16
    duration_s: float = 60.0
    kill_every_s: float = 8.0
    store_share: float = 0.5
    max_text_tokens: int = 40
    seed: int = 0


def turn_body(rng: random.Random, plan: Plan, previous: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": "go",
        "store": rng.random() < plan.store_share,
        "metadata": {
            "emulator.tool_rounds": "0",
            "emulator.text_tokens": str(rng.randint(1, plan.max_text_tokens)),
        },
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def observe(seen: Seen, event: dict[str, Any], transport: str) -> str | None:
    """Record ``event``; the response id once it ends the response (or ``""`` for an error)."""
    kind = event.get("type")
    if kind == "response.created":
        seen.created(event["response"], transport)
    elif isinstance(kind, str) and kind in TERMINAL_EVENT_TYPES:
        seen.finished(kind, event["response"])
        return event["response"]["id"]
    elif kind == "error":
        return ""
    return None


async def ws_client(
    url: str,
    plan: Plan,
    seen: Seen,
    stats: dict[str, int],
    stop: asyncio.Event,
    rng: random.Random,
    gaps: list[float],
    key: str | None = None,
) -> None:
    """A socket's turns, and new sockets after drops, until ``stop`` (``key``: the API key sent)."""
    previous: str | None = None  # continued on the next socket only if it was stored
    chain = 0
    while not stop.is_set():
        try:
            async with connect(url, api_key=key, open_timeout=30, compression="deflate") as sock:
                while not stop.is_set():
                    body = turn_body(rng, plan, previous if chain < MAX_CHAIN else None)
                    chain = chain + 1 if "previous_response_id" in body else 1
                    await sock.send({"type": "response.create", **body})
                    last = time.perf_counter()
                    while (ended := observe(seen, await sock.recv(), "websocket")) is None:
                        last = time.perf_counter()
                    gaps.append((time.perf_counter() - last) * 1000)  # the wait for the line (and record)
                    stats["turns"] += 1
                    r = seen.responses.get(ended)
                    previous = ended if r is not None and r.terminal == "response.completed" else None
        except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError):
            stats["ws_dropped"] += 1
            r = seen.responses.get(previous or "")
            previous = previous if r is not None and r.store else None
            await asyncio.sleep(0.2)


async def http_client(
    url: str,
    plan: Plan,
    seen: Seen,
    stats: dict[str, int],
    stop: asyncio.Event,
    rng: random.Random,
    key: str | None = None,
) -> None:
    """Streamed HTTP turns until ``stop`` (``key``: the API key sent)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:
        while not stop.is_set():
            try:
                async with http.stream(
                    "POST", "/v1/responses", json={**turn_body(rng, plan, None), "stream": True}
                ) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            observe(seen, json.loads(line[6:]), "http")
                stats["turns"] += 1
            except httpx.HTTPError:
                stats["http_dropped"] += 1
                await asyncio.sleep(0.2)


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
    seen, stats = Seen(), {"turns": 0, "ws_dropped": 0, "http_dropped": 0}
    kills: list[dict[str, Any]] = []
    stop, rng, t0 = asyncio.Event(), random.Random(plan.seed), time.monotonic()
    gaps: list[float] = []
    clients = [
        asyncio.create_task(ws_client(url, plan, seen, stats, stop, random.Random(rng.random()), gaps))
        for _ in range(plan.ws)
    ]
    clients += [
        asyncio.create_task(http_client(url, plan, seen, stats, stop, random.Random(rng.random())))
        for _ in range(plan.http)
    ]
    killing = asyncio.create_task(killer(port, plan, kills, stop, rng, t0))
    await asyncio.sleep(plan.duration_s)
    stop.set()
    await killing
    _, late = await asyncio.wait(clients, timeout=END_GRACE_S)
    for task in late:
        task.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
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
