"""Resume on any node: a host's side of keeping its connections' state in the cluster store
(docs/reliability.md, "Resuming on any node"; the store side is :mod:`store.connection_states`).

On only with resume on (``session.resume_grace_s > 0``) and the Redis store.  For each
connection it holds, the host

- writes the session's state (:meth:`actors.core.session.Session.snapshot`, sealed with the
  token's secret) when the connection opens and at every turn boundary, before the turn's
  terminal event is sent (:meth:`checkpoint`; writes are coalesced, the latest state wins);
- refreshes its expiry every third of the grace window while the client is connected
  (:meth:`_heartbeat`), so a crash leaves it resumable for between ⅔ of the grace and the
  grace; a parked or drained state expires a grace after the socket ended;
- deletes it when the client closes normally (code 1000) or the server ends the connection
  outside a drain (a drain's close keeps it, to be resumed on another node:
  :mod:`actors.host.aftermath`);
- lets go as soon as another holder claims it: told on its channel (a takeover, wherever the
  resume landed) or by a write or heartbeat that finds a newer epoch (it was partitioned
  away): the socket closes, 1000 for a takeover, 1012 (retryable) for a fenced holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from store.connection_states import Claimed, ContinuityStore, Fenced

from .resume import Held

log = logging.getLogger(__name__)

TAKEN_OVER = (1000, "resumed on another connection")
FENCED = (1012, "connection resumed elsewhere")  # retryable: the client reconnects with its token


@dataclass(eq=False)
class _Tracked:
    held: Held
    secret: str
    want: int = 0  # checkpoints asked for
    done: int = 0  # the latest one written
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    heartbeat: asyncio.Task[None] | None = None
    write_ms: list[float] = field(default_factory=list)


class HostContinuity:
    """The connection states one host keeps in the cluster store.

    ``close_taken_over(held, code, reason)`` closes a held state's socket (the server's takeover path);
    ``wall`` is the wall clock the lifetime deadlines are kept on."""

    def __init__(
        self,
        store: ContinuityStore,
        holder: str,
        grace_s: float,
        close_taken_over: Callable[[Held, int, str], Coroutine[Any, Any, None]],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.holder = holder
        self.grace_s = grace_s
        self.wall = wall
        self._close_taken_over = close_taken_over
        self._tracked: dict[Held, _Tracked] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._settling: dict[Held, asyncio.Task[None]] = {}  # a socket's end, written to the store
        self.checkpoint_ms: list[float] = []  # write times, for the benchmark (bounded)

    def start(self) -> None:
        self.store.listen(self.holder, self._on_taken)

    # ------------------------------------------------------------------ taking a state
    async def claim(self, conn_id: str, secret: str, owner: str) -> Claimed | None:
        """The state a resume presents the secret of, now ours (a new epoch), or ``None``."""
        try:
            return await self.store.claim(conn_id, secret, owner, self.holder)
        except RedisError:
            log.warning("claiming connection %s from the store failed", conn_id, exc_info=True)
            return None

    def track(self, held: Held, secret: str) -> None:
        """Keep ``held`` in the store from now on (its first write goes out at once)."""
        tracked = self._tracked[held] = _Tracked(held, secret)
        tracked.heartbeat = self._spawn(self._heartbeat(tracked))
        self._spawn(self._checkpointed(tracked))
        held.gone.add_done_callback(lambda _: self._untrack(held))  # expired here, or let go

    async def checkpoint(self, held: Held) -> bool:
        """Write ``held``'s state as it is now (or later); ``False`` if another holder has it
        (the socket is being let go).  A store fault is logged and the turn goes on: the
        state kept elsewhere is then one turn behind."""
        tracked = self._tracked.get(held)
        if tracked is None:
            return not held.fenced
        return await self._checkpoint(tracked)

    async def _checkpoint(self, tracked: _Tracked) -> bool:
        tracked.want += 1
        wanted = tracked.want
        async with tracked.lock:
            if tracked.done >= wanted:
                return not tracked.held.fenced
            taken = tracked.want  # this write carries every change asked for until now
            held = tracked.held
            started = time.perf_counter()
            try:
                await self.store.save(
                    held.conn_id,
                    held.epoch,
                    tracked.secret,
                    owner=held.owner,
                    deadline=held.wall_deadline,
                    holder=self.holder,
                    state=held.session.snapshot(),
                )
            except Fenced:
                self._fenced(held)
                return False
            except RedisError:
                log.warning("writing connection %s to the store failed", held.conn_id, exc_info=True)
            else:
                ms = (time.perf_counter() - started) * 1000.0
                if len(self.checkpoint_ms) < 100_000:
                    self.checkpoint_ms.append(ms)
            tracked.done = taken
            return not held.fenced

    async def _checkpointed(self, tracked: _Tracked) -> None:
        await self._checkpoint(tracked)

    async def _heartbeat(self, tracked: _Tracked) -> None:
        held = tracked.held
        while True:
            await asyncio.sleep(self.grace_s / 3)
            try:
                if not await self.store.touch(held.conn_id, held.epoch):
                    await self._checkpoint(tracked)  # expired meanwhile: write it again
            except Fenced:
                self._fenced(held)
                return
            except RedisError:
                log.warning("refreshing connection %s in the store failed", held.conn_id, exc_info=True)

    # ------------------------------------------------------------------ letting go
    def _on_taken(self, message: str) -> None:
        """Another holder claimed a connection (``<conn_id> <epoch>``): ours, if older, goes."""
        conn_id, _, epoch = message.partition(" ")
        for held in [h for h in self._tracked if h.conn_id == conn_id and h.epoch < int(epoch or 0)]:
            self._give_up(held, *TAKEN_OVER)

    def _fenced(self, held: Held) -> None:
        if not held.fenced:
            log.info("connection %s was taken by a newer holder: letting go", held.conn_id)
            self._give_up(held, *FENCED)

    def _give_up(self, held: Held, code: int, reason: str) -> None:
        held.fenced = True
        self._untrack(held)
        self._spawn(self._close_taken_over(held, code, reason))

    # ------------------------------------------------------------------ a socket's end
    def parked(self, held: Held) -> None:
        """The socket dropped: the state stays in the store for the grace window (from now:
        one last refresh), as it stays parked here (a claim elsewhere still lets it go)."""
        tracked = self._tracked.get(held)
        if tracked is not None:
            if tracked.heartbeat is not None:
                tracked.heartbeat.cancel()
            self._settling[held] = self._spawn(self._refresh(tracked))

    async def _refresh(self, tracked: _Tracked) -> None:
        with contextlib.suppress(Fenced):
            try:
                if not await self.store.touch(tracked.held.conn_id, tracked.held.epoch):
                    await self._checkpoint(tracked)
            except RedisError:
                log.warning("refreshing connection %s failed", tracked.held.conn_id, exc_info=True)

    async def handed_off(self, held: Held) -> None:
        """A drain: the state is written as it is now and stays for the grace window, for the
        client to resume on another host (before its socket closes with 1012)."""
        tracked = self._untrack(held, release=False)
        if tracked is not None:
            await self._checkpoint(tracked)  # its change from the last one written
            self.store.release(held.conn_id, held.epoch)

    def ended(self, held: Held) -> None:
        """The client closed normally, or the server ended the connection: the state is
        deleted from the store (if it is still ours)."""
        tracked = self._untrack(held)
        if tracked is not None and not held.fenced:
            self._settling[held] = self._spawn(self._forget(held))

    async def settled(self, held: Held, timeout_s: float = 2.0) -> None:
        """Wait (briefly) for what a socket's end writes to the store: the host reports the
        end only then, and an idle host may be stopped right after."""
        task = self._settling.pop(held, None)
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout_s)

    def dropped(self, held: Held) -> None:
        """The host lets go of a state without deleting it (it expires by itself)."""
        self._untrack(held)

    async def _forget(self, held: Held) -> None:
        try:
            await self.store.forget(held.conn_id, held.epoch)
        except RedisError:
            log.warning("deleting connection %s from the store failed", held.conn_id, exc_info=True)

    def _untrack(self, held: Held, *, release: bool = True) -> _Tracked | None:
        tracked = self._tracked.pop(held, None)
        if tracked is not None:
            if release:  # the last state written, kept for the next checkpoint's change
                self.store.release(held.conn_id, held.epoch)
            if tracked.heartbeat is not None:
                tracked.heartbeat.cancel()
        return tracked

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()
