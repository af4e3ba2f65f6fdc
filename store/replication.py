"""How many replicas a write waits for, shard by shard (``store.wait_replicas`` and
``store.wait_replicas_policy``; docs/reliability.md, "The cluster store").

A write to a Redis primary returns once ``WAIT`` says enough of its replicas have it.  How
many is enough depends on the shard: ``store.wait_replicas`` asks for that many, but a
shard has only the replicas it has — after a failover the promoted primary has none until
an operator (or the old primary, restarted) gives it one.  :class:`ReplicaView` learns each
primary's online replicas (``INFO replication`` on the primary: its ``slaveN`` lines in
state ``online``, the replicas a ``WAIT`` can count) and decides, as a table
(:data:`DECISIONS`):

==============  ==============================  =======================================
policy          the shard has ≥ wanted           the shard has fewer (degraded)
==============  ==============================  =======================================
``available``   wait for ``wanted``              wait for the ones it has (maybe none):
                                                 the write is taken, counted, logged
``strict``      wait for ``wanted``              refuse before writing
                                                 (:class:`~store.base.WriteUnavailable`)
==============  ==============================  =======================================

``strict`` is what Redis's own ``min-replicas-to-write`` does on the server: a primary with
fewer connected replicas refuses writes (``NOREPLICAS``).  The view is refreshed when it is
older than ``refresh_s``, when a write goes to a primary it does not know (a failover moved
the slots), and after a write failed (``WAIT`` short, ``MOVED``, a connection lost).  A
shard's change of state is reported once (``on_change``: a log line and the metric).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from redis.asyncio.cluster import RedisCluster

from .base import WriteUnavailable

log = logging.getLogger(__name__)

Policy = Literal["available", "strict"]
REFUSE = -1  # a decision: refuse the write (strict, degraded)
DEFAULT_REFRESH_S = 5.0
ASK_TIMEOUT_S = 1.0  # a primary that does not answer INFO within this is taken as unreachable

# (policy, the shard has the replicas wanted) → what a write to it waits for: "wanted", "has"
# (the replicas it has) or REFUSE.
DECISIONS: Mapping[tuple[Policy, bool], str] = {
    ("available", True): "wanted",
    ("available", False): "has",
    ("strict", True): "wanted",
    ("strict", False): "refuse",
}


def wait_for(policy: Policy, wanted: int, has: int) -> int:
    """The replicas a write waits for on a shard with ``has`` online replicas, or
    :data:`REFUSE` (the table above)."""
    decision = DECISIONS[(policy, has >= wanted)]
    if decision == "refuse":
        return REFUSE
    return wanted if decision == "wanted" else max(0, has)


def online_replicas(info: Mapping[str, Any]) -> int:
    """The replicas ``INFO replication`` (parsed) lists in state ``online``: the ones that
    acknowledge writes (a replica still syncing is listed, but cannot)."""
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and key[5:].isdigit() and isinstance(value, Mapping)
        and value.get("state") == "online"
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shard:
    """One primary (``host:port`` as the client names it; ``""`` for a single server) and
    the replicas it has online; ``reachable`` is ``False`` when it did not answer."""

    primary: str
    replicas: int
    wanted: int
    reachable: bool = True

    @property
    def degraded(self) -> bool:
        return not self.reachable or self.replicas < self.wanted

    def as_dict(self) -> dict[str, Any]:
        return {
            "primary": self.primary,
            "replicas": self.replicas,
            "wanted": self.wanted,
            "reachable": self.reachable,
            "degraded": self.degraded,
        }


@dataclass(frozen=True, slots=True)
class ReplicationStatus:
    """Every shard's replication as the store last saw it (:func:`store.replication_status`)."""

    policy: Policy
    wanted: int
    shards: tuple[Shard, ...] = ()

    @property
    def degraded(self) -> bool:
        """A shard has fewer online replicas than ``store.wait_replicas`` (or did not answer)."""
        return any(s.degraded for s in self.shards)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "wanted": self.wanted,
            "degraded": self.degraded,
            "shards": [s.as_dict() for s in self.shards],
        }


class ReplicationObserver(Protocol):
    """Told of the store's replication (a process's metrics: the gauge of degraded shards,
    the count of degraded writes)."""

    def changed(self, status: ReplicationStatus) -> None:
        """A shard became degraded, or stopped being."""

    def degraded_write(self) -> None:
        """A write was taken with fewer replicas than ``store.wait_replicas``."""


def describe(shard: Shard, policy: Policy) -> str:
    """One log line for a shard's new state."""
    if not shard.degraded:
        return (
            f"store shard {shard.primary or 'server'} has {shard.replicas} of {shard.wanted} replicas again"
        )
    what = (
        "did not answer" if not shard.reachable else f"has {shard.replicas} of {shard.wanted} replicas online"
    )
    then = (
        "its writes are refused (store.wait_replicas_policy: strict)"
        if policy == "strict"
        else "its writes are taken with the replicas it has (store.wait_replicas_policy: available)"
    )
    return f"store shard {shard.primary or 'server'} {what}: {then}"


