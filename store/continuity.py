"""A connection's state in the cluster store, so a resume works on any node (docs/reliability.md,
"Resuming on any node").  Redis only; no Ray, and nothing of ``actors/`` or ``serve/``.

One hash per connection, ``<prefix>conn:<conn_id>``:

- ``epoch``: the holder's fencing number.  Every new holder (a resume on whichever host it
  lands) increments it atomically as it takes the state; every write is a compare-and-set on
  it, inside Redis (Lua), so a holder that lost the connection — taken over, partitioned away
  and back — can neither write the state nor, once it notices, keep serving;
- ``hash``: SHA-256 of the token's secret (the server never keeps the secret);
- ``owner``: the API-key fingerprint the connection belongs to; ``deadline``: its lifetime
  limit on the wall clock; ``holder``: the session host that holds it now (a takeover
  publishes the connection id on ``<prefix>holder:<name>`` so that host lets go at once);
- ``blob``: the session's state (JSON), sealed with AES-GCM under a key derived (HKDF-SHA256)
  from the token's secret: without the token it cannot be read, not even by the operator.

The hash expires ``ttl_s`` after the last write or heartbeat (the resume grace window); the
holder refreshes it while the client is connected and deletes it when the client closes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

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


def secret_hash(secret: str) -> str:
    return hashlib.sha256(b"rws2-secret\0" + secret.encode()).hexdigest()


def _key(secret: str, conn_id: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=conn_id.encode(), info=_INFO).derive(
        secret.encode()
    )


def seal(secret: str, conn_id: str, plaintext: bytes) -> str:
    """AES-256-GCM under the secret's key, the connection id as associated data."""
    nonce = os.urandom(12)
    return base64.b64encode(
        nonce + AESGCM(_key(secret, conn_id)).encrypt(nonce, plaintext, conn_id.encode())
    ).decode()


def unseal(secret: str, conn_id: str, blob: str) -> bytes:
    raw = base64.b64decode(blob)
    return AESGCM(_key(secret, conn_id)).decrypt(raw[:12], raw[12:], conn_id.encode())


# KEYS[1] = the connection's hash; ARGV = epoch, hash, owner, deadline, holder, blob, ttl_ms.
# Writes only if the stored epoch is ours (or the state expired meanwhile: then no other holder
# took it, and ours is the state).  1 written, 0 fenced.
SAVE = """
local e = redis.call('HGET', KEYS[1], 'epoch')
if e and e ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'hash', ARGV[2], 'owner', ARGV[3], 'deadline', ARGV[4],
           'holder', ARGV[5], 'blob', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
"""

# KEYS[1] = the hash; ARGV = epoch, ttl_ms.  1 refreshed, 0 fenced, 2 missing (expired).
TOUCH = """
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then return 2 end
if e ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS[1] = the hash; ARGV = epoch, ttl_ms.  Deletes only our own state, and leaves in its
# place a marker with no content (epoch ``ended``, one grace window) that fences every holder:
# a write still in flight from this or an older holder cannot bring the state back.
FORGET = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'epoch', 'ended')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS[1] = the hash; ARGV = secret hash, owner, new holder, ttl_ms, channel prefix, conn_id.
# The new holder's epoch, deadline and blob, or nil (no such state, another secret or owner);
# the old holder is told on its channel (``<conn_id> <new epoch>``).
CLAIM = """
local f = redis.call('HMGET', KEYS[1], 'hash', 'owner', 'holder', 'deadline', 'blob')
if not f[1] or f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return nil end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'holder', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if f[3] then redis.call('PUBLISH', ARGV[5] .. f[3], ARGV[6] .. ' ' .. epoch) end
return {epoch, f[4], f[5] or ''}
"""


class ContinuityStore:
    """The connection states in the Redis at ``url`` (one client per process and loop)."""

    def __init__(self, url: str, key_prefix: str, *, ttl_s: float) -> None:
        self.key_prefix = key_prefix
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._redis = aioredis.Redis.from_url(url, decode_responses=True)
        self._save = self._redis.register_script(SAVE)
        self._touch = self._redis.register_script(TOUCH)
        self._forget = self._redis.register_script(FORGET)
        self._claim = self._redis.register_script(CLAIM)
        self._listening: asyncio.Task[None] | None = None

    def key(self, conn_id: str) -> str:
        return f"{self.key_prefix}conn:{conn_id}"

    def _channel(self, holder: str) -> str:
        return f"{self.key_prefix}holder:{holder}"

    async def save(
        self, conn_id: str, epoch: int, secret: str, *, owner: str, deadline: float, holder: str, state: bytes
    ) -> None:
        """Write the state, sealed; :class:`Fenced` if another holder has taken it."""
        written = await self._save(
            keys=[self.key(conn_id)],
            args=[
                str(epoch),
                secret_hash(secret),
                owner,
                repr(deadline),
                holder,
                seal(secret, conn_id, state),
                self.ttl_ms,
            ],
        )
        if int(written) == 0:
            raise Fenced(conn_id)

    async def touch(self, conn_id: str, epoch: int) -> bool:
        """Restart the state's expiry; ``False`` if it expired (write it again);
        :class:`Fenced` if another holder has taken it."""
        answer = int(await self._touch(keys=[self.key(conn_id)], args=[str(epoch), self.ttl_ms]))
        if answer == 0:
            raise Fenced(conn_id)
        return answer == 1

    async def forget(self, conn_id: str, epoch: int) -> None:
        """Delete the state if it is still ours (the client closed normally); what any holder
        writes or refreshes for it afterwards is :class:`Fenced`, and its token is refused."""
        await self._forget(keys=[self.key(conn_id)], args=[str(epoch), self.ttl_ms])

    async def claim(self, conn_id: str, secret: str, owner: str, holder: str) -> Claimed | None:
        """Take the state for ``holder`` (a new epoch; the old holder is told); ``None`` for an
        unknown or expired connection, another secret or another owner (one answer for all)."""
        answer = await self._claim(
            keys=[self.key(conn_id)],
            args=[secret_hash(secret), owner, holder, self.ttl_ms, self._channel(""), conn_id],
        )
        if answer is None:
            return None
        epoch, deadline, blob = answer
        state = unseal(secret, conn_id, blob) if blob else None
        return Claimed(int(epoch), float(deadline), state)

    def listen(self, holder: str, on_taken: Callable[[str], None]) -> None:
        """Call ``on_taken("<conn_id> <epoch>")`` whenever another holder claims one of ``holder``'s
        connections (a subscription kept until :meth:`close`)."""

        async def run() -> None:
            while True:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
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
        return [k async for k in self._redis.scan_iter(match=f"{self.key_prefix}*")]

    async def close(self) -> None:
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
        await self._redis.aclose()
