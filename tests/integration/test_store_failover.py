"""The store stays available through a Redis Cluster failover (docs/reliability.md, "The
cluster store"): an embedded server on the suite's Redis Cluster (three primaries with a
replica each, ``store.redis_cluster: true``, the defaults otherwise), 20 WebSocket clients
running chains of turns (``store:true``, a quarter ``store:false``), one primary SIGKILLed
mid-run.  Turns fail only while the shard has no primary, with the typed, retryable
``store_unavailable`` (the clients retry the turn); every chain finishes; every completed
response reads back with the same text; the ledger reconciles (bench/reconcile.py: billed
exactly once; docs/reliability.md names the one case of a refused response that is billed).  Then ``store.wait_replicas_policy: strict``: a shard that lost its replica
refuses its writes (``store_unavailable`` over WebSocket, 503 with ``Retry-After`` over HTTP)
until the replica is back.  The killed node is started again (it rejoins as a replica)
before the next test."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import websockets
from redis.crc import key_slot

from bench.client import ws_url
from bench.reconcile import Seen, owner_of, read_redis_ledger, reconcile
from store.redis import Layout
from tests.support.redis import Cluster
from tests.support.server import start_app, stop_app
from tests.support.waiting import until

MODEL = "emu-fast"
CLIENTS = 20
TURNS = 12  # a chain's turns (each completed once)
THINK_S = 0.5  # between a client's turns: the chains span the kill and the promotion
KILL_AFTER_TURNS = CLIENTS  # the kill once this many turns completed: every chain under way
RETRY_S = 0.3  # a client's wait before retrying a turn refused with store_unavailable
PROMOTION_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 75.0
LEDGER_SHARDS = 16  # store.ledger_shards' default
# A failure seen after the promotion still belongs to the outage when its write was retried
# across it: the writer's backoff (at most 0.5 s) and the replicas' refresh.
AFTER_PROMOTION_SLACK_S = 1.5
KILL_ECHO_S = 0.2  # a completion seen this soon after the kill was written before it


def stored_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response.get("output") or ()
        if item.get("type") == "message"
        for part in item.get("content") or ()
    )


@dataclass
class Run:
    """What the clients saw, with the monotonic time of each outcome."""

    seen: Seen = field(default_factory=Seen)
    completed: dict[str, tuple[str, str, bool, float]] = field(
        default_factory=dict
    )  # id → key, text, store, t
    refused: list[tuple[float, str, str]] = field(default_factory=list)  # t, response id, key
    unexpected: list[str] = field(default_factory=list)  # any other failure
    chains_done: int = 0


async def chain(url: str, c: int, run: Run, prefix: str) -> None:
    """One client's chain of TURNS turns on one socket; a turn refused with
    ``store_unavailable`` is sent again (same input, same previous response)."""
    key = f"sk-fo-{prefix}-{c}"
    previous: str | None = None
    async with websockets.connect(
        ws_url(url), max_size=None, open_timeout=30, additional_headers={"Authorization": f"Bearer {key}"}
    ) as ws:
        for turn in range(TURNS):
            store = (c + turn) % 4 != 3
            body: dict[str, Any] = {
                "type": "response.create",
                "model": MODEL,
                "input": f"turn {turn} of chain {c}",
                "store": store,
                "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "12"},
            }
            if previous is not None:
                body["previous_response_id"] = previous
            while True:
                await ws.send(json.dumps(body))
                while True:
                    event = json.loads(await ws.recv())
                    kind = event.get("type")
                    if kind == "response.created":
                        run.seen.created(event["response"], "websocket")
                    if kind in ("response.completed", "response.incomplete", "response.failed", "error"):
                        break
                now = time.monotonic()
                if kind == "error":
                    run.unexpected.append(f"error {event.get('error')}")
                    await asyncio.sleep(RETRY_S)  # the client's back-off: part of the load
                    continue
                response = event["response"]
                run.seen.finished(kind, response)
                if kind == "response.completed":
                    run.completed[response["id"]] = (key, stored_text(response), store, now)
                    previous = response["id"]
                    break
                error = response.get("error") or {}
                if error.get("code") == "store_unavailable":
                    run.refused.append((now, response["id"], key))
                else:
                    run.unexpected.append(f"{kind} {error}")
                await asyncio.sleep(RETRY_S)  # the client's back-off: part of the load
            await asyncio.sleep(THINK_S)  # the client's think time: part of the load
    run.chains_done += 1


def watch_promotion(cluster: Cluster, killed_at: float, out: dict[str, float]) -> None:
    """Until the cluster has three primaries again: the promotion's time."""
    deadline = killed_at + PROMOTION_TIMEOUT_S
    while time.monotonic() < deadline:
        if len(cluster.primaries()) == 3:
            out["promoted_at"] = time.monotonic()
            return
        time.sleep(0.05)


