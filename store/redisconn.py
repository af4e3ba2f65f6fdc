"""The Redis client the cluster store's modules share: one standalone server or a Redis
Cluster (:func:`connect`), Lua scripts run by SHA (:class:`Lua`), and writes that return
only once a replica has them too (:func:`run_replicated`, ``WAIT``).

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
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError

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
    and for how long to wait (``WAIT numreplicas timeout``)."""

    replicas: int = 0
    timeout_ms: int = 1000


async def ready(client: Client) -> None:
    if isinstance(client, RedisCluster):
        await client.initialize()  # the slot map, for routing a WAIT (no-op once known)


def _owners(client: Client, keys: Sequence[str]) -> dict[str, Any]:
    """The nodes ``keys`` live on now, by name (one server: none)."""
    if not isinstance(client, RedisCluster):
        return {}
    return {n.name: n for n in (client.get_node_from_key(k) for k in keys) if n is not None}


def _waits(client: Client, pipe: Any, keys: Sequence[str], replication: Replication) -> dict[str, Any]:
    """Queue one ``WAIT`` behind the writes to each node that ``keys`` live on; those nodes."""
    if not replication.replicas:
        return {}
    if not isinstance(client, RedisCluster):
        pipe.wait(replication.replicas, replication.timeout_ms)
        return {"": None}
    nodes = _owners(client, keys)
    for node in nodes.values():
        pipe.wait(replication.replicas, replication.timeout_ms, target_nodes=node)
    return nodes


def _checked(
    client: Client, keys: Sequence[str], results: list[Any], nodes: dict[str, Any], replication: Replication
) -> list[Any]:
    for result in results:
        if isinstance(result, Exception):
            raise result
    waits = len(nodes)
    if waits and isinstance(client, RedisCluster) and _owners(client, keys).keys() != nodes.keys():
        # A write was redirected (MOVED) to another node than the one its WAIT went to: that
        # WAIT says nothing about it.  Not acknowledged; the caller's retry waits on the new one.
        raise NotReplicated(replication.replicas, 0, replication.timeout_ms)
    for acknowledged in results[len(results) - waits :]:
        if int(acknowledged) < replication.replicas:
            raise NotReplicated(replication.replicas, int(acknowledged), replication.timeout_ms)
    return results[: len(results) - waits]


async def run_replicated(
    client: Client, calls: Sequence[tuple[Lua, Sequence[str], Sequence[Any]]], replication: Replication
) -> list[Any]:
    """Run each ``(script, keys, args)`` (each on the node of its keys' slot), then wait for
    ``replication``: the scripts' answers, or :class:`NotReplicated`."""
    await ready(client)
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for lua, keys, args in calls:
            # (a cluster's pipeline blocks its evalsha() helper; the command itself is routed
            # by its keys' slot)
            pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
        first_keys = [keys[0] for _, keys, _ in calls]
        nodes = _waits(client, pipe, first_keys, replication)
        results = await pipe.execute(raise_on_error=False)
        missing = [
            lua for (lua, _, _), r in zip(calls, results, strict=False) if isinstance(r, NoScriptError)
        ]
        if missing and attempt == 1:
            for lua in {m.source: m for m in missing}.values():
                await client.script_load(lua.source)  # a cluster loads it on every primary
            continue
        return _checked(client, first_keys, results, nodes, replication)
    raise AssertionError("unreachable")


async def set_replicated(client: Client, values: dict[str, str], replication: Replication) -> None:
    """``SET key value NX`` for each, then wait for ``replication``."""
    await ready(client)
    pipe = client.pipeline(transaction=False)
    for key, value in values.items():
        pipe.set(key, value, nx=True)
    nodes = _waits(client, pipe, list(values), replication)
    _checked(client, list(values), await pipe.execute(raise_on_error=False), nodes, replication)


async def mget(client: Client, keys: Sequence[str]) -> list[Any]:
    """The values of ``keys`` (on a cluster: slot by slot, not one atomic read)."""
    if isinstance(client, RedisCluster):
        return await client.mget_nonatomic(list(keys))
    return await client.mget(list(keys))
