"""Connection states in the cluster store (store/continuity.py) against a real, private
redis-server (the suite's ``redis_server`` fixture): sealing, claiming, and the fencing
that keeps one holder per connection."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from cryptography.exceptions import InvalidTag

from store.continuity import ContinuityStore, Fenced, seal, secret_hash, unseal

OWNER, OTHER = "key_alice", "key_bob"
STATE = b'{"v":1,"lanes":[{"items":[{"type":"message","content":"the private chain"}]}]}'


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def make(redis_server):
    prefix = f"test-{uuid.uuid4().hex}:"

    def make(ttl_s: float = 30.0) -> ContinuityStore:
        return ContinuityStore(redis_server, prefix, ttl_s=ttl_s)

    return make


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
        try:
            await first_holder(store, "c1", "s3cret")
            raw = await store._redis.hgetall(store.key("c1"))
            assert raw["hash"] == secret_hash("s3cret") and "s3cret" not in str(raw)
            assert "private" not in str(raw)
            assert 0 < await store._redis.pttl(store.key("c1")) <= 30_000
        finally:
            await store.close()

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
            assert await store._redis.hgetall(store.key("c1")) == {"epoch": "ended"}, "no content kept"
        finally:
            await store.close()

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
        old, new = make(), make()
        told: asyncio.Queue[str] = asyncio.Queue()
        try:
            old.listen("host-a", told.put_nowait)
            await asyncio.sleep(0.2)  # subscribed
            await first_holder(old, "c1", "s3cret", holder="host-a")
            assert await new.claim("c1", "s3cret", OWNER, "host-b") is not None
            assert await asyncio.wait_for(told.get(), 5) == "c1 2"
        finally:
            await old.close()
            await new.close()

    run(main())


def test_an_expired_state_is_not_claimable_and_a_live_holder_may_write_it_again(make):
    async def main():
        store = make(ttl_s=0.2)
        try:
            await first_holder(store, "c1", "s3cret")
            await asyncio.sleep(0.4)
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
            assert await store._redis.hgetall(store.key("c1")) == {"epoch": "ended"}
            assert 0 < await store._redis.pttl(store.key("c1")) <= store.ttl_ms
        finally:
            await store.close()

    run(main())
