"""Drains drop nothing: redeploys under load, every connection and every response accounted for.

    responses-ws bench drain [--connections 300] [--redeploys 3] [--every 20]

Starts an embedded server (its own Ray and a fresh SQLite store, both gone at the end) and
runs ``--connections`` WebSocket clients.  Each runs turns on emu-gpu of ``--min-tokens`` to
``--max-tokens`` output tokens (seconds each, so most sockets are mid-turn at any moment),
``store:true`` for ``--store-share`` of them, chained with ``previous_response_id``, with
``--think-ms`` between turns; after ``--turns`` turns it closes and opens a new connection,
so connections arrive all the time, while a drain runs too.  Every ``--every`` seconds the
app is redeployed with a changed gateway config: Serve starts a new gateway replica on the
same port and stops the old one, which drains.  A client told to go — close 1012, an
``error`` with ``server_shutting_down``, a 503 with ``Retry-After`` on the upgrade —
reconnects and resends the create that got no terminal event, as docs/reliability.md asks
of clients.

Violations (docs/reliability.md, graceful shutdown and redeploys): an upgrade closed or reset
without an HTTP answer (the client's ``InvalidMessage``), refused without a typed body and
``Retry-After``, or not answered in 30 s; a connection refused at the port; a socket closed
without a close frame or with another code than 1012; an ``error`` other than
``server_shutting_down``; a response that started (``response.created``) and got no
terminal event, or ended ``response.failed``; a stored response that completed and cannot be fetched afterwards; and any
mismatch of the usage ledger against what the clients saw (bench/reconcile.py).  Exits 1
on any.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .. import results
from ..client import (
    TERMINAL_EVENT_TYPES,
    ConnectionClosed,
    InvalidMessage,
    InvalidStatus,
    ResponsesSocket,
    connect,
)
from ..reconcile import Seen, read_ledger, reconcile

APP = "responses-ws-drain"
OPEN_TIMEOUT_S = 30.0
END_GRACE_S = 60.0  # for the turns running when the load stops
TYPED_REFUSALS = frozenset({"server_shutting_down", "server_overloaded"})  # 503 codes that ask for a retry
VIOLATIONS = (
    "upgrade_unanswered",
    "upgrade_reset",
    "upgrade_refused_untyped",
    "upgrade_timeout",
    "port_closed",
    "closed_abnormally",
    "closed_other_code",
    "error_other",
    "lost_terminal",
    "response_failed",
    "stored_lost",
)


@dataclass(frozen=True)
class Plan:
    connections: int = 300
    redeploys: int = 3
    every_s: float = 20.0  # between redeploys; the first comes after one period of load
    tail_s: float = 15.0  # load after the last redeploy returned
    turns: int = 6  # per connection, then the client opens a new one
    think_ms: float = 500.0
    min_tokens: int = 100
    max_tokens: int = 300
    store_share: float = 0.5
    model: str = "emu-gpu"
    seed: int = 0


@dataclass
class Tally:
    """What the clients saw, case by case, with a few examples of each violation."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    in_turn: int = 0  # clients waiting for the answer to a create now

    t0: float = field(default_factory=time.monotonic)

    def add(self, case: str, detail: str = "") -> None:
        self.counts[case] += 1
        if case in VIOLATIONS and len(self.examples) < 20:  # when: against the redeploy log's at_s
            self.examples.append(f"{time.monotonic() - self.t0:.1f} s {case}: {detail}"[:300])

    @property
    def violations(self) -> int:
        return sum(self.counts[case] for case in VIOLATIONS)


class Refused(Exception):
    """The create was answered ``server_shutting_down``: resend it on a new connection."""


