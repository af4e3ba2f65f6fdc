"""What a write waits for, shard by shard (store/replication.py), how a write the store cannot
take now is retried (store/writer.py), and what the client is told (actors/errors.py): pure
logic; the same against real Redis in test_store.py and tests/integration/test_store_failover.py."""

from __future__ import annotations

import asyncio

import pytest

from actors.errors import ServerError, StoreUnavailable, write_failure
from store import ReplicationStatus, Shard, WriteUnavailable
from store.redisconn import NotReplicated, unavailable
from store.replication import DECISIONS, REFUSE, describe, online_replicas, wait_for
from store.writer import retried


@pytest.mark.parametrize(
    ("policy", "wanted", "has", "waits"),
    [
        ("available", 1, 1, 1),
        ("available", 1, 2, 1),
        ("available", 1, 0, 0),  # a promoted primary without a replica: taken, waits for none
        ("available", 2, 1, 1),
        ("available", 0, 0, 0),
        ("strict", 1, 1, 1),
        ("strict", 1, 0, REFUSE),
        ("strict", 2, 1, REFUSE),
        ("strict", 0, 0, 0),
    ],
)
def test_a_write_waits_for_the_replicas_its_shard_has_or_is_refused_under_strict(
    policy, wanted, has, waits
) -> None:
    assert wait_for(policy, wanted, has) == waits


def test_the_decision_table_covers_every_policy_and_state() -> None:
    assert set(DECISIONS) == {(p, ok) for p in ("available", "strict") for ok in (True, False)}


def test_only_online_replicas_count() -> None:
    info = {
        "role": "master",
        "connected_slaves": 3,
        "slave0": {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 10, "lag": 0},
        "slave1": {"ip": "10.0.0.3", "port": 6379, "state": "wait_bgsave", "offset": 0, "lag": 0},
        "slave2": {"ip": "10.0.0.4", "port": 6379, "state": "online", "offset": 9, "lag": 1},
        "slave_read_repl_offset": 10,  # not a replica's line
    }
    assert online_replicas(info) == 2
    assert online_replicas({"role": "master", "connected_slaves": 0}) == 0


def test_the_status_says_which_shard_is_degraded() -> None:
    status = ReplicationStatus(
        "available",
        1,
        (Shard("10.0.0.5:6379", 0, 1), Shard("10.0.0.6:6379", 1, 1), Shard("10.0.0.7:6379", 0, 1, False)),
    )
    assert status.degraded
    assert [s["degraded"] for s in status.as_dict()["shards"]] == [True, False, True]
    assert status.as_dict()["policy"] == "available"
    assert not ReplicationStatus("available", 1, (Shard("a:1", 1, 1),)).degraded
    assert not ReplicationStatus("strict", 0).degraded


def test_a_change_of_state_is_one_line_naming_the_shard_and_the_policy() -> None:
    assert describe(Shard("10.0.0.5:6379", 0, 1), "strict") == (
        "store shard 10.0.0.5:6379 has 0 of 1 replicas online: its writes are refused "
        "(store.wait_replicas_policy: strict)"
    )
    assert "taken with the replicas it has" in describe(Shard("10.0.0.5:6379", 0, 1), "available")
    assert describe(Shard("10.0.0.5:6379", 1, 1), "available").endswith("has 1 of 1 replicas again")
    assert "did not answer" in describe(Shard("10.0.0.5:6379", 0, 1, reachable=False), "available")


def test_which_failures_mean_the_store_cannot_take_a_write_now() -> None:
    from redis import exceptions as e

    assert unavailable(e.ConnectionError("Connection refused"))
    assert unavailable(e.ClusterDownError("CLUSTERDOWN The cluster is down"))
    assert unavailable(e.ReadOnlyError("You can't write against a read only replica."))
    assert unavailable(e.ResponseError("NOREPLICAS Not enough good replicas to write."))
    assert unavailable(NotReplicated(1, 0, 1000))
    assert not unavailable(e.AuthenticationError("invalid username-password pair"))
    assert not unavailable(e.NoPermissionError("NOPERM"))
    assert not unavailable(
        e.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    )


def test_the_client_is_told_store_unavailable_for_a_write_the_store_could_not_take() -> None:
    told = write_failure(WriteUnavailable("shard without a primary"))
    assert isinstance(told, StoreUnavailable)
    assert (told.status, told.type, told.code, told.retry_after_s) == (
        503,
        "server_error",
        "store_unavailable",
        1,
    )
    assert isinstance(write_failure(ValueError("a bug")), ServerError)


class Clock:
    """A clock the sleeps advance."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def failing(times: int, exc: Exception) -> tuple[list[int], object]:
    calls = [0]

    async def write() -> None:
        calls[0] += 1
        if calls[0] <= times:
            raise exc

    return calls, write


def test_a_write_the_store_cannot_take_now_is_retried_backing_off_until_it_lands() -> None:
    clock = Clock()
    calls, write = failing(6, WriteUnavailable("no primary"))
    asyncio.run(retried(write, 5.0, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert calls[0] == 7
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4, 0.5]  # the first retry at once, then doubling to 0.5 s


def test_a_write_the_store_cannot_take_for_the_whole_budget_raises() -> None:
    clock = Clock()
    calls, write = failing(1000, WriteUnavailable("no primary"))
    with pytest.raises(WriteUnavailable):
        asyncio.run(retried(write, 2.0, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert clock.now == pytest.approx(2.0)
    assert calls[0] == 2 + len(clock.sleeps)


def test_another_failure_is_retried_once_at_once() -> None:
    clock = Clock()
    calls, write = failing(2, ConnectionResetError("lost"))
    with pytest.raises(ConnectionResetError):
        asyncio.run(retried(write, 5.0, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert calls[0] == 2 and clock.sleeps == []
    calls, write = failing(1, WriteUnavailable("no primary"))
    asyncio.run(retried(write, 0.0, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    assert calls[0] == 2  # without a budget: the one retry at once, as any failure