class ReplicaView:
    """The replicas each primary of ``client`` has, refreshed as the module says, and what a
    write waits for (``wanted`` replicas, a ``WAIT`` of ``timeout_ms``); one per client (and
    event loop).  ``on_change(status)`` is called after a refresh that changed
    a shard's degraded state; ``on_degraded_write()`` once for every write taken with fewer
    replicas than wanted."""

    def __init__(
        self,
        client: Any,
        wanted: int,
        *,
        timeout_ms: int = 1000,
        policy: Policy = "available",
        refresh_s: float = DEFAULT_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[ReplicationStatus], None] | None = None,
        on_degraded_write: Callable[[], None] | None = None,
        quiet: bool = False,
    ) -> None:
        self._client = client
        self.quiet = quiet  # no log line on a change (a one-off look: responses-ws status)
        self.wanted = wanted
        self.timeout_ms = timeout_ms  # how long a WAIT waits
        self.policy: Policy = policy
        self._refresh_s = refresh_s
        self._clock = clock
        self._on_change = on_change
        self._on_degraded_write = on_degraded_write
        self._shards: dict[str, Shard] = {}
        self._checked_at: float | None = None
        self._refreshing: asyncio.Future[None] | None = None

    @property
    def status(self) -> ReplicationStatus:
        """As last seen (empty before the first write that waits)."""
        return ReplicationStatus(self.policy, self.wanted, tuple(self._shards.values()))

    def stale(self) -> None:
        """A write failed in a way a topology change explains: look again before the next."""
        self._checked_at = None

    async def ensure(self, primaries: Iterable[str]) -> None:
        """Refresh if the view is old, marked stale, or misses one of ``primaries``."""
        if not self.wanted:
            return
        now = self._clock()
        fresh = self._checked_at is not None and now - self._checked_at < self._refresh_s
        if fresh and all(p in self._shards for p in primaries):
            return
        await self.refresh()

    async def refresh(self) -> None:
        """Ask every primary (one refresh at a time; concurrent callers share it)."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            shards = await _ask(self._client, self.wanted)
            self._checked_at = self._clock()
            self._replace(shards)
        finally:
            self._refreshing.set_result(None)
            self._refreshing = None

    def _replace(self, shards: dict[str, Shard]) -> None:
        before = {name: s.degraded for name, s in self._shards.items()}
        self._shards = shards
        changed = [s for name, s in shards.items() if before.get(name, False) != s.degraded]
        changed += [
            Shard(name, self.wanted, self.wanted)
            for name, was in before.items()
            if was and name not in shards
        ]  # a degraded primary gone from the map (its slots moved): no longer degraded
        for shard in changed if not self.quiet else ():
            log.warning(describe(shard, self.policy))
        if changed and self._on_change is not None:
            self._on_change(self.status)

    def wait_for(self, primary: str) -> int:
        """The replicas a write to ``primary`` waits for; raises
        :class:`~store.base.WriteUnavailable` when the policy refuses it."""
        shard = self._shards.get(primary)
        has = shard.replicas if shard is not None and shard.reachable else 0
        n = wait_for(self.policy, self.wanted, has)
        if n == REFUSE:
            raise WriteUnavailable(
                f"store shard {primary or 'server'} has {has} of {self.wanted} replicas "
                "(store.wait_replicas_policy: strict)"
            )
        return n

    def degraded_write(self) -> None:
        if self._on_degraded_write is not None:
            self._on_degraded_write()


async def _ask(client: Any, wanted: int) -> dict[str, Shard]:
    """Each primary's online replicas (``INFO replication``), by its name."""
    if not isinstance(client, RedisCluster):
        info = await asyncio.wait_for(client.info("replication"), ASK_TIMEOUT_S)
        return {"": Shard("", online_replicas(info), wanted)}
    await client.initialize()  # the slot map (a no-op once known; redis-py refreshes it itself)
    primaries = client.get_primaries()
    answers = await asyncio.gather(
        *(
            asyncio.wait_for(client.execute_command("INFO", "replication", target_nodes=node), ASK_TIMEOUT_S)
            for node in primaries
        ),
        return_exceptions=True,
    )
    shards = {}
    for node, info in zip(primaries, answers, strict=True):
        if isinstance(info, BaseException) or not isinstance(info, Mapping):
            shards[node.name] = Shard(node.name, 0, wanted, reachable=False)
        else:
            shards[node.name] = Shard(node.name, online_replicas(info), wanted)
    return shards
