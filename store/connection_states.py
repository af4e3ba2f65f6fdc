"""A connection's state in the cluster store, so a resume works on any node (docs/reliability.md,
"Resuming on any node").  Redis only.

One hash per connection, ``<prefix>conn:{<conn_id>}``, and beside it (one hash tag: one slot
of a Redis Cluster) the list ``<prefix>conn:{<conn_id>}:log``:

- ``epoch``: the holder's fencing number.  Every new holder (a resume on whichever host it
  lands) increments it atomically as it takes the state; every write is a compare-and-set on
  it, inside Redis (Lua), so a holder that lost the connection — taken over, partitioned away
  and back — can neither write the state nor, once it notices, keep serving;
- ``hash``: SHA-256 of the token's secret (the server never keeps the secret);
- ``owner``: the API-key fingerprint the connection belongs to; ``deadline``: its lifetime
  limit on the wall clock; ``holder``: the session host that holds it now (a takeover
  publishes the connection id on ``<prefix>holder:<name>`` so that host lets go at once);
- ``blob``: a snapshot of the session's state (JSON), sealed with AES-GCM under a key derived
  (HKDF-SHA256) from the token's secret: without the token it cannot be read, not even by the
  operator; ``seq``: how many changes the log holds on top of it;
- the log: each checkpoint since the snapshot as the change from the state before it (a
  :class:`~store.splice.Splice`: the turn's new bytes, not the history), sealed the same way
  with its position bound in.  A checkpoint appends to it while the log is smaller than the
  snapshot, and writes a new snapshot (emptying the log) once it would outgrow it: the bytes
  written per turn stay proportional to the turn, not to the conversation, and a resume reads
  at most about twice the state.  A claim reads the snapshot and the log and applies it.

Both expire ``ttl_s`` after the last write or heartbeat (the resume grace window); the
holder refreshes them while the client is connected and deletes them when the client closes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .redisconn import Lua, connect, ready, run_replicated
from .splice import Splice, apply, diff

log = logging.getLogger(__name__)

_INFO = b"responses-ws rws2 connection state"


class Fenced(Exception):
    """Another holder has taken the connection (its epoch is newer than ours)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A state taken by a new holder: its epoch, the connection's lifetime deadline (wall
    clock) and the session state (``None``: none written yet)."""

    epoch: int
    deadline: float
    state: bytes | None


def conn_key(conn_id: str, key_prefix: str) -> str:
    """A connection's hash (hash-tagged: the hash and its log share one slot)."""
    return f"{key_prefix}conn:{{{conn_id}}}"


def secret_hash(secret: str) -> str:
    return hashlib.sha256(b"rws2-secret\0" + secret.encode()).hexdigest()


def _key(secret: str, conn_id: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=conn_id.encode(), info=_INFO).derive(
        secret.encode()
    )


def seal(secret: str, conn_id: str, plaintext: bytes, position: int = 0) -> str:
    """AES-256-GCM under the secret's key, the connection id (and a log entry's position) as
    associated data."""
    nonce = os.urandom(12)
    sealed = AESGCM(_key(secret, conn_id)).encrypt(nonce, plaintext, _bound(conn_id, position))
    return base64.b64encode(nonce + sealed).decode()


def unseal(secret: str, conn_id: str, blob: str, position: int = 0) -> bytes:
    raw = base64.b64decode(blob)
    return AESGCM(_key(secret, conn_id)).decrypt(raw[:12], raw[12:], _bound(conn_id, position))


def restore(secret: str, conn_id: str, blob: str, log_entries: Sequence[str]) -> bytearray:
    """The state: the sealed snapshot ``blob`` with each sealed change of its log applied in order."""
    state = bytearray(unseal(secret, conn_id, blob))
    for position, entry in enumerate(log_entries, 1):
        apply(state, Splice.decode(unseal(secret, conn_id, entry, position)))
    return state


def _bound(conn_id: str, position: int) -> bytes:
    return conn_id.encode() if not position else f"{conn_id}#{position}".encode()


