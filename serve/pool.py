"""Assigning connections to session actors.

Creating an actor costs ~0.5 s and warming it (inference handle, tokenizer) more,
so the pool keeps ``warm`` free connection slots on started, warmed actors;
acquiring one is then free of Ray calls.  With ``per_actor == 1`` (the default) an actor
hosts one connection at a time.  A connection's state lives in objects the actor drops when
the connection ends, so an idle actor is kept as a warm one while the pool has no more than
``warm`` free slots.  Beyond that the newest idle actors stop — usually the one that just
served a connection, whose process (and heap) goes with it, while the spare started when
the connection was acquired takes its place: a sequence of connections costs one actor
start-up each, in the background.  With ``per_actor > 1`` an actor hosts several
connections at once.
Dead actors are dropped.  Actors are named (``<prefix>-a<n>``): a resume token names the
actor that holds a connection's state.  Ray specifics are injected.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Host:
    actor: Any
    handoff_path: str  # where the actor receives sockets
    free: int


@dataclass(frozen=True, slots=True)
class Lease:
    host: Host
    conn_id: str


class ActorPool:
    def __init__(
        self,
        create: Callable[[str], Any],  # the actor's name → a started actor
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
        self._hosts: list[Host] = []  # hosts with a free slot, oldest first
        self._all: set[Host] = set()  # every live host
        self._starting: set[asyncio.Task[bool]] = set()
        self._waiting = 0  # acquires waiting for a slot

    async def _new_host(self) -> Host:
        actor = self._create(f"{self._prefix}-a{next(self._ids)}")
        try:
            path = await actor.ready.remote()
        except BaseException:
            self._kill(actor)
            raise
        host = Host(actor, path, self._per_actor)
        self._all.add(host)
        return host

    def _top_up(self) -> None:
        """Keep ``warm`` free slots ready, plus one for each waiting acquire, starting
        actors in the background (a burst of connections shares the actors starting)."""
        free = sum(h.free for h in self._hosts) + len(self._starting) * self._per_actor
        while free < self._warm + self._waiting:
            task = asyncio.get_running_loop().create_task(self._add_host())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
            free += self._per_actor

    async def _add_host(self) -> bool:
        try:
            self._hosts.append(await self._new_host())
        except Exception:  # noqa: BLE001 - a waiting acquire fails; the next one retries
            log.exception("could not start a session actor")
            return False
        self._trim()
        return True

    async def acquire(self) -> Lease:
        while (host := next((h for h in self._hosts if h.free > 0), None)) is None:
            self._waiting += 1
            try:
                self._top_up()
                done, _ = await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._waiting -= 1
            if not any(task.result() for task in done):
                raise RuntimeError("could not start a session actor")
        host.free -= 1
        if host.free == 0:
            self._hosts.remove(host)
        self._top_up()
        return Lease(host, f"{self._prefix}-{next(self._ids)}")

    def release(self, lease: Lease, *, dead: bool = False) -> None:
        """The connection ended: the slot is free again, or the actor goes (dead, or idle
        beyond the warm count)."""
        host = lease.host
        host.free += 1
        if dead:
            self._stop(host)
        elif host not in self._hosts:
            self._hosts.append(host)
        self._trim()
        self._top_up()

    def _trim(self) -> None:
        """Stop idle actors, newest first, while the others keep ``warm`` free slots (and
        one for each waiting acquire)."""
        for host in list(reversed(self._hosts)):
            free = sum(h.free for h in self._hosts)
            if host.free == self._per_actor and free - host.free >= self._warm + self._waiting:
                self._stop(host)

    def _stop(self, host: Host) -> None:
        if host in self._hosts:
            self._hosts.remove(host)
        self._all.discard(host)
        self._kill(host.actor)

    async def warm_up(self) -> None:
        self._top_up()
        await asyncio.gather(*self._starting, return_exceptions=True)

    def hosts(self) -> list[Host]:
        """Every live host, busy or not."""
        return list(self._all)

    def stats(self) -> dict[str, int]:
        return {"actors": len(self._all), "free_slots": sum(h.free for h in self._hosts),
                "starting": len(self._starting)}

    def shutdown(self) -> None:
        for task in self._starting:
            task.cancel()
        for host in self._all:
            self._kill(host.actor)
        self._hosts.clear()
        self._all.clear()
