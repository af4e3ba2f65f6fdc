"""The Redis client the cluster store's modules share: one standalone server or a Redis
Cluster (:func:`connect`), Lua scripts run by SHA (:class:`Lua`), writes that return only
once their shard's replicas have them too (:func:`run_replicated`, ``WAIT``, as many as
:class:`~store.replication.ReplicaView` says), and which failures mean the store cannot take
a write now (:func:`unavailable`).

On a Redis Cluster every script touches keys of one slot (the callers choose hash tags so);
a write and its ``WAIT`` go down the same connection to the node that owns the slot (a
``WAIT`` counts the replicas that acknowledged *that connection's* writes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError

from .replication import Policy, ReplicaView

Client = aioredis.Redis | RedisCluster


class NotReplicated(aioredis.RedisError):
    """A write landed on its primary but fewer than ``wanted`` replicas acknowledged it
    within the wait: a failover could lose it, so it is not acknowledged to the client."""

    def __init__(self, wanted: int, acknowledged: int, timeout_ms: int) -> None:
        super().__init__(f"{acknowledged} of {wanted} replicas acknowledged the write within {timeout_ms} ms")
        self.wanted = wanted
        self.acknowledged = acknowledged


def connect(url: str, *, cluster: bool, password: str | None = None) -> Client:
    """A client (decoding replies to ``str``) for the server at ``url``, or with ``cluster``
    for the Redis Cluster whose nodes ``url`` lists (one URL or several, comma-separated:
    the startup nodes; the client learns the rest and follows ``MOVED``).  ``password``, if
    given, replaces the URL's own."""
    extra: dict[str, Any] = {} if password is None else {"password": password}
    if not cluster:
        return aioredis.Redis.from_url(url, decode_responses=True, **extra)
    urls = [u.strip() for u in url.split(",") if u.strip()]
    nodes = [ClusterNode(urlsplit(u).hostname or "127.0.0.1", urlsplit(u).port or 6379) for u in urls]
    return RedisCluster.from_url(urls[0], startup_nodes=nodes, decode_responses=True, **extra)


@dataclass(frozen=True, slots=True)
class Lua:
    """A script, sent by its SHA (loaded on the first ``NOSCRIPT``)."""

    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Replication:
    """How many replicas must acknowledge a write before it returns (0: none waited for),
    for how long to wait (``WAIT numreplicas timeout``), and what a shard with fewer does
    (:mod:`store.replication`)."""

    replicas: int = 0
    timeout_ms: int = 1000
    policy: Policy = "available"


