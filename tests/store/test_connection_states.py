"""Connection states in the cluster store (store/connection_states.py) against a real, private
redis-server and a real Redis Cluster (the suite's ``redis_server`` and ``redis_cluster``
fixtures): sealing, claiming, the fencing that keeps one holder per connection, and the
checkpoints written as changes on a snapshot (store/splice.py)."""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest
from cryptography.exceptions import InvalidTag
from redis.asyncio.cluster import RedisCluster

from store.connection_states import ContinuityStore, Fenced, seal, secret_hash, unseal
from store.redisconn import Client, connect
from store.splice import Splice, apply, diff
from tests.support.waiting import until

OWNER, OTHER = "key_alice", "key_bob"
STATE = b'{"v":1,"lanes":[{"items":[{"type":"message","content":"the private chain"}]}]}'


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(params=["redis", "redis-cluster"])
def make(request, redis_server, redis_cluster):
    """Stores on one redis-server and on the Redis Cluster (both named here: the tests that
    use them are marked integration)."""
    prefix = f"test-{uuid.uuid4().hex}:"
    cluster = request.param == "redis-cluster"
    url = redis_cluster.url if cluster else redis_server

    def make(ttl_s: float = 30.0) -> ContinuityStore:
        return ContinuityStore(url, prefix, ttl_s=ttl_s, cluster=cluster)

    def client() -> Client:
        """A client of the same server, the test's own (what an operator's redis-cli sees)."""
        return connect(url, cluster=cluster)

    make.url, make.cluster = url, cluster  # for a synchronous client of the same server
    make.client = client
    return make


async def expired(store: ContinuityStore) -> bool:
    """Nothing of the store's is left in Redis (its keys' TTL passed: Redis's clock, not ours)."""
    return not await store.keys()


async def subscribed(redis: Client, store: ContinuityStore) -> bool:
    """A channel under the store's prefix has a subscriber (PUBSUB CHANNELS; a cluster's nodes
    each list only their own subscribers, so every node is asked)."""
    pattern = f"{store.key_prefix}*"
    if isinstance(redis, RedisCluster):
        return bool(await redis.pubsub_channels(pattern, target_nodes=RedisCluster.ALL_NODES))
    return bool(await redis.pubsub_channels(pattern))


async def first_holder(store: ContinuityStore, conn: str, secret: str, holder: str = "host-a") -> None:
    await store.save(conn, 1, secret, owner=OWNER, deadline=1e9, holder=holder, state=STATE)


def test_sealed_state_reads_back_only_with_the_secret():
    blob = seal("s3cret", "conn-1", STATE)
    assert b"private" not in blob.encode()
    assert unseal("s3cret", "conn-1", blob) == STATE
    with pytest.raises(InvalidTag):
        unseal("other", "conn-1", blob)
    with pytest.raises(InvalidTag):  # the connection id is bound in: a blob cannot be moved
        unseal("s3cret", "conn-2", blob)


def test_the_server_keeps_the_secrets_hash_and_ciphertext_only_with_a_ttl(make):
    async def main():
        store = make(ttl_s=30)
        redis = make.client()
        try:
            await first_holder(store, "c1", "s3cret")
            raw = await redis.hgetall(store.key("c1"))
            assert raw["hash"] == secret_hash("s3cret") and "s3cret" not in str(raw)
            assert "private" not in str(raw)
            assert 0 < await redis.pttl(store.key("c1")) <= 30_000
        finally:
            await store.close()
            await redis.aclose()

    run(main())


def test_a_claim_needs_the_secret_and_the_owner_and_bumps_the_epoch(make):
    async def main():
        store = make()
        try:
            await first_holder(store, "c1", "s3cret")
            assert await store.claim("c1", "wrong", OWNER, "host-b") is None
            assert await store.claim("c1", "s3cret", OTHER, "host-b") is None
            assert await store.claim("nope", "s3cret", OWNER, "host-b") is None
            claimed = await store.claim("c1", "s3cret", OWNER, "host-b")
            assert claimed is not None and claimed.epoch == 2 and claimed.state == STATE
            assert claimed.deadline == 1e9
        finally:
            await store.close()

    run(main())