def turn_body(rng: random.Random, plan: Plan, previous: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": plan.model,
        "input": "go",
        "store": rng.random() < plan.store_share,
        "metadata": {
            "emulator.tool_rounds": "0",
            "emulator.text_tokens": str(rng.randint(plan.min_tokens, plan.max_tokens)),
        },
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def classify_refusal(exc: InvalidStatus) -> tuple[str, str]:
    """A refused upgrade: typed (503, ``Retry-After``, an OpenAI error body asking for a retry)
    or not."""
    response = exc.response
    try:
        code = json.loads(response.body or b"{}")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    typed = response.status_code == 503 and "Retry-After" in response.headers and code in TYPED_REFUSALS
    return (
        "upgrade_refused_typed" if typed else "upgrade_refused_untyped",
        f"{response.status_code} {code} {bytes(response.body or b'')[:80]!r}",
    )


class Client:
    """One client: connections one after another, turns on each, every create answered or
    resent."""

    def __init__(self, url: str, plan: Plan, seen: Seen, tally: Tally, rng: random.Random) -> None:
        self.url, self.plan, self.seen, self.tally, self.rng = url, plan, seen, tally, rng
        self.previous: str | None = None  # the response the next create continues
        self.pending: dict[str, Any] | None = None  # a create that got no terminal event: resent
        self.started: str | None = None  # the response of the create in flight, once created

    def carried_over(self) -> None:
        """On a new socket only a stored response can be continued (a ``store:false`` id
        belongs to the socket that made it)."""
        if self.previous is not None and not self.seen.responses[self.previous].store:
            self.previous = None
        if self.pending is not None and self.pending.get("previous_response_id") != self.previous:
            self.pending.pop("previous_response_id", None)
            if self.previous is not None:
                self.pending["previous_response_id"] = self.previous

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.carried_over()
            try:
                sock = await connect(self.url, open_timeout=OPEN_TIMEOUT_S, compression="deflate")
            except InvalidStatus as exc:
                self.tally.add(*classify_refusal(exc))
                await asyncio.sleep(self.rng.uniform(0.5, 1.0))  # Retry-After: 1
                continue
            except InvalidMessage as exc:  # closed before it answered the upgrade
                self.tally.add("upgrade_unanswered", repr(exc.__cause__ or exc))
            except ConnectionRefusedError as exc:
                self.tally.add("port_closed", repr(exc))
            except TimeoutError as exc:
                self.tally.add("upgrade_timeout", repr(exc))
            except OSError as exc:  # reset, broken pipe
                self.tally.add("upgrade_reset", repr(exc))
            else:
                self.tally.add("opened")
                await self.serve_socket(sock, stop)
                continue
            await asyncio.sleep(0.5)

    async def serve_socket(self, sock: ResponsesSocket, stop: asyncio.Event) -> None:
        try:
            for _ in range(self.plan.turns):
                if stop.is_set():
                    break
                await self.turn(sock)
                await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.plan.think_ms / 1000)
            await sock.close()
            self.tally.add("client_closed")
        except Refused:
            # Told to go: the server closes the socket (1012) once nothing runs on it.
            def stray(raw: str) -> None:
                self.tally.add("error_other", f"after server_shutting_down: {raw[:100]!r}")

            try:
                async with asyncio.timeout(10):
                    how = await sock.until_closed(stray)
            except TimeoutError:
                self.tally.add("closed_other_code", "no close within 10 s of server_shutting_down")
                await sock.close()
            else:
                self.closed(how)
        except ConnectionClosed as exc:
            self.closed(exc)
        await asyncio.sleep(self.rng.uniform(0.0, 0.3))

    def closed(self, exc: ConnectionClosed) -> None:
        """The server ended the socket; the create in flight, if any, is resent."""
        if exc.rcvd is None:
            self.tally.add("closed_abnormally", repr(exc))
        elif exc.rcvd.code == 1012:
            self.tally.add("closed_1012")
            self.tally.counts[f"reason {exc.rcvd.reason!r}"] += 1
        else:
            self.tally.add("closed_other_code", repr(exc))
        if self.started is not None:
            self.tally.add("lost_terminal", f"{self.started} (then {exc!r})")
            self.started = None
            self.pending = None  # it ran: not resent
        if self.pending is not None:
            self.tally.add("resent")

    async def turn(self, sock: ResponsesSocket) -> None:
        body = self.pending = self.pending or turn_body(self.rng, self.plan, self.previous)
        await sock.send({"type": "response.create", **body})
        self.tally.in_turn += 1
        try:
            while True:
                event = await sock.recv()
                kind = event.get("type")
                if kind == "response.created":
                    self.seen.created(event["response"], "websocket")
                    self.started = event["response"]["id"]
                elif kind in TERMINAL_EVENT_TYPES:
                    response = event["response"]
                    self.seen.finished(kind, response)
                    self.tally.add(kind)
                    if kind == "response.failed":  # the emulated model never fails on its own
                        self.tally.add("response_failed", f"{response['id']}: {response.get('error')}")
                    self.started, self.pending = None, None
                    self.previous = response["id"] if kind == "response.completed" else None
                    return
                elif kind == "error":
                    code = (event.get("error") or {}).get("code")
                    if code == "server_shutting_down" and self.started is None:
                        self.tally.add("create_refused_draining")
                        raise Refused()
                    self.tally.add("error_other", json.dumps(event)[:200])
                    self.started, self.pending, self.previous = None, None, None
                    return
        finally:
            self.tally.in_turn -= 1


async def fetch_stored(url: str, seen: Seen, tally: Tally) -> int:
    """Every stored response a client saw complete, fetched from the store by id."""
    ids = [rid for rid, r in seen.responses.items() if r.store and r.terminal == "response.completed"]
    queue = asyncio.Queue[str]()
    for rid in ids:
        queue.put_nowait(rid)

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            rid = queue.get_nowait()
            got = await http.get(f"/v1/responses/{rid}")
            if got.status_code != 200 or got.json().get("status") != "completed":
                tally.add("stored_lost", f"{rid}: {got.status_code} {got.text[:100]}")

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await asyncio.gather(*(worker(http) for _ in range(8)))
    return len(ids)


