"""Write-behind for the response store: stores and ledger lines leave the critical path.

A response is sent to the client first; its record and usage entry are *submitted* here and
written by one background task, in submission order.  Reads through the writer see every
submitted record at once (read-your-writes), whether or not it has reached the store yet.
A write that fails is logged and skipped; the task carries on with the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .base import Store, StoredResponse, UsageEntry

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 10_000


class WriterClosed(RuntimeError):
    """A submit after :meth:`StoreWriter.close`."""


class WriterBacklogFull(RuntimeError):
    """``max_pending`` writes are already queued: the store is down or far too slow."""


@dataclass(frozen=True, slots=True)
class _Put:
    record: StoredResponse


@dataclass(frozen=True, slots=True)
class _Usage:
    entry: UsageEntry


class StoreWriter:
    """Queues writes to ``store`` and performs them in FIFO order on one asyncio task.

    ``submit_*`` never wait; they must be called on the event loop thread (the task is
    started on the running loop at the first submit).  At most ``max_pending`` writes may
    wait at once; beyond that ``submit_*`` raise :class:`WriterBacklogFull` rather than
    grow without bound.  ``close()`` writes everything submitted before closing the store.
    ``on_failure`` is called once for every write that failed.
    """

    def __init__(self, store: Store, *, max_pending: int = DEFAULT_MAX_PENDING,
                 on_failure: Callable[[], None] | None = None) -> None:
        self.store = store
        self.max_pending = max_pending
        self._on_failure = on_failure  # called for every failed write (a metric)
        self._ops: deque[_Put | _Usage | asyncio.Future[None]] = deque()
        self._pending = 0  # _Put/_Usage entries of _ops (flush barriers are not counted)
        self._queued: dict[str, tuple[StoredResponse, int]] = {}  # id -> (latest record, puts queued)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Writes submitted and not yet finished (written or failed)."""
        return self._pending

    def submit_put(self, record: StoredResponse) -> None:
        """Queue ``record`` for :meth:`Store.put`; readable through :meth:`get` at once."""
        self._enqueue(_Put(record))
        _, count = self._queued.get(record.id, (record, 0))
        self._queued[record.id] = (record, count + 1)

    def submit_usage(self, entry: UsageEntry) -> None:
        """Queue ``entry`` for :meth:`Store.add_usage`."""
        self._enqueue(_Usage(entry))

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """As :meth:`Store.get`, answering from the queue while the id is still in it."""
        queued = self._queued.get(response_id)
        if queued is not None:
            record = queued[0]
            return record if record.owner == owner else None
        return await self.store.get(response_id, owner)

    async def delete(self, response_id: str, owner: str) -> bool:
        """As :meth:`Store.delete`; a queued put of the id is written first, so it
        cannot land after the delete and bring the record back."""
        if response_id in self._queued:
            await self.flush()
        return await self.store.delete(response_id, owner)

    async def usage(self, owner: str) -> list[UsageEntry]:
        """As :meth:`Store.usage`, after everything submitted so far is written."""
        await self.flush()
        return await self.store.usage(owner)

    async def flush(self) -> None:
        """Return once every write submitted before this call has been performed.

        Raises ``RuntimeError`` rather than waiting forever if the writer task has died
        (it survives failed writes, so only a bug or a cancelled loop gets it there).
        """
        if not self._ops or self._task is None:
            return
        barrier: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ops.append(barrier)
        self._wakeup.set()
        await asyncio.wait([barrier, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not barrier.done():
            raise RuntimeError(f"the store writer task stopped with {self.pending} writes queued")

    async def close(self) -> None:
        """Flush, stop the task, close the store. Idempotent; later submits raise."""
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

    def _enqueue(self, op: _Put | _Usage) -> None:
        if self._closed:
            raise WriterClosed("the store writer is closed")
        if self._pending >= self.max_pending:
            raise WriterBacklogFull(f"{self._pending} store writes are already queued")
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-writer")
        self._ops.append(op)
        self._pending += 1
        self._wakeup.set()

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
                if isinstance(op, _Put):
                    await self.store.put(op.record)
                else:
                    await self.store.add_usage(op.entry)
            except Exception:
                log.exception("store write failed, skipped: %s", _describe(op))
                if self._on_failure is not None:
                    self._on_failure()
            self._ops.popleft()
            self._pending -= 1
            if isinstance(op, _Put):
                self._forget(op.record.id)

    def _forget(self, response_id: str) -> None:
        record, count = self._queued[response_id]
        if count == 1:
            del self._queued[response_id]
        else:
            self._queued[response_id] = (record, count - 1)


def _describe(op: _Put | _Usage) -> str:
    if isinstance(op, _Put):
        return f"put {op.record.id}"
    return f"usage of {op.entry.response_id}"