def test_a_stale_holder_can_neither_write_nor_refresh_nor_delete(make):
    async def main():
        store = make()
        redis = make.client()
        try:
            await first_holder(store, "c1", "s3cret")
            claimed = await store.claim("c1", "s3cret", OWNER, "host-b")
            assert claimed is not None
            with pytest.raises(Fenced):
                await store.save("c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=b"{}")
            with pytest.raises(Fenced):
                await store.touch("c1", 1)
            await store.forget("c1", 1)  # not ours any more: nothing deleted
            again = await store.claim("c1", "s3cret", OWNER, "host-c")
            assert again is not None and again.state == STATE and again.epoch == 3
            with pytest.raises(Fenced):  # host-b is stale now too
                await store.save("c1", 2, "s3cret", owner=OWNER, deadline=1e9, holder="host-b", state=b"{}")
            await store.save("c1", 3, "s3cret", owner=OWNER, deadline=1e9, holder="host-c", state=b"{}")
            assert await store.touch("c1", 3)
            await store.forget("c1", 3)
            assert await redis.hgetall(store.key("c1")) == {"epoch": "ended"}, "no content kept"
            assert await store.keys() == [store.key("c1")], "the log went with it"
        finally:
            await store.close()
            await redis.aclose()

    run(main())


def test_concurrent_claims_get_distinct_epochs_and_only_the_last_one_writes(make):
    async def main():
        stores = [make() for _ in range(8)]
        try:
            await first_holder(stores[0], "c1", "s3cret")
            claims = await asyncio.gather(
                *(s.claim("c1", "s3cret", OWNER, f"host-{i}") for i, s in enumerate(stores))
            )
            epochs = sorted(c.epoch for c in claims if c is not None)
            assert epochs == list(range(2, 10))
            outcomes = await asyncio.gather(
                *(
                    s.save(
                        "c1", c.epoch, "s3cret", owner=OWNER, deadline=1e9, holder=f"host-{i}", state=b"{}"
                    )
                    for i, (s, c) in enumerate(zip(stores, claims))
                    if c is not None
                ),
                return_exceptions=True,
            )
            winners = [c.epoch for c, o in zip(claims, outcomes) if not isinstance(o, Fenced)]
            assert winners == [9]
        finally:
            for s in stores:
                await s.close()

    run(main())


def test_the_old_holder_is_told_when_another_takes_its_connection(make):
    async def main():
        old, new, redis = make(), make(), make.client()
        told: asyncio.Queue[str] = asyncio.Queue()
        try:
            old.listen("host-a", told.put_nowait)
            await until(lambda: subscribed(redis, old), 5, "the old holder's subscription", every_s=0.02)
            await first_holder(old, "c1", "s3cret", holder="host-a")
            assert await new.claim("c1", "s3cret", OWNER, "host-b") is not None
            assert await asyncio.wait_for(told.get(), 5) == "c1 2"
        finally:
            await old.close()
            await new.close()
            await redis.aclose()

    run(main())


def test_an_expired_state_is_not_claimable_and_a_live_holder_may_write_it_again(make):
    async def main():
        store = make(ttl_s=0.2)
        try:
            await first_holder(store, "c1", "s3cret")
            await until(lambda: expired(store), 5, "the state's expiry (its TTL, in Redis)", every_s=0.02)
            assert await store.claim("c1", "s3cret", OWNER, "host-b") is None
            assert not await store.touch("c1", 1)  # expired: the holder writes it again
            await first_holder(store, "c1", "s3cret")
            assert await store.claim("c1", "s3cret", OWNER, "host-b") is not None
        finally:
            await store.close()

    run(main())


def test_after_a_normal_close_no_late_write_brings_the_state_back(make):
    """A holder's write or refresh still in flight when the state is deleted (its own, or an
    older holder's) is fenced, and the token is refused: the marker left has no content."""

    async def main():
        store = make()
        redis = make.client()
        try:
            await first_holder(store, "c1", "s3cret")
            claimed = await store.claim("c1", "s3cret", OWNER, "host-b")
            assert claimed is not None
            await store.forget("c1", claimed.epoch)
            for epoch in (claimed.epoch, 1):
                with pytest.raises(Fenced):
                    await store.save(
                        "c1", epoch, "s3cret", owner=OWNER, deadline=1e9, holder="h", state=b"{}"
                    )
                with pytest.raises(Fenced):
                    await store.touch("c1", epoch)
            assert await store.claim("c1", "s3cret", OWNER, "host-c") is None
            assert await redis.hgetall(store.key("c1")) == {"epoch": "ended"}
            assert 0 < await redis.pttl(store.key("c1")) <= store.ttl_ms
        finally:
            await store.close()
            await redis.aclose()

    run(main())


def state(turn: int) -> bytes:
    """A conversation's state after ``turn`` turns, in the layout of actors/core/resumable.py:
    a lane's items, then its latest response id."""
    items = [b'{"turn":0}', *(b'{"turn":%d,"text":"%s"}' % (t, b"x" * 200) for t in range(1, turn + 1))]
    return b'{"v":1,"lanes":[{"lane":"a","items":[' + b",".join(items) + b'],"id":"resp_%d"}]}' % turn


def states(n: int) -> list[bytes]:
    """``n`` states of a conversation that grows by a turn each."""
    return [state(turn) for turn in range(1, n + 1)]


def test_a_splice_turns_any_state_into_any_other():
    rng = random.Random(7)
    for _ in range(300):
        old = bytes(rng.choice(b"ab{}") for _ in range(rng.randrange(0, 60)))
        new = bytes(rng.choice(b"ab{}") for _ in range(rng.randrange(0, 60)))
        splice = Splice.decode(diff(old, new).encode())
        state = bytearray(old)
        apply(state, splice)
        assert bytes(state) == new
    with pytest.raises(ValueError):
        apply(bytearray(b"short"), Splice(3, 10, b""))


def test_a_splice_of_a_grown_state_is_the_growth_whatever_the_length():
    for n in (10, 10_000):
        splice = diff(state(n - 1), state(n))
        assert len(splice.inserted) < 250, (n, len(splice.inserted))


def test_checkpoints_append_changes_and_compact_and_a_claim_rebuilds_the_latest(make):
    async def main():
        store = make()
        redis = make.client()
        reader = make()
        try:
            turns = states(40)
            sizes = []
            for turn in turns:
                before = store.bytes_written
                await store.save("c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=turn)
                sizes.append(store.bytes_written - before)
            median = sorted(sizes)[len(sizes) // 2]
            assert median < 400, "most checkpoints wrote only their change"
            assert max(sizes[-20:]) > 10 * median, "a compaction wrote a snapshot now and then"
            raw = await redis.hgetall(store.key("c1"))
            log = await redis.lrange(store.key("c1") + ":log", 0, -1)
            assert int(raw["seq"]) == len(log) and "turn" not in str(raw) + str(log), "sealed"
            claimed = await reader.claim("c1", "s3cret", OWNER, "host-b")
            assert claimed is not None and claimed.state == turns[-1] and claimed.epoch == 2
            with pytest.raises(Fenced):  # the old holder's next change is fenced like a snapshot
                await store.save(
                    "c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=turns[0]
                )
            more = states(45)[40:]
            for turn in more:  # the new holder goes on with changes on what it claimed
                await reader.save("c1", 2, "s3cret", owner=OWNER, deadline=1e9, holder="host-b", state=turn)
            again = await store.claim("c1", "s3cret", OWNER, "host-a")
            assert again is not None and again.state == more[-1]
        finally:
            await store.close()
            await redis.aclose()
            await reader.close()

    run(main())


def test_log_entries_cannot_be_reordered_or_moved(make):
    async def main():
        store = make()
        redis = make.client()
        try:
            turns = [state(20), state(21), state(22)]  # a snapshot, then two changes
            for turn in turns:
                await store.save("c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=turn)
            log_key = store.key("c1") + ":log"
            first, second = await redis.lrange(log_key, 0, -1)
            await redis.delete(log_key)
            await redis.rpush(log_key, second, first)
            with pytest.raises(InvalidTag):
                await store.claim("c1", "s3cret", OWNER, "host-b")
        finally:
            await store.close()
            await redis.aclose()

    run(main())


def test_a_change_on_an_expired_state_writes_a_snapshot(make):
    async def main():
        store = make(ttl_s=0.2)
        try:
            turns = [state(20), state(21), state(22)]
            for turn in turns[:2]:
                await store.save("c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=turn)
            await until(
                lambda: expired(store), 5, "the state's expiry (its TTL, in Redis)", every_s=0.02
            )  # no base
            await store.save("c1", 1, "s3cret", owner=OWNER, deadline=1e9, holder="host-a", state=turns[2])
            claimed = await store.claim("c1", "s3cret", OWNER, "host-b")
            assert claimed is not None and claimed.state == turns[2]
        finally:
            await store.close()

    run(main())


def test_bytes_written_per_turn_are_flat_from_2k_to_100k_tokens_of_history(redis_server, capsys):
    """A real session's state, turn after turn (tests/support/continuity_cost.py): the bytes
    a checkpoint writes follow the turn, not the history; a full rewrite would follow the state."""
    from tests.support.continuity_cost import bands, measure

    turns = run(measure(redis_server, max_tokens=100_000))
    first, *_, last = bands(turns)
    with capsys.disabled():
        print(
            f"\ncontinuity checkpoints (python -m tests.support.continuity_cost URL): history "
            f"{first['tokens']} tokens: {first['written_median']:.0f} bytes a turn (mean {first['written_mean']:.0f}, "
            f"state {first['state_kb']:.0f} KB); {last['tokens']}: {last['written_median']:.0f} "
            f"(mean {last['written_mean']:.0f}, state {last['state_kb']:.0f} KB)"
        )
    assert last["written_median"] < 1.5 * first["written_median"], (first, last)
    assert last["written_mean"] < 4 * first["written_median"], "compactions amortized over the turns"
    assert last["written_mean"] < last["state_kb"] * 1024 / 10, "far below rewriting the state"


def test_the_state_reader_reads_the_snapshot_with_its_log_applied_and_claims_nothing(make):
    """``store.state_reader``: what a claim would restore, read without a claim (the epoch
    and the holder stay as the writer left them)."""
    import redis as sync_redis

    from store.state_reader import read_state

    async def scenario() -> None:
        store = make()
        conn, secret = f"c-{uuid.uuid4().hex}", "s3cret"
        await first_holder(store, conn, secret)
        later = STATE.replace(b"the private chain", b"the private chain, and a later turn")
        await store.save(conn, 1, secret, owner=OWNER, deadline=1e9, holder="host-a", state=later)
        first = make.url.split(",")[0]  # a cluster's URL lists its startup nodes
        client = sync_redis.RedisCluster.from_url(first) if make.cluster else sync_redis.Redis.from_url(first)
        try:
            fields, state = read_state(client, f"rws2.{conn}.{secret}", store.key_prefix)
            assert fields["log"], "the second save is a change in the log, not a snapshot"
            assert state == json.loads(later)
            assert fields["epoch"] == "1" and fields["holder"] == "host-a"
        finally:
            client.close()
        await store.close()

    run(scenario())
