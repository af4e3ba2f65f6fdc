"""The cluster store: Redis, shared by every node (docs/protocol.md §4.9, §6), one server or
a Redis Cluster.

A record lives under ``<prefix>resp:<id>`` as a hash ``{owner, created_at, body}`` (``body``
as in :func:`store.encode_body`); the usage ledger of an owner is the list
``<prefix>usage:<owner>`` of JSON entries, appended in order, beside the set
``<prefix>billed:<owner>`` of the response ids it has lines for: a line is appended only if
its id joins the set, so writing one again changes nothing.  The owner check of a delete, a
record put with its line and a batch of lines each run inside Redis as one Lua script, so
each is atomic.

On a Redis Cluster (:class:`Layout` with ``shards``) a script may only touch keys of one
slot, and one tenant's ledger must not be one hot key, so the keys carry a hash tag: an
owner's ledger is ``shards`` lists, ``usage:{<owner>|<b>}`` with ``billed:{<owner>|<b>}``,
``b`` the response id's bucket (CRC-32 modulo ``shards``), and a record is
``resp:{<owner>|<b>}<id>``, in its line's slot, so the record and its line are still one
script.  A batch of lines is one script per slot (each atomic, each idempotent).  Each line
is stamped with its shard's server clock (``TIME``, microseconds) so that :meth:`usage`
merges the shards oldest first.  With :class:`~store.redisconn.Replication` every write
returns only once its shard's replicas acknowledged it (``WAIT``; how many, shard by shard,
:mod:`store.replication` decides), else raises :class:`~store.redisconn.NotReplicated`.  A
write the store cannot take now raises :class:`~store.base.WriteUnavailable`, a read it cannot
answer now :class:`~store.base.ReadUnavailable` (both retryable).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import time
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis import exceptions as redis_errors

from .base import (
    ReadUnavailable,
    StoredResponse,
    StoreRefused,
    UsageEntry,
    WriteUnavailable,
    decode_record,
    encode_body,
    item_in,
    new_item_ids,
)
from .redisconn import (
    Lua,
    Replication,
    admitted,
    connect,
    mget,
    run_replicated,
    set_replicated,
    unavailable,
)
from .replication import ReplicationObserver, ReplicationStatus, ReplicaView

T = TypeVar("T")

# The server's answers that refuse this client rather than fail for a while: a wrong or missing
# password (WRONGPASS, NOAUTH), a denied command (NOPERM), protected mode's DENIED.
REFUSALS = ("NOAUTH", "WRONGPASS", "NOPERM", "DENIED")

# KEYS[1] = record key, ARGV[1] = owner; returns the number of keys deleted (0 or 1).
DELETE_IF_OWNER = Lua("""
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
""")

# Lines: KEYS = (ledger list, billed set) per line, ARGV = (response id, JSON) per line.  A
# record put with its line: KEYS[1] = record key, then as above; ARGV[1..3] = owner,
# created_at, body, then as above.  Appends each line whose id is not billed yet; ``stamp``
# is what goes before each (nothing, or the server clock on a cluster's shards).
ADD_LINES = """
local function add_lines(k, a)
    local stamp = %s
    for i = 0, (#KEYS - k + 1) / 2 - 1 do
        if redis.call('SADD', KEYS[k + 2 * i + 1], ARGV[a + 2 * i]) == 1 then
            redis.call('RPUSH', KEYS[k + 2 * i], stamp .. ARGV[a + 2 * i + 1])
        end
    end
end
"""
NO_STAMP = "''"
CLOCK_STAMP = "(function() local t = redis.call('TIME') return string.format('%d%06d ', t[1], t[2]) end)()"
NO_WAIT = Replication()
PUT = "redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'created_at', ARGV[2], 'body', ARGV[3])\n"


def _scripts(stamp: str) -> tuple[Lua, Lua]:
    lines = ADD_LINES % stamp
    return Lua(lines + "add_lines(1, 1)\n"), Lua(lines + PUT + "add_lines(2, 4)\n")


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """Where the keys are: ``shards == 0`` is one server's layout (no hash tags, one ledger
    list per owner), ``shards > 0`` a cluster's (hash tags, the ledger in ``shards`` parts)."""

    prefix: str
    shards: int = 0

    def _tag(self, owner: str, response_id: str) -> str:
        return f"{{{owner}|{zlib.crc32(response_id.encode()) % self.shards}}}"

    def record(self, response_id: str, owner: str) -> str:
        if not self.shards:
            return f"{self.prefix}resp:{response_id}"
        return f"{self.prefix}resp:{self._tag(owner, response_id)}{response_id}"

    def ledger(self, owner: str, response_id: str) -> tuple[str, str]:
        """The line's list and the billed set beside it."""
        if not self.shards:
            return f"{self.prefix}usage:{owner}", f"{self.prefix}billed:{owner}"
        tag = self._tag(owner, response_id)
        return f"{self.prefix}usage:{tag}", f"{self.prefix}billed:{tag}"

    def ledgers(self, owner: str) -> list[str]:
        """Every list of ``owner``'s ledger."""
        if not self.shards:
            return [f"{self.prefix}usage:{owner}"]
        return [f"{self.prefix}usage:{{{owner}|{b}}}" for b in range(self.shards)]

    def item(self, item_id: str) -> str:
        return f"{self.prefix}item:{item_id}"