async def redeploys(
    url: str, data_dir: str | Path, plan: Plan, redeploy: Callable[[int], object]
) -> dict[str, Any]:
    """Run the clients against the server at ``url`` (its SQLite store in ``data_dir``) and
    call ``redeploy(k)`` (blocking: it returns once the new gateway serves) ``plan.redeploys``
    times; the verdict."""
    seen, tally, stop = Seen(), Tally(), asyncio.Event()
    rng = random.Random(plan.seed)
    clients = [Client(url, plan, seen, tally, random.Random(rng.random())) for _ in range(plan.connections)]
    t0 = tally.t0
    tasks = []
    for client in clients:  # staggered over the first second
        tasks.append(asyncio.create_task(client.run(stop)))
        await asyncio.sleep(1.0 / plan.connections)
    log: list[dict[str, Any]] = []
    for k in range(plan.redeploys):
        await asyncio.sleep(plan.every_s)
        began, mid_turn, closed = time.monotonic(), tally.in_turn, tally.counts["closed_1012"]
        await asyncio.to_thread(redeploy, k)
        log.append(
            {
                "at_s": round(began - t0, 1),
                "took_s": round(time.monotonic() - began, 1),
                "mid_turn_at_start": mid_turn,
                "mid_turn_when_done": tally.in_turn,
                "closed_1012_before": closed,
            }
        )
    completed = tally.counts["response.completed"]
    await asyncio.sleep(plan.tail_s)
    stop.set()
    _, late = await asyncio.wait(tasks, timeout=END_GRACE_S)
    for task in late:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.monotonic() - t0
    for entry, after in zip(log, [*(e["closed_1012_before"] for e in log[1:]), tally.counts["closed_1012"]]):
        entry["closed_1012"] = after - entry.pop("closed_1012_before")
    await asyncio.sleep(1.0)  # the last sockets' store writes
    stored = await fetch_stored(url, seen, tally)
    ledger = reconcile(seen, read_ledger(data_dir))
    counts = dict(sorted(tally.counts.items()))
    return {
        "plan": asdict(plan),
        "wall_s": round(wall, 1),
        "redeploy_log": log,
        "responses_seen": len(seen.responses),
        "stored_fetched": stored,
        "counts": counts,
        "completed_after_last_redeploy": tally.counts["response.completed"] - completed,
        "violations": tally.violations + ledger["mismatches"],
        "examples": tally.examples,
        "ledger": ledger,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Plan()
    p.add_argument("--connections", type=int, default=d.connections, help="WebSocket clients")
    p.add_argument("--redeploys", type=int, default=d.redeploys)
    p.add_argument("--every", type=float, default=d.every_s, help="seconds of load before each redeploy")
    p.add_argument("--tail", type=float, default=d.tail_s, help="seconds of load after the last redeploy")
    p.add_argument("--turns", type=int, default=d.turns, help="turns per connection")
    p.add_argument("--think-ms", type=float, default=d.think_ms, help="between turns (±50 %%)")
    p.add_argument("--min-tokens", type=int, default=d.min_tokens)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--store-share", type=float, default=d.store_share, help="share of store:true turns")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", type=Path, default=Path("results/drain.json"))


def run(args: argparse.Namespace) -> int:
    from serve.embedded import deploy, embedded_server, local_config

    plan = Plan(
        connections=args.connections,
        redeploys=args.redeploys,
        every_s=args.every,
        tail_s=args.tail,
        turns=args.turns,
        think_ms=args.think_ms,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        store_share=args.store_share,
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory(prefix="drain-store-", ignore_cleanup_errors=True) as store_dir:
        config = local_config(None, **{"store.data_dir": store_dir})

        def redeploy(k: int) -> None:  # a gateway-only change: Serve replaces the gateway replica
            session = config.session.model_copy(
                update={"max_inflight": config.session.max_inflight - 1 + k % 2}
            )
            deploy(config.model_copy(update={"session": session}), name=APP)

        with embedded_server(config, name=APP, object_store_mb=200) as url:
            time.sleep(2.0)  # the warm pool fills
            result = asyncio.run(redeploys(url, store_dir, plan, redeploy))
    result["load_avg_at_end"] = os.getloadavg()
    c, v = result["counts"], result["ledger"]
    print(
        f"{plan.redeploys} redeploys under {plan.connections} connections in {result['wall_s']} s: "
        f"{c.get('opened', 0)} connections opened, {result['responses_seen']} responses "
        f"({c.get('response.completed', 0)} completed, {result['stored_fetched']} stored ones fetched)"
    )
    for entry in result["redeploy_log"]:
        print(
            f"  redeploy at {entry['at_s']} s (took {entry['took_s']} s): {entry['mid_turn_at_start']} sockets "
            f"mid-turn when it began, {entry['mid_turn_when_done']} when the new gateway served; "
            f"{entry['closed_1012']} sockets then closed 1012"
        )
    print("  what the clients saw: " + ", ".join(f"{k} {n}" for k, n in c.items()))
    print(f"  ledger: {v['seen_billed']} billed lines as seen, {v['mismatches']} mismatches")
    print(f"violations: {result['violations']}")
    for example in result["examples"] + v["examples"]:
        print("  ", example)
    results.write(args.out, result, args.run)
    print(f"wrote {args.out}")
    return 0 if result["violations"] == 0 else 1
