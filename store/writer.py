"""The store's writer: stored responses are written through, ledger lines behind.

A ``store:true`` response's record is written *before* its terminal event goes out
(:meth:`StoreWriter.put`, awaited by the connection driver), so a client told a response
completed can read it at once from any process, and a crash cannot lose it after the fact.
Usage (billing) lines are *submitted* and written later by one background task, in
submission order, off the critical path: a ledger write overlaps the next turn.  A ledger
write that fails is logged and skipped; the task carries on with the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from .base import Store, StoredResponse, UsageEntry

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 10_000
DEFAULT_MAX_WRITING = 32  # puts at once, well under a Redis client's connection pool (100)


class WriterClosed(RuntimeError):
    """A write after :meth:`StoreWriter.close`."""


class WriterBacklogFull(RuntimeError):
    """``max_pending`` ledger writes are already queued: the store is down or far too slow."""


class StoreWriter:
    """Writes records through to ``store`` and queues ledger lines for one asyncio task.

    Must be used on the event loop thread (the ledger task is started on the running loop
    at the first submit).  At most ``max_writing`` puts run at once (more wait their turn).
    At most ``max_pending`` ledger lines may wait at once; beyond that :meth:`submit_usage`
    raises :class:`WriterBacklogFull` rather than grow without bound.  ``close()`` finishes
    every write started or submitted before closing the store.  ``on_failure`` is called
    once for every write that failed.
    """

    def __init__(self, store: Store, *, max_pending: int = DEFAULT_MAX_PENDING,
                 max_writing: int = DEFAULT_MAX_WRITING, on_failure: Callable[[], None] | None = None) -> None:
        self.store = store
        self._on_failure = on_failure  # called once for every write that failed (a metric)
        self.max_pending = max_pending
        self._writing = asyncio.Semaphore(max_writing)  # a burst of puts queues here
        self._ops: deque[UsageEntry | asyncio.Future[None]] = deque()  # ledger lines and flush barriers
        self._pending = 0  # ledger lines in _ops
        self._puts: dict[str, asyncio.Task[None]] = {}  # the latest put of each id still writing
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Ledger lines submitted and not yet finished (written or failed)."""
        return self._pending

    async def put(self, record: StoredResponse) -> None:
        """Write ``record`` now (not queued): once this returns, every process reads it.

        Raises what the store raises, after logging it.  The write runs on its own task:
        cancelling the caller does not cancel it, and :meth:`get`, :meth:`delete`,
        :meth:`flush` and :meth:`close` wait for it.  Writes of one id land in call order.
        """
        if self._closed:
            raise WriterClosed("the store writer is closed")
        task = asyncio.get_running_loop().create_task(self._put(record, self._puts.get(record.id)))
        self._puts[record.id] = task
        task.add_done_callback(lambda t: self._put_done(record.id, t))
        await asyncio.shield(task)

    async def _put(self, record: StoredResponse, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        async with self._writing:
            await self.store.put(record)

    def _put_done(self, response_id: str, task: asyncio.Task[None]) -> None:
        if self._puts.get(response_id) is task:
            del self._puts[response_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("store write failed: put %s", response_id, exc_info=task.exception())
            if self._on_failure is not None:
                self._on_failure()

    def submit_usage(self, entry: UsageEntry) -> None:
        """Queue ``entry`` for :meth:`Store.add_usage`; never waits."""
        if self._closed:
            raise WriterClosed("the store writer is closed")
        if self._pending >= self.max_pending:
            raise WriterBacklogFull(f"{self._pending} ledger writes are already queued")
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-writer")
        self._ops.append(entry)
        self._pending += 1
        self._wakeup.set()

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """As :meth:`Store.get`, after a put of the id still writing has finished."""
        await self._settled(response_id)
        return await self.store.get(response_id, owner)

    async def delete(self, response_id: str, owner: str) -> bool:
        """As :meth:`Store.delete`; a put of the id still writing lands first, so it cannot
        bring the record back after the delete."""
        await self._settled(response_id)
        return await self.store.delete(response_id, owner)

    async def _settled(self, response_id: str) -> None:
        writing = self._puts.get(response_id)
        if writing is not None:
            await asyncio.wait([writing])

    async def usage(self, owner: str) -> list[UsageEntry]:
        """As :meth:`Store.usage`, after every ledger line submitted so far is written."""
        await self.flush()
        return await self.store.usage(owner)

    async def flush(self) -> None:
        """Return once every put started and every ledger line submitted before this call
        has been performed (written or failed).

        Raises ``RuntimeError`` rather than waiting forever if the ledger task has died
        (it survives failed writes, so only a bug or a cancelled loop gets it there).
        """
        if self._puts:
            await asyncio.wait(list(self._puts.values()))
        if not self._ops or self._task is None:
            return
        barrier: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ops.append(barrier)
        self._wakeup.set()
        await asyncio.wait([barrier, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not barrier.done():
            raise RuntimeError(f"the store writer task stopped with {self.pending} writes queued")

    async def close(self) -> None:
        """Flush, stop the task, close the store. Idempotent; later writes raise."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.wait([self._task])
            await self.store.close()

    async def _run(self) -> None:
        while True:
            if not self._ops:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            op = self._ops[0]
            if isinstance(op, asyncio.Future):
                self._ops.popleft()
                if not op.done():  # its flush() may have been cancelled
                    op.set_result(None)
                continue
            try:
                await self.store.add_usage(op)
            except Exception:
                log.exception("store write failed, skipped: usage of %s", op.response_id)
                if self._on_failure is not None:
                    self._on_failure()
            self._ops.popleft()
            self._pending -= 1
