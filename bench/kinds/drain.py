"""Drains drop nothing: redeploys under load, every connection and every response accounted for.

    responses-ws bench drain [--connections 300] [--redeploys 3] [--every 20]

Starts an embedded server (its own Ray and a fresh SQLite store, both gone at the end) and
runs ``--connections`` WebSocket clients on the load runner (bench/runner's ``chains``
workload with ``continue_stored``; one client process).  Each runs turns on emu-gpu of ``--min-tokens`` to
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
terminal event, or ended ``response.failed``; a stored response that completed and cannot be
fetched afterwards; and any mismatch of the usage ledger against what the clients saw (each
turn's record: its response id, ``store`` flag, terminal event and usage; bench/reconcile.py).
Exits 1 on any.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from .. import results
from ..reconcile import Response, Seen, read_ledger, reconcile
from ..runner import Chains, LoadResult, LoadSpec, start_local
from ..runner.channels import SHUTTING_DOWN

APP = "responses-ws-drain"
OPEN_TIMEOUT_S = 30.0
RUN_LIMIT_S = 3600.0  # the load's deadline if it is not stopped before (it is, after the tail)
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
# a failed open's type (bench/runner/connecting.py) -> its case here; any other: upgrade_reset
CONNECT_CASES = {
    "connect:InvalidMessage": "upgrade_unanswered",  # closed before it answered the upgrade
    "connect:ConnectionRefusedError": "port_closed",
    "connect:TimeoutError": "upgrade_timeout",
}
ABNORMAL_CLOSE = 1006
CLOSE_WAIT_S = 10.0  # for the server's close after server_shutting_down


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


def load_spec(url: str, plan: Plan) -> LoadSpec:
    """The clients as the runner runs them: chains of ``plan.turns`` turns, a new connection
    after each, started over the first second; a client told to go continues on a new
    connection as docs/reliability.md asks (``Chains.continue_stored``, ``resend_unstarted``)."""
    chains = Chains(
        turns_per_chain=plan.turns,
        think_s=plan.think_ms / 1000,
        think_spread=0.5,
        text_tokens=(plan.min_tokens, plan.max_tokens),
        store_share=plan.store_share,
        continue_stored=True,
        resend_unstarted=True,
        close_wait_s=CLOSE_WAIT_S,
        reconnect_s=0.5,  # the refusals' Retry-After is 1 s
        ping_interval_s=20.0,
        compression="deflate",
        model=plan.model,
    )
    return LoadSpec(
        targets=(url,),
        loops=plan.connections,
        workload="chains",
        chains=chains,
        ramp_s=1.0,
        warmup_s=0.0,
        duration_s=RUN_LIMIT_S,
        open_timeout_s=OPEN_TIMEOUT_S,
        connect_attempts=1,
        seed=plan.seed,
    )


def tally(result: LoadResult, t0: float) -> tuple[Counter[str], list[str]]:
    """What the clients saw, case by case (from the run's turn and connection records), with a
    few examples of each violation, each at its time from ``t0`` (time.time())."""
    counts: Counter[str] = Counter()
    examples: list[tuple[float, str]] = []

    def add(case: str, at: float, detail: str = "", n: int = 1) -> None:
        counts[case] += n
        if case in VIOLATIONS:
            examples.append((at, f"{at - t0:.1f} s {case}: {detail}"[:300]))

    for kind, n in result.connect_failures.items():
        if kind.startswith("connect:http_"):
            untyped = result.connect_untyped.get(kind, 0)
            counts["upgrade_refused_typed"] += n - untyped
            if untyped:
                add("upgrade_refused_untyped", t0, f"{untyped} x {kind}", untyped)
        else:
            case = CONNECT_CASES.get(kind, "upgrade_reset")
            add(case, t0, f"{n} x {kind}", n)
    for c in result.connections:
        counts["opened"] += 1
        at = c.closed or c.opened
        if c.left_open:
            add(
                "closed_other_code",
                at,
                f"port {c.local_port}: no close within {CLOSE_WAIT_S:g} s of server_shutting_down",
            )
        elif c.close_code == 1012:
            counts["closed_1012"] += 1
        elif c.close_code == ABNORMAL_CLOSE:
            add("closed_abnormally", at, f"port {c.local_port}")
        elif c.close_code is not None:
            add("closed_other_code", at, f"port {c.local_port}: {c.close_code}")
        elif not c.stopped and c.closed is not None:
            counts["client_closed"] += 1
    for r in result.records:
        counts["resent"] += r.resent
        if r.terminal is not None:
            counts[r.terminal] += 1
            if r.terminal == "response.failed":  # the emulated model never fails on its own
                add("response_failed", r.done, f"{r.response_id}: {r.error_code}")
        elif (r.error_code or "").startswith("closed_"):
            if r.response_id is not None:
                add("lost_terminal", r.done, f"{r.response_id} (then {r.error_code})")
        elif r.error_code == SHUTTING_DOWN and r.response_id is None:
            counts["create_refused_draining"] += 1
        else:
            add("error_other", r.done, f"{r.response_id}: {r.error_code}")
    return counts, [text for _, text in sorted(examples)[:20]]


def seen_of(result: LoadResult) -> Seen:
    """Every response the clients saw start or end, with its store flag, terminal and usage."""
    seen = Seen()
    for r in result.records:
        if r.response_id is not None:
            seen.responses[r.response_id] = Response("websocket", bool(r.store), r.terminal, r.usage)
    return seen


async def fetch_stored(url: str, seen: Seen, counts: Counter[str], examples: list[str]) -> int:
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
                counts["stored_lost"] += 1
                if len(examples) < 20:
                    examples.append(f"stored_lost: {rid}: {got.status_code} {got.text[:100]}")

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await asyncio.gather(*(worker(http) for _ in range(8)))
    return len(ids)


async def redeploys(
    url: str, data_dir: str | Path, plan: Plan, redeploy: Callable[[int], object]
) -> dict[str, Any]:
    """Run the clients against the server at ``url`` (its SQLite store in ``data_dir``) and
    call ``redeploy(k)`` (blocking: it returns once the new gateway serves) ``plan.redeploys``
    times; the verdict."""
    t0 = time.time()
    run = await asyncio.to_thread(start_local, load_spec(url, plan))
    log: list[dict[str, Any]] = []
    with run:
        await asyncio.sleep(max(0.0, run.release_at + 1.0 - time.time()))  # every client started
        for k in range(plan.redeploys):
            await asyncio.sleep(plan.every_s)
            began, mid_turn = time.time(), await asyncio.to_thread(run.in_turn)
            await asyncio.to_thread(redeploy, k)
            log.append(
                {
                    "at_s": round(began - t0, 1),
                    "took_s": round(time.time() - began, 1),
                    "mid_turn_at_start": mid_turn,
                    "mid_turn_when_done": await asyncio.to_thread(run.in_turn),
                    "began": began,
                }
            )
        last = time.time()
        await asyncio.sleep(plan.tail_s)
        result = await asyncio.to_thread(run.stop)
    wall = time.time() - t0
    ends = [*(e["began"] for e in log[1:]), float("inf")]
    for entry, end in zip(log, ends):
        began = entry.pop("began")
        entry["closed_1012"] = sum(
            1 for c in result.connections if c.close_code == 1012 and began <= (c.closed or 0.0) < end
        )
    await asyncio.sleep(1.0)  # the last sockets' store writes
    counts, examples = tally(result, t0)
    seen = seen_of(result)
    stored = await fetch_stored(url, seen, counts, examples)
    ledger = reconcile(seen, read_ledger(data_dir))
    completed_after = sum(1 for r in result.records if r.terminal == "response.completed" and r.done >= last)
    return {
        "plan": asdict(plan),
        "wall_s": round(wall, 1),
        "redeploy_log": log,
        "responses_seen": len(seen.responses),
        "stored_fetched": stored,
        "counts": dict(sorted(counts.items())),
        "completed_after_last_redeploy": completed_after,
        "violations": sum(counts[case] for case in VIOLATIONS) + ledger["mismatches"],
        "examples": examples,
        "ledger": ledger,
        "clients": [c.as_dict() for c in result.clients],
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
