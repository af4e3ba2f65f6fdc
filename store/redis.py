"""The cluster store: Redis, shared by every node (docs/protocol.md §4.9, §6).

A record lives under ``<prefix>resp:<id>`` as a hash ``{owner, created_at, body}`` (``body``
as in :func:`store.encode_body`); the usage ledger of an owner is the list
``<prefix>usage:<owner>`` of JSON entries, appended in order, beside the set
``<prefix>billed:<owner>`` of the response ids it has lines for: a line is appended only if
its id joins the set, so writing one again changes nothing.  The owner check of a delete, a
record put with its line and a batch of lines each run inside Redis as one Lua script, so
each is atomic.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.typing import EncodableT

from .base import StoredResponse, StoreRefused, UsageEntry, decode_record, encode_body, item_in, new_item_ids

# The server's answers that refuse this client rather than fail for a while: a wrong or missing
# password (WRONGPASS, NOAUTH), a denied command (NOPERM), protected mode's DENIED.
REFUSALS = ("NOAUTH", "WRONGPASS", "NOPERM", "DENIED")

# KEYS[1] = record key, ARGV[1] = owner; returns the number of keys deleted (0 or 1).
DELETE_IF_OWNER = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# Lines: KEYS = (ledger list, billed set) per line, ARGV = (response id, JSON) per line.  A
# record put with its line: KEYS[1] = record key, then as above; ARGV[1..3] = owner,
# created_at, body, then as above.  Appends each line whose id is not billed yet.
ADD_LINES = """
local function add_lines(k, a)
    for i = 0, (#KEYS - k + 1) / 2 - 1 do
        if redis.call('SADD', KEYS[k + 2 * i + 1], ARGV[a + 2 * i]) == 1 then
            redis.call('RPUSH', KEYS[k + 2 * i], ARGV[a + 2 * i + 1])
        end
    end
end
"""
ADD_USAGE = ADD_LINES + "add_lines(1, 1)\n"
PUT_WITH_USAGE = (
    ADD_LINES
    + """
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'created_at', ARGV[2], 'body', ARGV[3])
add_lines(2, 4)
"""
)


class RedisStore:
    """A :class:`~store.Store` on the Redis server at ``url``.

    The client connects lazily and is bound to the event loop that first uses it: open one
    per process and loop.  Every key starts with ``key_prefix``, so deployments (or tests)
    can share one server.
    """

    def __init__(self, url: str, key_prefix: str = "rws:", *, password: str | None = None) -> None:
        self.key_prefix = key_prefix
        if password is None:  # the URL's own, if any
            self._redis = aioredis.Redis.from_url(url, decode_responses=True)
        else:
            self._redis = aioredis.Redis.from_url(url, decode_responses=True, password=password)
        self._delete_if_owner = self._redis.register_script(DELETE_IF_OWNER)
        self._add_usage = self._redis.register_script(ADD_USAGE)
        self._put_with_usage = self._redis.register_script(PUT_WITH_USAGE)

    def _record_key(self, response_id: str) -> str:
        return f"{self.key_prefix}resp:{response_id}"

    def _usage_key(self, owner: str) -> str:
        return f"{self.key_prefix}usage:{owner}"

    def _lines(self, entries: Sequence[UsageEntry]) -> tuple[list[str], list[str]]:
        keys: list[str] = []
        args: list[str] = []
        for e in entries:
            keys += [self._usage_key(e.owner), f"{self.key_prefix}billed:{e.owner}"]
            args += [e.response_id, json.dumps(dataclasses.asdict(e))]
        return keys, args

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        """Insert or replace the record (one HSET: readers never see half of it) and, in the
        same script, add ``usage``'s line unless its response already has one."""
        fields: dict[EncodableT, EncodableT] = {
            "owner": record.owner,
            "created_at": repr(record.created_at),
            "body": encode_body(record),
        }
        if usage is None:
            await self._redis.hset(self._record_key(record.id), mapping=fields)
        else:
            keys, args = self._lines([usage])
            await self._put_with_usage(
                keys=[self._record_key(record.id), *keys], args=[*fields.values(), *args]
            )
        # After the record: whoever finds an item's key finds its record.  The first response
        # that held an item keeps it (NX).
        item_ids = new_item_ids(record)
        if item_ids:
            async with self._redis.pipeline(transaction=False) as pipe:
                for item_id in item_ids:
                    pipe.set(self._item_key(item_id), record.id, nx=True)
                await pipe.execute()

    def _item_key(self, item_id: str) -> str:
        return f"{self.key_prefix}item:{item_id}"

    async def find_items(self, item_ids: Sequence[str], owner: str) -> dict[str, dict[str, Any]]:
        """The items of ``owner``'s stored responses with these ids (:meth:`store.Store.find_items`)."""
        wanted = list(dict.fromkeys(item_ids))
        response_ids = await self._redis.mget([self._item_key(i) for i in wanted]) if wanted else []
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
        stored_owner, created_at, body = await self._redis.hmget(
            self._record_key(response_id), ["owner", "created_at", "body"]
        )
        if stored_owner != owner or not isinstance(body, str) or created_at is None:
            return None  # (decode_responses: what is there is a str)
        return decode_record(response_id, owner, float(created_at), body)

    async def delete(self, response_id: str, owner: str) -> bool:
        """``True`` if a record of ``owner`` was deleted."""
        deleted = await self._delete_if_owner(keys=[self._record_key(response_id)], args=[owner])
        return int(deleted) > 0

    async def add_usage(self, entries: Sequence[UsageEntry]) -> None:
        """Add the lines in one script; a line whose response already has one is skipped."""
        if entries:
            keys, args = self._lines(entries)
            await self._add_usage(keys=keys, args=args)

    async def usage(self, owner: str) -> list[UsageEntry]:
        """The ledger entries of ``owner``, oldest first."""
        raw = await self._redis.lrange(self._usage_key(owner), 0, -1)
        return [UsageEntry(**json.loads(item)) for item in raw]

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