# KEYS[1] = the connection's hash, KEYS[2] = its log; ARGV = epoch, hash, owner, deadline,
# holder, snapshot, ttl_ms.  Writes only if the stored epoch is ours (or the state expired
# meanwhile: then no other holder took it, and ours is the state); the log is emptied.
# 1 written, 0 fenced.
SAVE = Lua("""
local e = redis.call('HGET', KEYS[1], 'epoch')
if e and e ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'hash', ARGV[2], 'owner', ARGV[3], 'deadline', ARGV[4],
           'holder', ARGV[5], 'blob', ARGV[6], 'seq', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
""")

# KEYS as SAVE; ARGV = epoch, the log's length the change applies to, the change, ttl_ms.
# 1 appended, 0 fenced, 2 not on top of what is stored (expired, or another base): write a
# snapshot instead.
APPEND = Lua("""
local f = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
if not f[1] then return 2 end
if f[1] ~= ARGV[1] then return 0 end
if f[2] ~= ARGV[2] then return 2 end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'seq', tonumber(ARGV[2]) + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
""")

# KEYS as SAVE; ARGV = epoch, ttl_ms.  1 refreshed, 0 fenced, 2 missing (expired).
TOUCH = Lua("""
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then return 2 end
if e ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
""")

# KEYS as SAVE; ARGV = epoch, ttl_ms.  Deletes only our own state, and leaves in its place a
# marker with no content (epoch ``ended``, one grace window) that fences every holder: a write
# still in flight from this or an older holder cannot bring the state back.
FORGET = Lua("""
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'epoch', 'ended')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
""")

# KEYS as SAVE; ARGV = secret hash, owner, new holder, ttl_ms, channel prefix, conn_id.  The
# new holder's epoch, deadline, snapshot and log, or nil (no such state, another secret or
# owner); the old holder is told on its channel (``<conn_id> <new epoch>``).
CLAIM = Lua("""
local f = redis.call('HMGET', KEYS[1], 'hash', 'owner', 'holder', 'deadline', 'blob')
if not f[1] or f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return nil end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'holder', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if f[3] then redis.call('PUBLISH', ARGV[5] .. f[3], ARGV[6] .. ' ' .. epoch) end
return {epoch, f[4], f[5] or '', redis.call('LRANGE', KEYS[2], 0, -1)}
""")


@dataclass(slots=True)
class _Written:
    """What this process last wrote of a connection: the state the stored snapshot and log
    add up to, for the next checkpoint to write only its change."""

    epoch: int
    state: bytes
    seq: int  # changes in the log
    snapshot_bytes: int
    log_bytes: int