def exported_degradation(timeout_s: float = 30.0) -> dict[str, float]:
    """The store's degradation as Ray's metrics export it (every node's endpoint): the most
    degraded shards any process reports, and the writes taken degraded, summed; polled until
    both are there (Ray's agent exports every few seconds) or ``timeout_s``."""
    from prometheus_client.parser import text_string_to_metric_families

    from serve.embedded import metrics_urls

    deadline = time.monotonic() + timeout_s
    while True:
        shards = writes = 0.0
        for url in metrics_urls():
            text = httpx.get(url, timeout=10).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "ray_responses_ws_store_degraded_shards":
                        shards = max(shards, sample.value)
                    elif sample.name == "ray_responses_ws_store_degraded_writes_total":
                        writes += sample.value
        if (shards and writes) or time.monotonic() > deadline:
            return {"degraded_shards": shards, "degraded_writes": writes}
        time.sleep(1)


def on_slots(layout: Layout, slots: set[int], rid: str, key: str) -> bool:
    """The response's record (and its ledger line) lives on one of ``slots``."""
    return key_slot(layout.record(rid, owner_of(key)).encode()) in slots


@pytest.fixture
def restored(redis_cluster: Cluster):
    """The suite's cluster healthy again after the test: a killed node started again."""
    yield redis_cluster
    for port in redis_cluster.ports:
        if port not in redis_cluster.procs:
            redis_cluster.restart(port)
    redis_cluster.wait_healthy()