# The failures that say the store cannot take a write *now* (a failover under way, a
# connection lost, a shard short of replicas): retryable, as WriteUnavailable.  Checked after
# the refusals of this client (a wrong credential is a ConnectionError too, and not cured by
# waiting).
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.AskError,  # MOVED too
    redis_errors.ReadOnlyError,  # a primary demoted under the client
    redis_errors.RedisClusterException,  # no node for a slot
    NotReplicated,
    OSError,
    TimeoutError,
)
UNAVAILABLE_REPLIES = ("NOREPLICAS", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")


def unavailable(exc: BaseException) -> bool:
    """``exc`` says the store cannot take a write now (retryable), not that this client is
    refused or that the write is wrong."""
    if isinstance(exc, redis_errors.AuthenticationError | redis_errors.NoPermissionError):
        return False
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    return isinstance(exc, redis_errors.ResponseError) and str(exc).lstrip("-").startswith(
        UNAVAILABLE_REPLIES
    )


async def ready(client: Client) -> None:
    if isinstance(client, RedisCluster):
        await client.initialize()  # the slot map, for routing a WAIT (no-op once known)


def _owners(client: Client, keys: Sequence[str]) -> dict[str, Any]:
    """The nodes ``keys`` live on now, by name (one server: ``{"": None}``)."""
    if not isinstance(client, RedisCluster):
        return {"": None}
    return {n.name: n for n in (client.get_node_from_key(k) for k in keys) if n is not None}


# A write's waits: each node its keys live on, with the replicas to wait for there.
Plan = dict[str, tuple[Any, int]]


async def _plan(client: Client, keys: Sequence[str], replicas: ReplicaView | None) -> Plan:
    """What to wait for on each node ``keys`` live on; raises
    :class:`~store.base.WriteUnavailable` if the policy refuses a shard's write."""
    if replicas is None or not replicas.wanted:
        return {}
    nodes = _owners(client, keys)
    await replicas.ensure(nodes)
    return {name: (node, replicas.wait_for(name)) for name, node in nodes.items()}


async def admitted(client: Client, keys: Sequence[str], replicas: ReplicaView | None) -> None:
    """Raise :class:`~store.base.WriteUnavailable` now if the policy refuses a write to any
    of ``keys``' shards: a write made of several (a record, then its items' keys) is refused
    before its first part is written, not halfway."""
    await ready(client)
    await _plan(client, keys, replicas)


def _queue_waits(client: Client, pipe: Any, plan: Plan, timeout_ms: int) -> int:
    """Queue one ``WAIT`` behind the writes to each node that waits for a replica; how many."""
    waits = 0
    for node, n in plan.values():
        if not n:
            continue
        if isinstance(client, RedisCluster):
            pipe.wait(n, timeout_ms, target_nodes=node)
        else:
            pipe.wait(n, timeout_ms)
        waits += 1
    return waits


async def _checked(
    client: Client,
    keys: Sequence[str],
    results: list[Any],
    plan: Plan,
    replicas: ReplicaView | None,
    *,
    counted: bool = True,
) -> list[Any]:
    for result in results:
        if isinstance(result, Exception):
            raise result
    if replicas is None or not plan:
        return results
    waits = [n for _, n in plan.values() if n]
    timeout_ms = replicas.timeout_ms
    for n, acknowledged in zip(waits, results[len(results) - len(waits) :], strict=True):
        if int(acknowledged) < n:
            raise NotReplicated(n, int(acknowledged), timeout_ms)
    moved = _owners(client, keys).keys() - plan.keys() if isinstance(client, RedisCluster) else set()
    if moved:
        # A write was redirected (MOVED: a failover promoted a replica meanwhile) to another
        # node than the one its WAIT went to, which says nothing about it.  It stands only if
        # the new primary has no replica to wait for (a promoted one, under ``available``);
        # else it is not acknowledged and the caller's retry waits on the new node.
        await replicas.refresh()
        if any(replicas.wait_for(name) for name in moved):  # (strict: refused)
            raise NotReplicated(replicas.wanted, 0, timeout_ms)
    degraded = moved or any(n < replicas.wanted for _, n in plan.values())
    if counted and degraded:
        replicas.degraded_write()
    return results[: len(results) - len(waits)]


async def run_replicated(
    client: Client, calls: Sequence[tuple[Lua, Sequence[str], Sequence[Any]]], replicas: ReplicaView | None
) -> list[Any]:
    """Run each ``(script, keys, args)`` (each on the node of its keys' slot), then wait for
    the replicas ``replicas`` says each node's write waits for (``None``: none): the
    scripts' answers, or :class:`NotReplicated`, or :class:`~store.base.WriteUnavailable`
    before anything is written when the policy refuses a shard's write."""
    await ready(client)
    first_keys = [keys[0] for _, keys, _ in calls]
    plan = await _plan(client, first_keys, replicas)
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for lua, keys, args in calls:
            # (a cluster's pipeline blocks its evalsha() helper; the command itself is routed
            # by its keys' slot)
            pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
        _queue_waits(client, pipe, plan, replicas.timeout_ms if replicas is not None else 0)
        results = await pipe.execute(raise_on_error=False)
        missing = [
            lua for (lua, _, _), r in zip(calls, results, strict=False) if isinstance(r, NoScriptError)
        ]
        if missing and attempt == 1:
            for lua in {m.source: m for m in missing}.values():
                await client.script_load(lua.source)  # a cluster loads it on every primary
            continue
        return await _checked(client, first_keys, results, plan, replicas)
    raise AssertionError("unreachable")


async def set_replicated(client: Client, values: dict[str, str], replicas: ReplicaView | None) -> None:
    """``SET key value NX`` for each, then wait as :func:`run_replicated` does (the item
    keys of a put: not counted as a write of their own)."""
    await ready(client)
    plan = await _plan(client, list(values), replicas)
    pipe = client.pipeline(transaction=False)
    for key, value in values.items():
        pipe.set(key, value, nx=True)
    _queue_waits(client, pipe, plan, replicas.timeout_ms if replicas is not None else 0)
    results = await pipe.execute(raise_on_error=False)
    await _checked(client, list(values), results, plan, replicas, counted=False)


async def mget(client: Client, keys: Sequence[str]) -> list[Any]:
    """The values of ``keys`` (on a cluster: slot by slot, not one atomic read)."""
    if isinstance(client, RedisCluster):
        return await client.mget_nonatomic(list(keys))
    return await client.mget(list(keys))
