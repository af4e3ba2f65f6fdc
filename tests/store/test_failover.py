"""Nothing acknowledged is lost on a store failover: a real Redis Cluster (the suite's
``redis_cluster``: three primaries with a replica each) under a load of concurrent writers
through the store's public API (:class:`store.StoreWriter` in front of :func:`store.open_store`,
each write waiting for a replica: ``store.wait_replicas``), one primary SIGKILLed mid-load.
Its replica is promoted, the client follows the new slot map, and at the end every write a
writer saw succeed — what a client would have seen end — is read back: each record fetchable,
each line billed exactly once.  The killed node is started again (it rejoins as a replica)
before the next test."""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.crc import key_slot

from store import StoreConfig, StoredResponse, UsageEntry, open_store
from store.redis import RedisStore
from store.writer import StoreWriter
from tests.support.redis import Cluster
from tests.support.waiting import until

OWNERS = ("key_alice", "key_bob", "key_carol")
WRITERS = 16
ACKED_BEFORE_KILL = 200  # writes acknowledged before the kill: the load is under way
ACKED_AFTER_REJOIN = 200  # and after the old node rejoined: a third of them on its slots
PROMOTION_TIMEOUT_S = 30.0


def entry(rid: str, owner: str) -> UsageEntry:
    return UsageEntry(rid, owner, "emu-fast", "websocket", 10, 2, len(rid), 1.5)


def record(rid: str, owner: str) -> StoredResponse:
    item = {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": rid}],
    }
    return StoredResponse(rid, owner, 1.0, {"id": rid, "output": [item]}, [], [item])


async def load(
    config: StoreConfig, cluster: Cluster
) -> tuple[dict[str, str], dict[str, str], set[str], dict]:
    """Writers putting records with their lines and billing lines; once ACKED_BEFORE_KILL writes
    are acknowledged a primary is killed, its replica promoted, the old node started again (now
    its replica), and the load goes on for ACKED_AFTER_REJOIN more.  The ids acknowledged (records and store:false lines, by owner),
    every id tried, and counts."""
    writer = StoreWriter(open_store(config))
    stored: dict[str, str] = {}  # acknowledged: record and line
    billed: dict[str, str] = {}  # acknowledged: line only
    tried: set[str] = set()
    failures = 0
    stop = asyncio.Event()

    async def write(w: int) -> None:
        nonlocal failures
        i = 0
        while not stop.is_set():
            i += 1
            owner = OWNERS[(w + i) % len(OWNERS)]
            rid = f"resp_{w}_{i}"
            tried.add(rid)
            try:
                if i % 2:
                    await writer.put(record(rid, owner), entry(rid, owner))
                    stored[rid] = owner
                else:
                    await writer.bill(entry(rid, owner))
                    billed[rid] = owner
            except Exception:  # noqa: BLE001 - a write the client sees fail (not acknowledged)
                failures += 1
                await asyncio.sleep(0.05)  # the client's back-off: part of the load, not a wait

    tasks = [asyncio.create_task(write(w)) for w in range(WRITERS)]
    await until(
        lambda: len(stored) + len(billed) >= ACKED_BEFORE_KILL, 60, "writes acknowledged before the kill"
    )
    [victim, *_] = cluster.primaries()
    slots = cluster.slots_of(victim)
    acked_before = len(stored) + len(billed)
    killed_at = time.monotonic()
    cluster.kill(victim)
    deadline = killed_at + PROMOTION_TIMEOUT_S
    while len(cluster.primaries()) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    promoted_s = time.monotonic() - killed_at
    # The promoted primary has no replica: its writes wait for none (store.wait_replicas_policy:
    # available) until the old node is back, as its replica.
    cluster.restart(victim)
    await asyncio.to_thread(cluster.wait_healthy)
    rejoined = set(stored) | set(billed)
    await until(
        lambda: len(stored) + len(billed) >= len(rejoined) + ACKED_AFTER_REJOIN,
        60,
        "writes acknowledged after the old primary rejoined",
    )
    stop.set()
    await asyncio.gather(*tasks)
    await writer.close()
    layout = open_store(config)
    assert isinstance(layout, RedisStore)
    after = list({**stored, **billed}.keys() - rejoined)
    moved = [
        rid
        for rid in after
        if key_slot(layout.layout.ledger({**stored, **billed}[rid], rid)[0].encode()) in slots
    ]
    await layout.close()
    stats = {
        "promoted_s": round(promoted_s, 1),
        "acked_before_kill": acked_before,
        "acked_after_rejoin": len(after),
        "of_them_on_the_killed_primarys_slots": len(moved),
        "failed_writes": failures,
    }
    return stored, billed, tried, stats


def test_a_primary_killed_under_load_loses_no_acknowledged_record_or_line(
    redis_cluster: Cluster, capsys
) -> None:
    config = StoreConfig(
        backend="redis", redis_url=redis_cluster.url, redis_cluster=True, key_prefix=f"fo-{uuid.uuid4().hex}:"
    )
    assert config.replicas_to_wait == 1

    async def scenario() -> dict:
        stored, billed, tried, stats = await load(config, redis_cluster)
        store = open_store(config)
        try:
            for rid, owner in stored.items():
                assert await store.get(rid, owner) == record(rid, owner), f"acknowledged record {rid} lost"
            lines = [e for owner in OWNERS for e in await store.usage(owner)]
        finally:
            await store.close()
        ids = [e.response_id for e in lines]
        assert len(ids) == len(set(ids)), "a line billed twice"
        assert set(ids) <= tried
        by_id = {e.response_id: e for e in lines}
        for rid, owner in {**stored, **billed}.items():
            assert by_id.get(rid) == entry(rid, owner), f"acknowledged line {rid} lost or changed"
        return {**stats, "acknowledged": len(stored) + len(billed), "lines": len(lines)}

    try:
        stats = asyncio.run(scenario())
    finally:
        for port in redis_cluster.ports:  # the killed node back (a test that failed midway)
            if port not in redis_cluster.procs:
                redis_cluster.restart(port)
        redis_cluster.wait_healthy()
    with capsys.disabled():
        print(f"\nfailover under load: {stats}")
    assert stats["promoted_s"] < PROMOTION_TIMEOUT_S, "no replica was promoted"
    assert stats["of_them_on_the_killed_primarys_slots"] > 0, "the client did not follow the new primary"