def test_a_primary_killed_under_20_clients_fails_turns_only_while_its_shard_has_no_primary(
    ray_cluster, restored: Cluster, capsys
) -> None:
    cluster = restored
    prefix = f"fo{uuid.uuid4().hex[:8]}:"
    app = "rws-store-failover"
    url = start_app(
        app,
        **{
            "store.backend": "redis",
            "store.redis_url": cluster.url,
            "store.redis_cluster": True,
            "store.key_prefix": prefix,
        },
    )
    try:
        run = Run()
        layout = Layout(prefix, LEDGER_SHARDS)
        [victim, *_] = cluster.primaries()
        slots = cluster.slots_of(victim)
        promotion: dict[str, float] = {}

        async def scenario() -> float:
            clients = [asyncio.create_task(chain(url, c, run, prefix)) for c in range(CLIENTS)]
            await until(lambda: len(run.completed) >= KILL_AFTER_TURNS, 60, "the chains' first turns")
            killed_at = time.monotonic()
            cluster.kill(victim)
            watcher = threading.Thread(target=watch_promotion, args=(cluster, killed_at, promotion))
            watcher.start()
            _, unfinished = await asyncio.wait(clients, timeout=RUN_TIMEOUT_S)
            for task in unfinished:  # (a chain that cannot finish: reported below)
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            await asyncio.to_thread(watcher.join)
            return killed_at

        killed_at = asyncio.run(scenario())

        async def verify() -> tuple[list[str], dict[str, Any], set[str]]:
            changed = []
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for rid, (key, text, store, _) in run.completed.items():
                    if not store:
                        continue
                    got = await http.get(f"/v1/responses/{rid}", headers={"Authorization": f"Bearer {key}"})
                    if got.status_code != 200 or stored_text(got.json()) != text:
                        changed.append(f"{rid}: {got.status_code}")
            owners = sorted({owner_of(key) for key, *_ in run.completed.values()})
            lines = await read_redis_ledger(cluster.url, owners, prefix, cluster=True, shards=LEDGER_SHARDS)
            refused_ids = {rid for _, rid, _ in run.refused}
            return changed, reconcile(run.seen, lines), {x.response_id for x in lines} & refused_ids

        changed, verdict, billed_refused = asyncio.run(verify())
        degraded = exported_degradation()
    finally:
        stop_app(app)

    promoted_s = promotion.get("promoted_at", float("inf")) - killed_at
    on_victim = sorted(t for rid, (key, *_, t) in run.completed.items() if on_slots(layout, slots, rid, key))
    first_write_s = next((t - killed_at for t in on_victim if t > killed_at + KILL_ECHO_S), float("inf"))
    refused_s = [round(t - killed_at, 2) for t, _, _ in run.refused]
    stats = {
        "promoted_s": round(promoted_s, 2),
        "first_write_on_killed_shard_s": round(first_write_s, 2),
        "turns_completed": len(run.completed),
        "refused_turns": len(run.refused),
        "refused_at_s": refused_s[:10],
        "other_failures": len(run.unexpected),
        "other_failures_first": run.unexpected[:2],
        "chains_done": run.chains_done,
        "lost_or_changed": len(changed),
        "ledger_mismatches": verdict["mismatches"],
        "billed_though_refused": len(billed_refused),
        "exported": degraded,
    }
    with capsys.disabled():
        print(f"\nstore failover under {CLIENTS} clients: {stats}")
    assert promoted_s < PROMOTION_TIMEOUT_S, "no replica was promoted"
    assert run.chains_done == CLIENTS and len(run.completed) == CLIENTS * TURNS, "a chain did not finish"
    assert run.unexpected == [], "a turn failed otherwise than store_unavailable"
    assert changed == [], "an acknowledged response was lost or changed"
    # A put whose record and line landed (on the promoted replica, its answer lost; or on
    # another shard than its items' keys) but which could not be finished while the shard had
    # no primary, for longer than store.write_retry_s, fails and its line stays
    # (docs/reliability.md, "A store failover").  Only a refused response may be billed so
    # (refused within the outage: asserted above); nothing else may mismatch.
    assert verdict["mismatches"] == verdict["billed_but_seen_unbilled"] == len(billed_refused), verdict
    assert verdict["seen_billed"] == CLIENTS * TURNS, verdict
    for t, rid, _ in run.refused:  # (a put touches its record's slot and its items' keys')
        assert t - killed_at <= promoted_s + AFTER_PROMOTION_SLACK_S, f"{rid} refused after the promotion"
    assert first_write_s < promoted_s + AFTER_PROMOTION_SLACK_S, (
        "the killed shard took no write after its promotion"
    )
    # The promoted primary still has no replica (the killed node is started again only after
    # the test): the processes that wrote to it say so in Ray's metrics.
    assert degraded["degraded_shards"] >= 1 and degraded["degraded_writes"] > 0, degraded


def replica_of(cluster: Cluster, primary: int) -> int:
    """The port of ``primary``'s replica (``INFO replication`` on each node)."""
    import redis

    for port in cluster.procs:
        with redis.Redis(host="127.0.0.1", port=port) as r:
            info = r.info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
            return port
    raise AssertionError(f"no replica of {primary}")


def online_replicas(port: int) -> int:
    import redis

    from store.replication import online_replicas as count

    with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as r:
        return count(r.info("replication"))