class ContinuityStore:
    """The connection states in the Redis at ``url`` (or the Redis Cluster it lists, with
    ``cluster``); one client per process and loop.  ``bytes_written`` counts the sealed
    snapshots and changes written (what a checkpoint costs the store)."""

    def __init__(
        self, url: str, key_prefix: str, *, ttl_s: float, cluster: bool = False, password: str | None = None
    ) -> None:
        self.key_prefix = key_prefix
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._redis = connect(url, cluster=cluster, password=password)
        self._written: dict[str, _Written] = {}
        self._listening: asyncio.Task[None] | None = None
        self.bytes_written = 0

    def key(self, conn_id: str) -> str:
        return conn_key(conn_id, self.key_prefix)

    def _keys(self, conn_id: str) -> list[str]:
        return [self.key(conn_id), self.key(conn_id) + ":log"]

    def _channel(self, holder: str) -> str:
        return f"{self.key_prefix}holder:{holder}"

    async def _run(self, lua: Lua, conn_id: str, args: list[Any]) -> Any:
        [answer] = await run_replicated(self._redis, [(lua, self._keys(conn_id), args)], None)
        return answer

    async def save(
        self, conn_id: str, epoch: int, secret: str, *, owner: str, deadline: float, holder: str, state: bytes
    ) -> None:
        """Write the state, sealed (as its change from the last one this process wrote for
        the same epoch, when there is one and the log is smaller than the snapshot; else as a
        snapshot); :class:`Fenced` if another holder has taken it."""
        base = self._written.pop(conn_id, None)
        try:
            if base is not None and base.epoch == epoch and await self._append(conn_id, secret, base, state):
                self._written[conn_id] = base
                return
            snapshot = seal(secret, conn_id, state)
            args = [str(epoch), secret_hash(secret), owner, repr(deadline), holder, snapshot, self.ttl_ms]
            if int(await self._run(SAVE, conn_id, args)) == 0:
                raise Fenced(conn_id)
            self.bytes_written += len(snapshot)
            self._written[conn_id] = _Written(epoch, state, 0, len(snapshot), 0)
        except BaseException:
            self._written.pop(conn_id, None)  # what is stored is not known: a snapshot next
            raise

    async def _append(self, conn_id: str, secret: str, base: _Written, state: bytes) -> bool:
        """Append ``state``'s change from ``base`` (updated); ``False``: write a snapshot."""
        change = seal(secret, conn_id, diff(base.state, state).encode(), base.seq + 1)
        if base.log_bytes + len(change) > base.snapshot_bytes:
            return False  # compact: the log would outgrow the snapshot
        answer = int(await self._run(APPEND, conn_id, [str(base.epoch), str(base.seq), change, self.ttl_ms]))
        if answer == 0:
            raise Fenced(conn_id)
        if answer == 2:
            return False
        self.bytes_written += len(change)
        base.state, base.seq, base.log_bytes = state, base.seq + 1, base.log_bytes + len(change)
        return True

    async def touch(self, conn_id: str, epoch: int) -> bool:
        """Restart the state's expiry; ``False`` if it expired (write it again);
        :class:`Fenced` if another holder has taken it."""
        answer = int(await self._run(TOUCH, conn_id, [str(epoch), self.ttl_ms]))
        if answer == 0:
            self.release(conn_id, epoch)
            raise Fenced(conn_id)
        return answer == 1

    async def forget(self, conn_id: str, epoch: int) -> None:
        """Delete the state if it is still ours (the client closed normally); what any holder
        writes or refreshes for it afterwards is :class:`Fenced`, and its token is refused."""
        self.release(conn_id, epoch)
        await self._run(FORGET, conn_id, [str(epoch), self.ttl_ms])

    def release(self, conn_id: str, epoch: int) -> None:
        """Forget what this process wrote of ``conn_id`` at ``epoch`` (it holds it no more)."""
        written = self._written.get(conn_id)
        if written is not None and written.epoch == epoch:
            del self._written[conn_id]

    async def claim(self, conn_id: str, secret: str, owner: str, holder: str) -> Claimed | None:
        """Take the state for ``holder`` (a new epoch; the old holder is told); ``None`` for an
        unknown or expired connection, another secret or another owner (one answer for all)."""
        args = [secret_hash(secret), owner, holder, self.ttl_ms, self._channel(""), conn_id]
        answer = await self._run(CLAIM, conn_id, args)
        if answer is None:
            return None
        epoch, deadline, blob, log_entries = answer
        if not blob:
            return Claimed(int(epoch), float(deadline), None)
        state = restore(secret, conn_id, blob, log_entries)
        self._written[conn_id] = _Written(
            int(epoch), bytes(state), len(log_entries), len(blob), sum(len(e) for e in log_entries)
        )
        return Claimed(int(epoch), float(deadline), bytes(state))

    def listen(self, holder: str, on_taken: Callable[[str], None]) -> None:
        """Call ``on_taken("<conn_id> <epoch>")`` whenever another holder claims one of ``holder``'s
        connections (a subscription kept until :meth:`close`; on a cluster, a ``PUBLISH``
        reaches every node, so one node's subscription hears it)."""

        async def run() -> None:
            while True:
                try:
                    await ready(self._redis)  # a cluster's pubsub picks its node from the slot map
                    pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                except (aioredis.RedisError, OSError) as exc:
                    log.warning("continuity subscription failed (%r); retrying", exc)
                    await asyncio.sleep(1.0)
                    continue
                try:
                    await pubsub.subscribe(self._channel(holder))
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            on_taken(str(message["data"]))
                except (aioredis.RedisError, OSError) as exc:
                    log.warning("continuity subscription lost (%r); resubscribing", exc)
                    await asyncio.sleep(1.0)
                finally:
                    with contextlib.suppress(aioredis.RedisError, OSError):
                        await pubsub.aclose()

        self._listening = asyncio.get_running_loop().create_task(run())

    async def keys(self) -> list[str]:
        """Every key under the prefix (tests and operators: what is kept)."""
        return sorted({k async for k in self._redis.scan_iter(match=f"{self.key_prefix}*")})

    async def close(self) -> None:
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
        await self._redis.aclose()