class RedisStore:
    """A :class:`~store.Store` on the Redis server at ``url`` (or, with ``cluster``, the
    Redis Cluster whose nodes it lists: :func:`store.redisconn.connect`).

    The client connects lazily and is bound to the event loop that first uses it: open one
    per process and loop.  Every key starts with ``key_prefix``, so deployments (or tests)
    can share one server.  ``shards`` (cluster only) splits each owner's ledger; every write
    waits for ``replication`` (its shard's share of it: :class:`~store.replication.ReplicaView`,
    whose changes and degraded writes go to ``observer``).
    """

    def __init__(
        self,
        url: str,
        key_prefix: str = "rws:",
        *,
        cluster: bool = False,
        shards: int = 16,
        replication: Replication = NO_WAIT,
        password: str | None = None,
        observer: ReplicationObserver | None = None,
    ) -> None:
        self.key_prefix = key_prefix
        self.layout = Layout(key_prefix, shards if cluster else 0)
        self.replication = replication
        self._redis = connect(url, cluster=cluster, password=password)
        self.replicas = ReplicaView(
            self._redis,
            replication.replicas,
            timeout_ms=replication.timeout_ms,
            policy=replication.policy,
            on_change=observer.changed if observer is not None else None,
            on_degraded_write=observer.degraded_write if observer is not None else None,
        )
        self._add_usage, self._put_with_usage = _scripts(CLOCK_STAMP if cluster else NO_STAMP)

    def _lines(self, entries: Sequence[UsageEntry]) -> tuple[list[str], list[str]]:
        keys: list[str] = []
        args: list[str] = []
        for e in entries:
            keys += self.layout.ledger(e.owner, e.response_id)
            args += [e.response_id, json.dumps(dataclasses.asdict(e))]
        return keys, args

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        """Insert or replace the record (one HSET: readers never see half of it) and, in the
        same script, add ``usage``'s line unless its response already has one."""
        key = self.layout.record(record.id, record.owner)
        fields = [record.owner, repr(record.created_at), encode_body(record)]
        keys, args = self._lines([usage] if usage is not None else [])
        item_ids = new_item_ids(record)
        item_keys = [self.layout.item(i) for i in item_ids]
        await self._write(lambda: admitted(self._redis, [key, *item_keys], self.replicas))
        await self._write(
            lambda: run_replicated(
                self._redis, [(self._put_with_usage, [key, *keys], [*fields, *args])], self.replicas
            )
        )
        # After the record: whoever finds an item's key finds its record.  The first response
        # that held an item keeps it (NX).
        if item_ids:
            await self._write(
                lambda: set_replicated(
                    self._redis, {self.layout.item(i): record.id for i in item_ids}, self.replicas
                )
            )

    async def _write(self, write: Callable[[], Awaitable[T]]) -> T:
        """``write()``; a failure that says the store cannot take it now is raised as
        :class:`~store.base.WriteUnavailable`, and the replicas are looked at again."""
        try:
            return await write()
        except WriteUnavailable:
            self.replicas.stale()
            raise
        except (redis_errors.RedisError, OSError) as exc:
            if not unavailable(exc):
                raise
            self.replicas.stale()
            raise WriteUnavailable(f"the store cannot take the write now: {exc}") from exc

    async def _read(self, read: Awaitable[T]) -> T:
        """``await read``; a failure that says the store cannot answer now is raised as
        :class:`~store.base.ReadUnavailable`."""
        try:
            return await read
        except (redis_errors.RedisError, OSError) as exc:
            if not unavailable(exc):
                raise
            raise ReadUnavailable(f"the store cannot answer the read now: {exc}") from exc

    def replication_status(self) -> ReplicationStatus:
        """Every shard's replicas as the writes last saw them (refreshed every few seconds
        while writes wait for replicas; empty before the first)."""
        return self.replicas.status

    async def find_items(self, item_ids: Sequence[str], owner: str) -> dict[str, dict[str, Any]]:
        """The items of ``owner``'s stored responses with these ids (:meth:`store.Store.find_items`)."""
        wanted = list(dict.fromkeys(item_ids))
        response_ids = (
            await self._read(mget(self._redis, [self.layout.item(i) for i in wanted])) if wanted else []
        )
        found = {}
        records: dict[str, StoredResponse | None] = {}
        for item_id, response_id in zip(wanted, response_ids, strict=True):
            if not isinstance(response_id, str):  # None: no such item (decode_responses: else a str)
                continue
            if response_id not in records:
                records[response_id] = await self.get(response_id, owner)
            record = records[response_id]
            item = item_in(record, item_id) if record is not None else None
            if item is not None:
                found[item_id] = item
        return found

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, deleted, or owned by someone else."""
        stored_owner, created_at, body = await self._read(
            self._redis.hmget(self.layout.record(response_id, owner), ["owner", "created_at", "body"])
        )
        if stored_owner != owner or not isinstance(body, str) or created_at is None:
            return None  # (decode_responses: what is there is a str)
        return decode_record(response_id, owner, float(created_at), body)

    async def delete(self, response_id: str, owner: str) -> bool:
        """``True`` if a record of ``owner`` was deleted."""
        key = self.layout.record(response_id, owner)
        [deleted] = await self._write(
            lambda: run_replicated(self._redis, [(DELETE_IF_OWNER, [key], [owner])], None)
        )
        return int(deleted) > 0

    async def add_usage(self, entries: Sequence[UsageEntry]) -> None:
        """Add the lines in one script (on a cluster: one per slot); a line whose response
        already has one is skipped."""
        by_slot: dict[str, list[UsageEntry]] = defaultdict(list)
        for e in entries:
            by_slot[self.layout.ledger(e.owner, e.response_id)[0]].append(e)
        calls = [(self._add_usage, *self._lines(group)) for group in by_slot.values()]
        if calls:
            await self._write(lambda: run_replicated(self._redis, calls, self.replicas))

    async def usage(self, owner: str) -> list[UsageEntry]:
        """The ledger entries of ``owner``, oldest first (on a cluster: the shards merged by
        the server time each line was committed at)."""
        lists = self.layout.ledgers(owner)
        if not self.layout.shards:
            lines = await self._read(self._redis.lrange(lists[0], 0, -1))
            return [UsageEntry(**json.loads(item)) for item in lines]
        pipe = self._redis.pipeline(transaction=False)
        for key in lists:
            pipe.lrange(key, 0, -1)
        shards = [
            [(int(stamp), b, i, line) for i, (stamp, line) in enumerate(raw.split(" ", 1) for raw in lines)]
            for b, lines in enumerate(await self._read(pipe.execute()))
        ]
        return [UsageEntry(**json.loads(line)) for *_, line in heapq.merge(*shards)]

    async def probe(self) -> None:
        """``SET <prefix>health`` (expires after a minute): refused by a read-only replica,
        a server out of memory, or one short of ``min-replicas-to-write``; a server that
        refuses this client (:data:`REFUSALS`) raises :class:`~store.StoreRefused`."""
        try:
            await self._redis.set(f"{self.key_prefix}health", repr(time.time()), ex=60)
        except (redis_errors.AuthenticationError, redis_errors.NoPermissionError) as exc:
            raise StoreRefused(f"redis refused this client: {exc}") from exc
        except redis_errors.RedisError as exc:
            if str(exc).lstrip("-").startswith(REFUSALS):
                raise StoreRefused(f"redis refused this client: {exc}") from exc
            raise

    async def close(self) -> None:
        """Close the connection pool (calls already awaited have completed)."""
        await self._redis.aclose()
