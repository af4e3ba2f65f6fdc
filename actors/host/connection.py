"""The asyncio side of one :class:`~actors.core.session.Session`: the
:class:`~actors.core.driver.Port` its :class:`~actors.core.driver.Driver` carries the
session's effects out through.

It feeds client input into the session (through the driver, as every input), runs the
model calls the session starts (:mod:`actors.host.model_calls`), answers the session's
store loads, tokenises large inputs (:mod:`actors.host.render_pool`), writes what the
session asks to persist through a :class:`~store.writer.StoreWriter`, and queues server
events in its :class:`~actors.host.outbox.Outbox` for whoever holds the client (a
WebSocket's :class:`~actors.host.sender.Sender`, an HTTP response), who drains them in
batches, with the figures of its finished responses for their observers
(:mod:`actors.host.figures`).  Its lifecycle is :mod:`actors.host.connection_lifecycle`.

Read-your-writes: a ``store:true`` response's record is written *before* its terminal event
is queued.  Until the write returns, the terminal event — and every later event of the same
lane, such as the next queued response's ``response.created`` — waits; other lanes' events
keep flowing, and the session counts the response in flight until then (``Written``).
Usage exactly once: a ``store:true`` response's ledger line is written in its record's
transaction; a ``store:false`` response's line is appended to the process's ledger journal
(store/journal.py) before its terminal event is queued, and committed write-behind — either
way a client never sees a completion the ledger could lose, and a ``store:false`` turn does
not wait for a commit.  A write that fails turns the terminal event into
``response.failed`` (``server_error``) without usage: the response is not billed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine

from store import StoreWriter

from ..backend import InferenceClient
from ..core.driver import Driver
from ..core.inputs import (
    ClientFrame,
    DrainStarted,
    HistoryLoaded,
    ItemsLoaded,
    ParsedCreate,
    Rendered,
    Written,
)
from ..core.session import Effects, Load, Render, Session
from ..core.timings import PhaseTimer
from ..core.turn import RenderSite
from ..protocol import ResponseCreate, ServerEvent
from .billing import Bill, Billing, billed, failed_instead
from .connection_lifecycle import FRAMES, SERVICE_RESTART, TRANSITIONS, Frames, Move, State, late_answers
from .figures import Figures, Observe
from .model_calls import ModelCalls
from .outbox import Outbox
from .render_pool import RENDER_POOL, RenderPool, tokens_of
from .terminal_writes import Checkpoint, TerminalWrites

log = logging.getLogger(__name__)


class Connection:
    """One client's connection to its session, open until the server ends it or the client
    goes (:class:`State`)."""

    def __init__(
        self,
        session: Session,
        inference: InferenceClient,
        store: StoreWriter,
        observe: Observe | None = None,
        renderer: RenderPool = RENDER_POOL,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """``observe``: where the host records each response's figures
        (:mod:`actors.host.figures`); ``checkpoint`` (resume on any node,
        :mod:`actors.host.continuity`): writes the session's state before a turn's terminal
        event is sent, ``False`` if another holder has the connection (the event is not sent,
        the socket is being closed)."""
        self.session = session
        self._driver = Driver(session, self)
        self._renderer = renderer
        self._store = store
        self._outbox = Outbox()
        self._writes = TerminalWrites(store, self._outbox, session.transport, observe)
        self.figures = Figures(session.transport, observe)  # the sender's figures stage
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls = ModelCalls(inference, renderer, self._driver.drive, self._spawn)
        self.state = State.OPEN
        self.close_code: int | None = None  # of the close the server sends, once it ends the connection
        self.close_reason = ""
        self._checkpoint = checkpoint
        self._on_drained: Callable[[Connection], None] | None = None  # see drain()
        self._drained = False  # idle while draining: ended, or handed to on_drained
        # Answers to client frames read after a drain ended the connection but before its
        # close frame left (server_shutting_down for a create): the sender writes them
        # before the close (take_late_answers).
        self._late: list[ServerEvent] = []

    @property
    def server_ended(self) -> bool:
        """The server, not the client, ended the connection."""
        return self.close_code is not None

    def _move(self, move: Move) -> bool:
        """Take ``move`` if the lifecycle has it from the current state (:data:`TRANSITIONS`);
        ``False``: it does not apply now, and nothing changed."""
        state = TRANSITIONS.get((self.state, move))
        if state is None:
            return False
        self.state = state
        return True

    # -- inbound
    def feed(self, data: str | bytes, received: float | None = None) -> None:
        """One client frame, its first bytes ``received`` at that ``time.perf_counter()``
        if known.  Never raises: bad input becomes an error event, and a bug the input hit
        becomes ``server_error`` (logged, its text not sent).  Read or not as :data:`FRAMES`
        says for the connection's state."""
        if FRAMES[self.state] is not Frames.IGNORED:
            self._driver.drive(ClientFrame(data, received))

    @property
    def has_late(self) -> bool:
        return bool(self._late)

    def take_late_answers(self) -> list[ServerEvent]:
        """The answers to frames read since the drain ended the connection (:meth:`feed`),
        to be written before the close frame; each is taken once."""
        late, self._late = self._late, []
        return late

    def create(self, create: ResponseCreate, timer: PhaseTimer | None = None) -> None:
        """A parsed create (the HTTP path, timed from the request's arrival)."""
        if self.state.accepting:
            self._driver.drive(ParsedCreate(create, timer))

    # -- the driver's port (actors.core.driver.Port)
    def start(self, fx: Effects) -> None:
        """Stop the model calls of ``fx.cancel``, start those of ``fx.start``
        (:class:`~actors.host.model_calls.ModelCalls`)."""
        self._calls.start(fx)

    def carry_out(self, fx: Effects) -> None:
        """Send ``fx``'s events (billed as :mod:`actors.host.billing` says), keep its
        figures for their observers, start its loads and renders; answers to frames read
        after a drain ended the connection wait for the sender (:meth:`take_late_answers`)."""
        if FRAMES[self.state] is Frames.BEFORE_CLOSE:
            late, fx.events = late_answers(fx.events)
            self._late += late
        journaled: list[tuple[str, bool]] = []  # store:false responses billed: (id, line kept)
        for item in billed(
            fx.events,
            fx.usage,
            fx.persist,
            commits_lines=self._store.commits_lines,
            checkpoints=self._checkpoint is not None,
        ):
            if not isinstance(item, Bill):  # Billing.UNBILLED
                self._outbox.send(item)
                continue
            event, how, line = item.event, item.how, item.line
            if how is Billing.JOURNAL or how is Billing.JOURNAL_AND_STATE:
                kept = self._writes.journal(line)
                if not kept or how is Billing.JOURNAL:
                    self._outbox.send(event if kept else failed_instead(event))
                    journaled.append((line.response_id, kept))
                    continue
            waiting = self._outbox.await_write(event)
            if how is Billing.WITH_RECORD:
                assert item.record is not None
                write = self._writes.persist(line, item.record, waiting, self._checkpoint)
            elif how is Billing.COMMIT:
                write = self._writes.bill(line, waiting, self._checkpoint)
            else:  # journaled; sent once the state is written
                assert self._checkpoint is not None
                write = self._writes.checkpointed(waiting, self._checkpoint)
            self._spawn(self._written_after(line.response_id, write))
        if fx.timings:  # recorded, and kept if their client asked (actors.host.figures)
            self.figures.keep(fx.timings)
        for load in fx.load:
            self._spawn(self._load(load))
        for job in fx.render:
            if self._renderer.site is RenderSite.INLINE:  # handled once these effects are carried out
                self._driver.drive(Rendered(job.render_id, tokens_of(job)))
            else:
                self._renderer.track(self._spawn(self._render(job)))
        for response_id, kept in journaled:
            self._driver.drive(Written(response_id, stored=kept))

    def settled(self) -> None:
        if self.state is State.DRAINING and self.session.idle:
            self._drained_now()

    def _drained_now(self) -> None:
        """Draining and idle: end the connection, or tell whoever paces the closes."""
        if self._drained:
            return
        self._drained = True
        if self._on_drained is None:
            self.end(*SERVICE_RESTART)
        else:
            self._on_drained(self)

    def outgoing(self, event: ServerEvent) -> ServerEvent:
        """``event``, about to be encoded and written whole by whoever holds the client (an
        HTTP response's SSE chunk): its figures are taken now (:meth:`Figures.outgoing`)."""
        return self.figures.outgoing(event)

    async def _written_after(self, response_id: str, write: Awaitable[bool | None]) -> None:
        """Once ``write`` returns (and its lane's events have gone), the session counts the
        response as done; ``None``: another holder has the connection, nothing more happens."""
        stored = await write
        if stored is not None:
            self._driver.drive(Written(response_id, stored=stored))

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, load: Load) -> None:
        if load.item_ids:  # the items an input's item_reference names
            try:
                found = await self._store.find_items(load.item_ids, load.owner)
            except Exception:
                log.exception("looking up referenced items in the store failed")
                found = {}
            self._driver.drive(ItemsLoaded(load.load_id, found))
            return
        try:
            record = await self._store.get(load.response_id, load.owner)
        except Exception:
            log.exception("loading %s from the store failed", load.response_id)
            record = None
        self._driver.drive(HistoryLoaded(load.load_id, record))

    async def _render(self, job: Render) -> None:
        self._driver.drive(Rendered(job.render_id, await self._renderer.render(job)))

    # -- outbound
    async def events(self) -> AsyncIterator[list[ServerEvent | str]]:
        """Batches of events (or pre-encoded frames), in order, until the connection ends."""
        async for batch in self._outbox.batches():
            yield batch
            del batch  # not kept while the next is awaited (Outbox.batches)

    def finish_with(self, frame: str) -> None:
        """Send ``frame`` as the last one and end ``events`` (e.g. the lifetime limit error)."""
        if self.state.accepting:
            self._outbox.last(frame)
            self.end(1000)

    def drain(self, on_drained: Callable[[Connection], None] | None = None) -> None:
        """Shutdown: refuse new creates (``server_shutting_down``), let the responses in
        flight finish, then end the connection with :data:`SERVICE_RESTART` (clients
        reconnect, to another replica, and resend what got no terminal event) — or, with
        ``on_drained``, call it once instead when the last response has ended: the caller
        ends the connection when its turn comes (closes in batches, actors.host.drain)."""
        if not self._move(Move.DRAIN):
            return
        self._on_drained = on_drained
        self._driver.drive(DrainStarted())  # ends the connection if the session is idle

    @property
    def drained(self) -> bool:
        """Draining, and its last response has ended."""
        return self._drained

    def end(self, code: int, reason: str = "") -> None:
        """The server ends the connection: ``events`` ends after what is queued (and what
        waits on a store write), and the socket closes with ``code`` and ``reason``."""
        if self._move(Move.END):
            self.close_code = code
            self.close_reason = reason
            self._outbox.last(None)

    async def close(self) -> None:
        """Cancel every running generation (frees the inference slots) and end ``events``;
        events waiting on a store write are dropped (the client is gone).  Store writes carry
        on in the writer, which its owner flushes."""
        if not self._move(Move.CLOSE):
            return
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._outbox.end_now()
