"""The store's writer: records and ledger lines are written through, before the terminal event.

A ``store:true`` response's record is written *before* its terminal event goes out, with its
usage (billing) line in the same transaction (:meth:`StoreWriter.put`, awaited by the
connection driver), so a client told a response completed can read it at once from any
process, and a crash cannot lose it or its line after the fact.  A ``store:false``
response's line is either appended to the process's journal (store/journal.py) before its
terminal event goes out and committed write-behind (:meth:`StoreWriter.bill_behind`; a
process killed before its commit leaves the line in its journal for
:func:`store.journal.replay`), or, with ``commit_lines`` (a cluster store: a node's disk may
go with the node), committed before its terminal event goes out (:meth:`StoreWriter.bill`).
Either way the lines of every connection of the process that wait at once share one commit
(one task, in submission order: a group commit); journaled lines, already safe, wait up to
``linger_s`` for more to join their commit (a line awaited by its terminal event, a flush or
a full batch commits at once).  Every write is idempotent (a line is unique by response
id), so a failed write is retried once, and one the store cannot take now
(:class:`~store.base.WriteUnavailable`: a failover under way) again and again, backing off,
for ``retry_s`` (``store.write_retry_s``); one that fails still is logged (and raised to the
caller that awaits it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .base import Store, StoredResponse, UsageEntry, WriteUnavailable
from .journal import Journal

log = logging.getLogger(__name__)

DEFAULT_MAX_WRITING = 32  # puts at once, well under a Redis client's connection pool (100)
MAX_BATCH = 256  # ledger lines per commit
DEFAULT_LINGER_S = 0.05  # how long journaled lines wait for others to share their commit
FIRST_BACKOFF_S = 0.05  # the wait before retrying a write the store could not take now, doubled
MAX_BACKOFF_S = 0.5  # ... up to this


class WriterClosed(RuntimeError):
    """A write after :meth:`StoreWriter.close`."""


async def retried(
    write: Callable[[], Awaitable[None]],
    retry_s: float = 0.0,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """``write``, and once more at once if it raised (writes are idempotent, so a write that
    landed but whose answer was lost is not doubled); while it raises
    :class:`~store.base.WriteUnavailable`, again after a backoff until ``retry_s`` has passed
    since the first try.  The last failure is raised."""
    started = clock()
    backoff = FIRST_BACKOFF_S
    for attempt in itertools.count():
        try:
            await write()
            return
        except WriteUnavailable:
            left = retry_s - (clock() - started)
            if attempt and left <= 0:
                raise
            if attempt:
                await sleep(min(backoff, left))
                backoff = min(2 * backoff, MAX_BACKOFF_S)
        except Exception:  # logged by the caller if the retry fails too
            if attempt:
                raise


class StoreWriter:
    """Writes records and ledger lines through to ``store``.

    Must be used on the event loop thread (the ledger task is started on the running loop
    at the first line).  At most ``max_writing`` puts run at once (more wait their turn);
    ledger lines are committed by one task, up to ``MAX_BATCH`` a commit.  ``close()``
    finishes every write started before closing the store.  ``on_failure`` is called once
    for every record or line that failed (after its retries; ``retry_s``: how long one the
    store cannot take now is retried).
    """

    def __init__(
        self,
        store: Store,
        *,
        max_writing: int = DEFAULT_MAX_WRITING,
        on_failure: Callable[[], None] | None = None,
        journal: Journal | None = None,
        commit_lines: bool = False,
        linger_s: float = DEFAULT_LINGER_S,
        retry_s: float = 0.0,
    ) -> None:
        if commit_lines and journal is not None:
            raise ValueError("a writer that commits its ledger lines keeps no journal")
        self.store = store
        self.commits_lines = commit_lines  # store:false lines: await bill() before the terminal event
        self._journal = journal
        self._journaled = 0  # journal lines not committed yet
        self._journal_failed = False  # a journaled line could not be committed: keep the journal
        self._on_failure = on_failure  # called once for every write that failed (a metric)
        self._writing = asyncio.Semaphore(max_writing)  # a burst of puts queues here
        self._lines: deque[tuple[UsageEntry, asyncio.Future[None], bool]] = deque()  # waiting for a commit
        self._billing: set[asyncio.Future[None]] = set()  # lines not committed (or failed) yet
        # The latest line submitted: one task commits the lines in order, so once it is done
        # every line before it is (a flush waits on it alone, not on every pending line).
        self._last_line: asyncio.Future[None] | None = None
        self._puts: dict[str, asyncio.Task[None]] = {}  # the latest put of each id still writing
        self._wakeup = asyncio.Event()
        self._linger_s = linger_s
        self._retry_s = retry_s  # how long a write the store cannot take now is retried
        self._now = asyncio.Event()  # commit what waits without lingering (a line awaited, a flush)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Ledger lines submitted and not yet finished (committed or failed)."""
        return len(self._billing)

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        """Write ``record``, with ``usage``'s ledger line in the same transaction, now (not
        queued): once this returns, every process reads it.

        Raises what the store raises, after logging it.  The write runs on its own task:
        cancelling the caller does not cancel it, and :meth:`get`, :meth:`delete`,
        :meth:`flush` and :meth:`close` wait for it.  Writes of one id land in call order.
        """
        if self._closed:
            raise WriterClosed("the store writer is closed")
        task = asyncio.get_running_loop().create_task(self._put(record, usage, self._puts.get(record.id)))
        self._puts[record.id] = task
        task.add_done_callback(lambda t: self._put_done(record.id, t))
        await asyncio.shield(task)

    async def _put(
        self, record: StoredResponse, usage: UsageEntry | None, previous: asyncio.Task[None] | None
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await retried(functools.partial(self._put_once, record, usage), self._retry_s)

    async def _put_once(self, record: StoredResponse, usage: UsageEntry | None) -> None:
        async with self._writing:  # not held while a retry backs off: other puts go on
            await self.store.put(record, usage)

    def _put_done(self, response_id: str, task: asyncio.Task[None]) -> None:
        if self._puts.get(response_id) is task:
            del self._puts[response_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("store write failed: put %s", response_id, exc_info=task.exception())
            if self._on_failure is not None:
                self._on_failure()

    async def bill(self, entry: UsageEntry) -> None:
        """Commit ``entry``'s ledger line; returns once it is committed, raises (after
        logging) if it could not be.  Lines waiting at once share a commit.  Cancelling the
        caller does not withdraw the line; :meth:`flush` and :meth:`close` wait for it."""
        if self._closed:
            raise WriterClosed("the store writer is closed")
        done = self._submit(entry)
        self._now.set()
        await asyncio.shield(done)

    def bill_behind(self, entry: UsageEntry) -> None:
        """Journal ``entry``'s ledger line (once this returns, the line survives this process
        being killed) and commit it write-behind.  Raises ``OSError`` if it could not be
        journaled.  Without a journal the line is only committed write-behind."""
        if self._closed:
            raise WriterClosed("the store writer is closed")
        if self._journal is not None:
            self._journal.append(entry)
            self._journaled += 1
        self._submit(entry, journaled=self._journal is not None)

    def _submit(self, entry: UsageEntry, *, journaled: bool = False) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(self._billed)
        self._billing.add(done)
        self._last_line = done
        self._lines.append((entry, done, journaled))
        if len(self._lines) >= MAX_BATCH:
            self._now.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-ledger")
        self._wakeup.set()
        return done

    def _billed(self, done: asyncio.Future[None]) -> None:
        self._billing.discard(done)
        if not done.cancelled():
            done.exception()  # retrieved here: a caller that went away never awaits it

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """As :meth:`Store.get`, after a put of the id still writing has finished."""
        await self._settled(response_id)
        return await self.store.get(response_id, owner)

    async def find_items(self, item_ids: Sequence[str], owner: str) -> dict[str, dict[str, Any]]:
        """As :meth:`Store.find_items` (a referenced item's response sent its terminal event
        after its record was written, so there is no put to wait for)."""
        return await self.store.find_items(item_ids, owner)

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
        """As :meth:`Store.usage`, after every write started so far has finished."""
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
        last = self._last_line
        if last is None or last.done() or self._task is None:
            return
        self._now.set()
        # The latest line alone: many sockets closing at once each flush, and a wait on every
        # pending line each would cost connections × lines.
        await asyncio.wait([last, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not last.done():
            raise RuntimeError(f"the store writer task stopped with {self.pending} lines uncommitted")

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
            if self._journal is not None:
                self._journal.close(committed=not self._journaled and not self._journal_failed)
            await self.store.close()

    async def _run(self) -> None:
        while True:
            if not self._lines:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._linger_s > 0 and not self._now.is_set():
                # Only journaled lines wait: let others join their commit.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), self._linger_s)
            self._now.clear()
            batch = [self._lines.popleft() for _ in range(min(len(self._lines), MAX_BATCH))]
            entries = [entry for entry, _, _ in batch]
            journaled = sum(1 for _, _, j in batch if j)
            try:
                await retried(functools.partial(self.store.add_usage, entries), self._retry_s)
            except Exception as exc:
                log.error(
                    "store write failed: usage of %s", ", ".join(e.response_id for e in entries), exc_info=exc
                )
                self._journal_failed = self._journal_failed or journaled > 0  # replayed later
                for _, done, _ in batch:
                    if self._on_failure is not None:
                        self._on_failure()
                    if not done.done():
                        done.set_exception(exc)
            else:
                for _, done, _ in batch:
                    if not done.done():
                        done.set_result(None)
            self._journaled -= journaled
            if self._journal is not None and not self._journaled and not self._journal_failed:
                self._journal.clear()
