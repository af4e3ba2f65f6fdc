"""The writes a terminal event waits on before its lane's events go (the choice of which is
:mod:`actors.host.billing`): the record with its ledger line, the line committed, the line
journaled, the connection's state.  A write that fails turns the event into
``response.failed`` without usage (:func:`~actors.host.billing.failed_instead`), with
``store_unavailable`` (retryable) when the store could not take it now
(:func:`~actors.errors.write_failure`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from store import StoredResponse, StoreWriter, UsageEntry

from ..errors import write_failure
from .billing import failed_instead
from .outbox import AwaitingWrite, Outbox

log = logging.getLogger(__name__)

# Writes the connection's state (resume on any node); ``False``: another holder has the
# connection, and nothing more is sent.
Checkpoint = Callable[[], Awaitable[bool]]


class TerminalWrites:
    """One connection's writes; each returns whether the response is stored (billed), or
    ``None`` if another holder has the connection (its event is not sent)."""

    def __init__(
        self,
        store: StoreWriter,
        outbox: Outbox,
        transport: str,
        observe: Callable[[str, dict[str, float]], None] | None,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._transport = transport
        self._observe = observe

    def journal(self, line: UsageEntry) -> bool:
        """Journal a ``store:false`` response's line (committed write-behind); ``False`` if
        it could not be kept, and the response is then failed, not billed."""
        try:
            self._store.bill_behind(line)
        except Exception:
            log.warning(
                "response %s failed: its ledger line could not be journaled", line.response_id, exc_info=True
            )
            return False
        return True

    async def persist(
        self, line: UsageEntry, record: StoredResponse, waiting: AwaitingWrite, checkpoint: Checkpoint | None
    ) -> bool | None:
        """Write the record with its ledger line, then let its lane's events go
        (``response.failed`` without usage instead of the terminal event if the write
        failed); only then does the session count the response as done, so what starts next
        is sent after it."""
        started = time.perf_counter()
        stored = True
        try:
            await self._store.put(record, line)
        except Exception as exc:  # noqa: BLE001 - the writer logged it; the client learns the response failed
            log.warning(
                "response %s failed: its record or ledger line could not be written", line.response_id
            )
            waiting.event = failed_instead(waiting.event, write_failure(exc))
            stored = False
        if checkpoint is not None and not await checkpoint():
            return None  # another holder has the connection: nothing more is sent
        self._took("store_write", started)
        self._outbox.written(waiting)
        return stored

    async def bill(
        self, line: UsageEntry, waiting: AwaitingWrite, checkpoint: Checkpoint | None
    ) -> bool | None:
        """Commit a ``store:false`` response's line to the store (``store.ledger: commit``),
        then let its lane's events go (``response.failed`` without usage instead of the
        terminal event if it could not be committed); the line shares its commit with every
        other line of the process waiting at that moment."""
        started = time.perf_counter()
        billed = True
        try:
            await self._store.bill(line)
        except Exception as exc:  # noqa: BLE001 - the writer logged it; the client learns the response failed
            log.warning("response %s failed: its ledger line could not be committed", line.response_id)
            waiting.event = failed_instead(waiting.event, write_failure(exc))
            billed = False
        self._took("ledger_write", started)
        if billed and checkpoint is not None and not await checkpoint():
            return None  # another holder has the connection: nothing more is sent
        self._outbox.written(waiting)
        return billed

    async def checkpointed(self, waiting: AwaitingWrite, checkpoint: Checkpoint) -> bool | None:
        """A ``store:false`` response's terminal event goes once the connection's state is
        written to the cluster store (resume on any node)."""
        started = time.perf_counter()
        if not await checkpoint():
            return None  # another holder has the connection: nothing more is sent
        self._took("state_write", started)
        self._outbox.written(waiting)
        return True

    def _took(self, phase: str, started: float) -> None:
        if self._observe is not None:
            self._observe(self._transport, {phase: (time.perf_counter() - started) * 1000.0})
