"""Usage exactly once across nodes: whole session nodes SIGKILLed, their disk lost with them,
during a ``store:false`` soak through the balancer; the cluster ledger reconciled.

    sudo .venv/bin/responses-ws bench ledger nodes [--ws 32] [--http 8] [--kills 2]
                                                   [--ledger auto|journal|commit] [--store-pause 0]

Starts the real-node harness (bench/multinode: a head with Redis and the inference replicas,
two session nodes, HAProxy in front; needs root) with ``store.ledger`` set to ``--ledger``
(``auto``: ``commit`` on Redis), then runs ``--ws`` WebSocket clients (short ``store:false``
turns chained with ``previous_response_id``, a new chain on every new connection) and
``--http`` HTTP clients (``store:false``, SSE) through the balancer: the clients of
``bench ledger``.  After ``--warm`` seconds (and, with ``--store-pause S``, once the store
has been paused for S seconds: every commit waits, as in a store's failover) it SIGKILLs
every process of a session node (gateway, session hosts, raylet: :meth:`Harness.kill`),
alternating between the two, and takes the node's disk with it: the ledger journals of the
killed processes are deleted, as an instance's local disk is gone with the instance (the
harness's nodes share this machine's disk, so without that another node's writer would
commit them); then the store goes on.  The node is started again
(:meth:`Harness.restart`), the soak goes on ``--settle`` seconds, then the next kill; ``--tail``
seconds after the last restart the clients stop.  Every ledger line is then read from Redis
and reconciled against what the clients saw (bench/reconcile.py): every response whose
terminal event a client saw with ``usage`` has exactly one line with that usage; one seen
failed unbilled has none; no line for a response no client saw start; no duplicates.  A
response its client saw start but not end (its node died) may be billed or not: counted
apart.  Prints and saves the reconciliation; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import results
from ..multinode import Harness, network
from ..reconcile import journal_lines, owner_of, read_redis_ledger, reconcile
from ..stats import pct
from .ledger import Clients, seen_by
from .ledger import Plan as ClientPlan


@dataclass(frozen=True)
class Plan:
    ws: int = 32
    http: int = 8
    kills: int = 2
    warm_s: float = 8.0  # the soak before the first kill
    settle_s: float = 8.0  # after a restarted node is ready, before the next kill
    tail_s: float = 5.0  # after the last restart
    store_pause_s: float = 0.0  # the store (Redis) paused this long before each kill, resumed after it
    max_text_tokens: int = 40
    seed: int = 0

    def clients(self) -> ClientPlan:
        """The ``bench ledger`` clients' plan: every turn ``store:false``."""
        return ClientPlan(
            ws=self.ws, http=self.http, store_share=0.0, max_text_tokens=self.max_text_tokens, seed=self.seed
        )


def lose_disk(journal_dir: Path, pids: list[int]) -> dict[str, int]:
    """Delete the ledger journals of the processes ``pids`` (a node's, just killed): its disk
    is gone.  How many files and lines went with it."""
    files = lines = 0
    if journal_dir.is_dir():
        for path in journal_dir.glob("*.jsonl"):
            stem = path.name.removesuffix(".jsonl").removesuffix(".closed")
            if stem.rsplit(".", 1)[-1] in {str(p) for p in pids}:
                lines += journal_lines(path)
                path.unlink(missing_ok=True)
                files += 1
    return {"journal_files": files, "journal_lines": lines}


async def kill_nodes(harness: Harness, plan: Plan, t0: float, kills: list[dict[str, Any]]) -> None:
    """``plan.kills`` node kills, alternating between the session nodes, each followed by the
    node's restart and ``plan.settle_s`` (the last by ``plan.tail_s``)."""
    names = [n.name for n in harness.session_nodes]
    journal_dir = harness.data_dir / "ledger-journal"
    await asyncio.sleep(plan.warm_s)
    for i in range(plan.kills):
        victim = names[i % len(names)]
        if plan.store_pause_s > 0:
            harness.pause_store()
            await asyncio.sleep(plan.store_pause_s)
        pids = network.namespace_pids(harness.node(victim).namespace)
        at = time.monotonic()
        try:
            processes = await asyncio.to_thread(harness.kill, victim)
            lost = lose_disk(journal_dir, pids)
        finally:
            if plan.store_pause_s > 0:
                harness.pause_store(False)
        record = {"node": victim, "t_s": round(at - t0, 1), "processes": processes, **lost}
        kills.append(record)
        await asyncio.to_thread(harness.restart, victim)
        record["restarted_after_s"] = round(time.monotonic() - at, 1)
        await asyncio.sleep(plan.settle_s if i < plan.kills - 1 else plan.tail_s)