async def one_turn(url: str, key: str, n: int) -> tuple[str, dict[str, Any]]:
    """A fresh ``store:true`` response on a socket of its own: its terminal event's type and response."""
    async with websockets.connect(ws_url(url), additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": f"strict {n}",
                    "store": True,
                    "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "4"},
                }
            )
        )
        while True:
            event = json.loads(await ws.recv())
            if event.get("type") in ("response.completed", "response.failed", "response.incomplete"):
                return event["type"], event["response"]
            assert event.get("type") != "error", event


def test_the_strict_policy_refuses_writes_to_a_shard_without_its_replica_with_a_typed_error(
    ray_cluster, restored: Cluster
) -> None:
    cluster = restored
    prefix = f"st{uuid.uuid4().hex[:8]}:"
    layout = Layout(prefix, LEDGER_SHARDS)
    key = f"sk-strict-{prefix}"
    [primary, *_] = cluster.primaries()
    slots = cluster.slots_of(primary)
    lost = replica_of(cluster, primary)
    cluster.kill(lost)
    deadline = time.monotonic() + 10
    while online_replicas(primary) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert online_replicas(primary) == 0
    app = "rws-store-strict"
    url = start_app(
        app,
        **{
            "store.backend": "redis",
            "store.redis_url": cluster.url,
            "store.redis_cluster": True,
            "store.key_prefix": prefix,
            "store.wait_replicas_policy": "strict",
            "store.write_retry_s": 0.5,
        },
    )
    try:

        async def degraded() -> tuple[list[dict], list[dict]]:
            refused, completed = [], []
            for n in range(40):
                kind, response = await one_turn(url, key, n)
                (completed if kind == "response.completed" else refused).append(response)
                if len(refused) >= 3 and len(completed) >= 3:
                    break
            return refused, completed

        refused, completed = asyncio.run(degraded())
        assert len(refused) >= 3 and len(completed) >= 3, (len(refused), len(completed))
        for response in refused:
            assert response["status"] == "failed" and response["usage"] is None
            assert response["error"]["code"] == "store_unavailable", response["error"]
        for response in completed:
            assert not on_slots(layout, slots, response["id"], key), "a write to the degraded shard was taken"

        with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
            answers = []
            for n in range(40):
                answer = http.post(
                    "/v1/responses",
                    json={
                        "model": MODEL,
                        "input": f"http {n}",
                        "store": True,
                        "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "4"},
                    },
                )
                answers.append(answer)
                if answer.status_code == 503:
                    break
            unavailable = answers[-1]
            assert unavailable.status_code == 503, [a.status_code for a in answers]
            assert unavailable.headers["retry-after"] == "1"
            assert unavailable.json()["error"]["code"] == "store_unavailable"
            assert unavailable.json()["error"]["type"] == "server_error"
            assert all(a.status_code == 200 for a in answers[:-1])

        cluster.restart(lost)  # the replica back: the shard takes writes again
        cluster.wait_healthy()

        async def recovered() -> float:
            started = time.monotonic()
            for n in range(200):
                kind, response = await one_turn(url, key, 1000 + n)
                if kind == "response.completed" and on_slots(layout, slots, response["id"], key):
                    return time.monotonic() - started
            raise AssertionError("the shard took no write after its replica came back")

        asyncio.run(recovered())

        async def ledger() -> dict[str, Any]:
            seen = Seen()
            for response in refused + completed:
                seen.created(response, "websocket")
                seen.finished(f"response.{response['status']}", response)
            lines = await read_redis_ledger(
                cluster.url, [owner_of(key)], prefix, cluster=True, shards=LEDGER_SHARDS
            )
            return reconcile(seen, [line for line in lines if line.response_id in seen.responses])

        verdict = asyncio.run(ledger())
        assert verdict["billed_but_seen_unbilled"] == 0 and verdict["lost_lines"] == 0, verdict
    finally:
        stop_app(app)
