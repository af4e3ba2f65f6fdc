"""Assigning connections to session actors.

Creating an actor costs ~0.5 s and its first inference-handle call ~100 ms (design.md §3),
so the pool keeps ``warm`` actors created and warmed ahead of demand; acquiring one is then a
single call.  With ``per_actor == 1`` (the default) every connection gets a dedicated actor
that is killed when the connection ends, so no state can outlive or leak across
connections.  With ``per_actor > 1`` an actor hosts several connections and is reused while
it has room.  Ray specifics (creating and killing actors) are injected.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Host:
    actor: Any
    free: int


@dataclass(frozen=True, slots=True)
class Lease:
    host: _Host
    conn_id: str

    @property
    def actor(self) -> Any:
        return self.host.actor


class ActorPool:
    def __init__(
        self,
        create: Callable[[], Any],
        kill: Callable[[Any], None],
        *,
        per_actor: int,
        warm: int,
        prefix: str,
    ) -> None:
        self._create = create
        self._kill = kill
        self._per_actor = per_actor
        self._warm = warm
        self._prefix = prefix
        self._ids = itertools.count()
        self._hosts: list[_Host] = []  # hosts with at least one free slot, oldest first
        self._starting: set[asyncio.Task[None]] = set()

    async def _new_host(self) -> _Host:
        actor = self._create()
        try:
            free = await actor.ready.remote()
        except BaseException:
            self._kill(actor)
            raise
        return _Host(actor, free)

    def _top_up(self) -> None:
        """Keep ``warm`` idle slots ready, creating actors in the background."""
        idle = sum(h.free for h in self._hosts) + len(self._starting) * self._per_actor
        while idle < self._warm:
            task = asyncio.get_running_loop().create_task(self._add_host())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
            idle += self._per_actor

    async def _add_host(self) -> None:
        try:
            self._hosts.append(await self._new_host())
        except Exception:  # noqa: BLE001 - the next acquire creates one on demand
            log.exception("could not start a session actor")

    async def acquire(self) -> Lease:
        host = next((h for h in self._hosts if h.free > 0), None)
        if host is None:
            host = await self._new_host()
            self._hosts.append(host)
        host.free -= 1
        if host.free == 0:
            self._hosts.remove(host)
        conn_id = f"{self._prefix}-{next(self._ids)}"
        await host.actor.open.remote(conn_id)
        self._top_up()
        return Lease(host, conn_id)

    async def release(self, lease: Lease) -> None:
        host = lease.host
        try:
            remaining = await host.actor.close.remote(lease.conn_id)
        except Exception:  # noqa: BLE001 - a dead actor is simply dropped
            remaining = 0
            host.free = -1
        if self._per_actor == 1 or host.free < 0 or (remaining == 0 and self._spare() >= self._warm):
            if host in self._hosts:
                self._hosts.remove(host)
            self._kill(host.actor)
            self._top_up()
            return
        host.free += 1
        if host not in self._hosts:
            self._hosts.append(host)

    def _spare(self) -> int:
        return sum(h.free for h in self._hosts)

    async def warm_up(self) -> None:
        self._top_up()
        await asyncio.gather(*self._starting, return_exceptions=True)

    def shutdown(self) -> None:
        for task in self._starting:
            task.cancel()
        for host in self._hosts:
            self._kill(host.actor)
        self._hosts.clear()