async def soak(harness: Harness, plan: Plan) -> dict[str, Any]:
    """Run the clients through ``harness``'s balancer while session nodes are killed and
    restarted; the reconciled result."""
    t0 = time.monotonic()
    clients_plan = plan.clients()
    # A key of this run's own: the ledger read back is this soak's, not the cluster's other work.
    key = f"sk-nodeledger-{secrets.token_hex(8)}"
    clients = await Clients.start(harness.url, clients_plan, key)
    kills: list[dict[str, Any]] = []
    try:
        await kill_nodes(harness, plan, t0, kills)
    finally:
        results = await clients.stop()
    seen, stats, gaps = seen_by(results)
    soak_s = time.monotonic() - t0
    await asyncio.sleep(1.0)  # connections closing: nothing more is written after a terminal event
    lines = await read_redis_ledger(harness.redis_url, [owner_of(key)])
    journal_dir = harness.data_dir / "ledger-journal"
    left = sorted(p.name for p in journal_dir.glob("*.jsonl")) if journal_dir.is_dir() else []
    return {
        "plan": asdict(plan),
        "soak_s": round(soak_s, 1),
        "kills": kills,
        **stats,
        "turns_per_s": round(stats["turns"] / soak_s, 1),
        "ws_terminal_gap_ms": {"p50": pct(gaps, 0.5), "p90": pct(gaps, 0.9)},
        "journal_dir_exists": journal_dir.is_dir(),
        "journals_left": left,
        "reconcile": reconcile(seen, lines),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Plan()
    p.add_argument("--ws", type=int, default=d.ws, help="WebSocket clients")
    p.add_argument("--http", type=int, default=d.http, help="HTTP (SSE) clients")
    p.add_argument("--kills", type=int, default=d.kills, help="session-node SIGKILLs, alternating")
    p.add_argument("--warm", type=float, default=d.warm_s, help="seconds of load before the first kill")
    p.add_argument("--settle", type=float, default=d.settle_s, help="seconds after a restart, before a kill")
    p.add_argument("--tail", type=float, default=d.tail_s, help="seconds after the last restart")
    p.add_argument(
        "--store-pause",
        type=float,
        default=d.store_pause_s,
        help="seconds the store (Redis) is paused (SIGSTOP) before each kill; resumed after it",
    )
    p.add_argument(
        "--ledger",
        choices=("auto", "journal", "commit"),
        default="auto",
        help="store.ledger of the deployed app (auto: commit on Redis)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", type=Path, default=Path("results/nodeledger.json"))


def summary(result: dict[str, Any], ledger: str) -> str:
    """The printed reconciliation of a run with ``store.ledger`` ``ledger``."""
    v = result["reconcile"]
    kills = "; ".join(
        f"{k['node']} at {k['t_s']} s ({k['processes']} processes, {k['journal_files']} journals with "
        f"{k['journal_lines']} lines lost with its disk, ready again after {k.get('restarted_after_s')} s)"
        for k in result["kills"]
    )
    return (
        f"store.ledger {ledger}: {len(result['kills'])} session nodes killed: {kills}\n"
        f"{result['turns']} turns in {result['soak_s']} s; {v['responses_seen']} responses seen, "
        f"{v['ledger_lines']} ledger lines; journal files left on the nodes' disk: "
        f"{len(result['journals_left'])}\n"
        f"seen billed {v['seen_billed']}, seen unbilled {v['seen_unbilled']}, cut by a kill: "
        f"{v['billed_unseen']} billed, {v['cut_unbilled']} unbilled\n"
        f"mismatches {v['mismatches']}: lost {v['lost_lines']}, duplicates {v['duplicate_lines']}, "
        f"usage {v['usage_mismatches']}, billed though seen unbilled {v['billed_but_seen_unbilled']}, "
        f"never seen {v['lines_never_seen']}"
    )


def run(args: argparse.Namespace) -> int:
    plan = Plan(
        ws=args.ws,
        http=args.http,
        kills=args.kills,
        warm_s=args.warm,
        settle_s=args.settle,
        tail_s=args.tail,
        store_pause_s=args.store_pause,
        seed=args.seed,
    )

    def edit(app_args: dict[str, Any]) -> None:
        app_args.setdefault("store", {})["ledger"] = args.ledger

    with Harness(edit_args=edit) as harness:
        result = asyncio.run(soak(harness, plan))
    result["server"] = {"ledger": args.ledger, "store": "redis", "nodes": "head + 2 session nodes"}
    result["load_avg_at_end"] = os.getloadavg()
    print(summary(result, args.ledger))
    for example in result["reconcile"]["examples"]:
        print("mismatch:", example)
    results.write(args.out, result, args.run)
    print(f"wrote {args.out}")
    print(json.dumps(result["reconcile"]))
    return 0 if result["reconcile"]["mismatches"] == 0 else 1
