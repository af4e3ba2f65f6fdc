"""The asyncio driver of one :class:`~actors.core.session.Session`.

It feeds client input into the session, runs the model calls the session starts through an
:class:`~actors.backend.InferenceClient` (its ``before_call`` hook first), answers the
session's store loads, tokenises large inputs (on a worker thread while the host has other
work in flight, :class:`RenderPool`), writes what the session asks to persist through a
:class:`~store.writer.StoreWriter`, and queues server events for
whoever holds the client (a WebSocket, an HTTP response), who drains them in batches.  No
Ray here.

Read-your-writes: a ``store:true`` response's record is written *before* its terminal event
is queued.  Until the write returns, the terminal event — and every later event of the same
lane, such as the next queued response's ``response.created`` — waits; other lanes' events
keep flowing, and the session counts the response in flight until then (``on_written``).
Usage exactly once: a ``store:true`` response's ledger line is written in its record's
transaction; a ``store:false`` response's line is appended to the process's ledger journal
(store/journal.py) before its terminal event is queued, and committed write-behind — either
way a client never sees a completion the ledger could lose, and a ``store:false`` turn does
not wait for a commit.  A write that fails turns the terminal event into
``response.failed`` (``server_error``) without usage: the response is not billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from inference.types import Done, InferenceRequest
from store import StoredResponse, StoreWriter, UsageEntry

from ..backend import EventStream, InferenceClient, ModelCall
from ..core.inputs import (
    CallsStarted,
    ClientFrame,
    DrainStarted,
    HistoryLoaded,
    InferenceChunk,
    InferenceFailed,
    ItemsLoaded,
    LaneEvicted,
    ParsedCreate,
    Rendered,
    Written,
)
from ..core.render import MarkedTokens, render_marked
from ..core.session import Effects, Load, Render, Session, Turn
from ..core.timings import PhaseTimer, Report
from ..errors import ServerError
from ..protocol import (
    ErrorEvent,
    ResponseCompleted,
    ResponseCreate,
    ResponseErrorBody,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
    error_event,
)
from .billing import Billing, Terminal, billing

log = logging.getLogger(__name__)

# How a drain (shutdown, redeploy, scale-down) ends a connection once its responses have
# finished: RFC 6455's 1012, which clients (the openai SDK among them) take as "reconnect".
SERVICE_RESTART = (1012, "service restart")


class RenderPool:
    """Where a connection tokenises a large input (a :class:`Render` effect): on a worker
    thread while this process's connections have other work in flight, so the loop keeps
    serving them (tiktoken releases the GIL); inline when nothing else runs, as tiktoken is
    slower off the main thread (docs/performance.md).  One per process; its threads (one per
    core, at most four) are made on first use."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor
        self.in_flight = 0  # model calls and renders of this process's connections
        self.streaming = 0  # of those model calls, the ones whose output has begun and not ended

    @property
    def crowded(self) -> bool:
        return self.in_flight > 0

    async def render(self, job: Render) -> MarkedTokens | None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="render")
        return await asyncio.get_running_loop().run_in_executor(self._executor, tokens_of, job)

    def track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        """Count ``task`` as work in flight from now until it is done (or cancelled, even
        before it ran)."""
        self.in_flight += 1
        task.add_done_callback(self._done)
        return task

    def _done(self, _: object) -> None:
        self.in_flight -= 1


def tokens_of(job: Render) -> MarkedTokens | None:
    """A job's input rendered (its token ids and breakpoints); ``None`` (logged) if a bug
    the input hit raised."""
    try:
        return render_marked(job.items, job.fmt)
    except Exception:
        log.exception("rendering an input failed")
        return None


RENDER_POOL = RenderPool()


class State(enum.Enum):
    """Where a connection stands; each method checks it before it moves on."""

    OPEN = "open"  # client input goes to the session
    DRAINING = "draining"  # shutting down: new creates are refused, responses in flight finish
    ENDING = "ending"  # the server ended it: input is ignored, events() ends after what is queued
    CLOSED = "closed"  # the client is gone: generations are cancelled

    @property
    def accepting(self) -> bool:
        return self in (State.OPEN, State.DRAINING)


class Move(enum.Enum):
    """What moves a connection on: :meth:`Connection.drain`, :meth:`Connection.end` (and
    :meth:`Connection.finish_with`), :meth:`Connection.close`."""

    DRAIN = "drain"  # the host is shutting down
    END = "end"  # the server ends the connection
    CLOSE = "close"  # the socket is gone


# Every transition of a connection's lifecycle; a move from a state not listed with it is
# ignored (a drain of a connection the server already ends, a second close…).
TRANSITIONS: dict[tuple[State, Move], State] = {
    (State.OPEN, Move.DRAIN): State.DRAINING,
    (State.OPEN, Move.END): State.ENDING,
    (State.OPEN, Move.CLOSE): State.CLOSED,
    (State.DRAINING, Move.END): State.ENDING,
    (State.DRAINING, Move.CLOSE): State.CLOSED,
    (State.ENDING, Move.CLOSE): State.CLOSED,
}


@dataclass(slots=True)
class _AwaitingWrite:
    """A terminal event waiting in its lane until the response's record, ledger line or state is written."""

    event: ServerEvent
    written: bool = False


class Connection:
    """One client's connection to its session, open until the server ends it or the client
    goes (:class:`State`)."""

    def __init__(
        self,
        session: Session,
        inference: InferenceClient,
        store: StoreWriter,
        observe: Callable[[str, dict[str, float]], None] | None = None,
        renderer: RenderPool = RENDER_POOL,
    ) -> None:
        self.session = session
        self._renderer = renderer
        self._inference = inference
        self._store = store
        self._observe = observe
        self._out: asyncio.Queue[ServerEvent | str | None] = asyncio.Queue()
        self._waiting_lanes: dict[
            str | None, deque[ServerEvent | _AwaitingWrite]
        ] = {}  # lanes waiting on a write
        self._last: list[str | None] = []  # queued once no lane waits: a final frame, the end
        self._reports: dict[str, Report] = {}  # by response id, until its terminal event is sent
        self._tasks: set[asyncio.Task[None]] = set()
        self._generations: dict[int, asyncio.Task[None]] = {}
        self.state = State.OPEN
        self.close_code: int | None = None  # of the close the server sends, once it ends the connection
        self.close_reason = ""
        # Resume on any node (actors.host.continuity): writes the session's state before a
        # turn's terminal event is sent; ``False``: another holder has the connection, and
        # the event is not sent (the socket is being closed).
        self.checkpoint: Callable[[], Awaitable[bool]] | None = None
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
        becomes ``server_error`` (logged, its text not sent)."""
        if self.state.accepting:
            try:
                fx = self.session.handle(ClientFrame(data, received))
            except Exception:
                log.exception("unexpected error handling a client frame")
                fx = Effects(events=[error_event(ServerError())])
            self._apply(fx)
        elif self.state is State.ENDING and self.session.draining:
            # The drain ended the connection; its close frame has not left, so the client
            # sent this without knowing: a create is answered (server_shutting_down), not
            # dropped.  Only error events: nothing else runs now.
            try:
                fx = self.session.handle(ClientFrame(data, received))
            except Exception:
                log.exception("unexpected error handling a client frame")
                fx = Effects(events=[error_event(ServerError())])
            self._late.extend(e for e in fx.events if isinstance(e, ErrorEvent))

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
            self._apply(self.session.handle(ParsedCreate(create, timer)))

    def _apply(self, fx: Effects) -> None:
        for turn_id in fx.cancel:  # the response is over; stop its generation
            task = self._generations.pop(turn_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        # Model calls first; then the session builds the started turns' responses and their
        # response.created (CallsStarted), and this batch's events are queued, encoded and
        # written.  A call starts here, not when its task first runs, unless a hook runs
        # before it (then in its task, after the hook): over a direct channel its request
        # has left by then.
        opening = fx.opening
        for turn in fx.start:
            stream = self._started(turn.request) if self._inference.before_call is None else None
            task = self._renderer.track(self._spawn(self._run(turn, stream)))
            self._generations[turn.turn_id] = task
            if stream is not None:
                task.add_done_callback(functools.partial(self._close_unread, stream))
        if opening:
            fx.events += self.session.handle(CallsStarted(opening)).events
        carry_evictions(fx)
        records = {record.id: record for record in fx.persist}
        lines = {entry.response_id: entry for entry in fx.usage}
        journaled: list[tuple[str, bool]] = []  # store:false responses billed: (id, line kept)
        for event in fx.events:
            line = lines.pop(event.response.id, None) if isinstance(event, _TERMINAL) else None
            record = records.pop(line.response_id, None) if line is not None else None
            how = billing(
                Terminal(
                    line is not None,
                    record is not None,
                    self._store.commits_lines,
                    self.checkpoint is not None,
                )
            )
            if line is None:  # Billing.UNBILLED
                self._send(event)
                continue
            if how is Billing.JOURNAL or how is Billing.JOURNAL_AND_STATE:
                kept = self._journal(line)
                if not kept or how is Billing.JOURNAL:
                    self._send(event if kept else failed_instead(event))
                    journaled.append((line.response_id, kept))
                    continue
            waiting = _AwaitingWrite(event)
            self._waiting_lanes.setdefault(event.stream_id, deque()).append(waiting)
            if how is Billing.WITH_RECORD:
                assert record is not None
                self._spawn(self._persist(line, record, waiting))
            elif how is Billing.COMMIT:
                self._spawn(self._bill(line, waiting))
            else:  # journaled; sent once the state is written
                self._spawn(self._checkpointed(line.response_id, waiting))
        assert not records and not lines, "a record and a ledger line come with their terminal event"
        for report in fx.timings:  # taken again, and recorded, as the sender encodes the event
            self._reports[report.response_id] = report
        for load in fx.load:
            self._spawn(self._load(load))
        for job in fx.render:
            if self._renderer.crowded:
                self._renderer.track(self._spawn(self._render(job)))
            else:
                self._apply(self.session.handle(Rendered(job.render_id, tokens_of(job))))
        for response_id, kept in journaled:
            self._apply(self.session.handle(Written(response_id, stored=kept)))
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

    def _journal(self, line: UsageEntry) -> bool:
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

    def outgoing(self, event: ServerEvent) -> ServerEvent:
        """``event``, about to be encoded and written by the sender: a terminal event's
        figures are taken again now (:meth:`restamp`), so the server's ``api_overhead`` holds
        everything before this frame."""
        report = self.figures_to_restamp(event, always=True)
        if report is not None:
            self.restamp(report)
        return event

    def figures_to_restamp(self, event: ServerEvent, *, always: bool = False) -> Report | None:
        """The figures of a terminal event about to be sent, if its frame carries figures
        that may still change (or, ``always``, any it has): the sender takes them
        (:meth:`restamp`) once it has encoded and written the rest of the frame."""
        if not isinstance(event, _TERMINAL):
            return None
        report = self._reports.get(event.response.id)
        if report is None or not (always or (report.into is not None and not report.final)):
            return None
        return self._reports.pop(event.response.id)

    def restamp(self, report: Report) -> dict[str, float]:
        """The response's figures taken again now (:meth:`actors.core.timings.Report.restamp`),
        and recorded once the sender has written its frame (a dozen histograms are not
        the client's wait)."""
        ms = report.restamp()
        if self._observe is not None:
            asyncio.get_running_loop().call_soon(self._observe, self.session.transport, ms)
        return ms

    def _send(self, event: ServerEvent) -> None:
        lane = self._waiting_lanes.get(event.stream_id)
        if lane is None:
            self._out.put_nowait(event)
        else:
            lane.append(event)

    async def _persist(self, line: UsageEntry, record: StoredResponse, waiting: _AwaitingWrite) -> None:
        """Write the record with its ledger line, then let its lane's events go
        (``response.failed`` without usage instead of the terminal event if the write
        failed); only then does the session count the response as done, so what starts next
        is sent after it."""
        started = time.perf_counter()
        stored = True
        try:
            await self._store.put(record, line)
        except Exception:  # noqa: BLE001 - the writer logged it; the client learns the response failed
            log.warning(
                "response %s failed: its record or ledger line could not be written", line.response_id
            )
            waiting.event = failed_instead(waiting.event)
            stored = False
        if self.checkpoint is not None and not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        waiting.written = True
        if self._observe is not None:
            self._observe(self.session.transport, {"store_write": (time.perf_counter() - started) * 1000.0})
        self._flush_lane(waiting.event.stream_id)
        self._apply(self.session.handle(Written(line.response_id, stored=stored)))

    async def _bill(self, line: UsageEntry, waiting: _AwaitingWrite) -> None:
        """Commit a ``store:false`` response's line to the store (``store.ledger: commit``),
        then let its lane's events go (``response.failed`` without usage instead of the
        terminal event if it could not be committed); the line shares its commit with every
        other line of the process waiting at that moment."""
        started = time.perf_counter()
        billed = True
        try:
            await self._store.bill(line)
        except Exception:  # noqa: BLE001 - the writer logged it; the client learns the response failed
            log.warning("response %s failed: its ledger line could not be committed", line.response_id)
            waiting.event = failed_instead(waiting.event)
            billed = False
        if self._observe is not None:
            self._observe(self.session.transport, {"ledger_write": (time.perf_counter() - started) * 1000.0})
        if billed and self.checkpoint is not None and not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        waiting.written = True
        self._flush_lane(waiting.event.stream_id)
        self._apply(self.session.handle(Written(line.response_id, stored=billed)))

    async def _checkpointed(self, response_id: str, waiting: _AwaitingWrite) -> None:
        """A ``store:false`` response's terminal event goes once the connection's state is
        written to the cluster store (resume on any node)."""
        assert self.checkpoint is not None
        started = time.perf_counter()
        if not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        waiting.written = True
        if self._observe is not None:
            self._observe(self.session.transport, {"state_write": (time.perf_counter() - started) * 1000.0})
        self._flush_lane(waiting.event.stream_id)
        self._apply(self.session.handle(Written(response_id, stored=True)))

    def _flush_lane(self, lane: str | None) -> None:
        """Queue the lane's waiting events up to the first write still running."""
        waiting = self._waiting_lanes[lane]
        while waiting:
            head = waiting[0]
            if isinstance(head, _AwaitingWrite):
                if not head.written:
                    return
                head = head.event
            self._out.put_nowait(head)
            waiting.popleft()
        del self._waiting_lanes[lane]
        if not self._waiting_lanes:
            for last in self._last:
                self._out.put_nowait(last)
            self._last.clear()

    def _queue_last(self, frame: str | None) -> None:
        """Queue ``frame`` (``None``: the end of ``events``) after every waiting lane."""
        if self._waiting_lanes:
            self._last.append(frame)
        else:
            self._out.put_nowait(frame)

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
            self._apply(self.session.handle(ItemsLoaded(load.load_id, found)))
            return
        try:
            record = await self._store.get(load.response_id, load.owner)
        except Exception:
            log.exception("loading %s from the store failed", load.response_id)
            record = None
        self._apply(self.session.handle(HistoryLoaded(load.load_id, record)))

    async def _render(self, job: Render) -> None:
        self._apply(self.session.handle(Rendered(job.render_id, await self._renderer.render(job))))

    def _started(self, request: InferenceRequest) -> EventStream | None:
        try:
            return self._inference.stream(request)
        except Exception:  # noqa: BLE001 - not started: the task makes the call, and reports what it raises
            return None

    def _close_unread(self, stream: EventStream, task: asyncio.Task[None]) -> None:
        """A call started for a task cancelled before it ran (which would have closed it) is
        closed here; closing a call twice is harmless."""
        if task.cancelled():
            self._spawn(_close(stream))

    async def _run(self, turn: Turn, started: EventStream | None = None) -> None:
        me = asyncio.current_task()
        request = turn.request
        finished = streaming = False
        try:
            if self._inference.before_call is not None:  # then nothing started the call yet
                await self._inference.before_call(ModelCall.of(turn))
            call = started if started is not None else self._inference.stream(request)
            async with contextlib.aclosing(call) as stream:
                async for chunk in stream:
                    if not streaming:
                        streaming = True
                        self._renderer.streaming += 1
                    if any(isinstance(ev, Done) for ev in chunk):
                        finished = True
                        if self._renderer.streaming > 1:
                            # Other responses of this process are streaming: their tokens
                            # due now go out before this one's end (its terminal event,
                            # its record); a lone response, or one whose neighbours are
                            # still in prefill or rendering, does not wait.
                            await asyncio.sleep(0)
                    self._apply(self.session.handle(InferenceChunk(turn.turn_id, chunk)))
                    if self._generations.get(turn.turn_id) is not me:
                        return  # cut short (e.g. the output classifier): closing cancels the call
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as response.failed, text not leaked
            log.warning("inference failed for %s: %r", request.request_id, exc)
            self._apply(self.session.handle(InferenceFailed(turn.turn_id, exc)))
        else:
            if not finished:  # a stream that ended without Done is a backend fault
                self._apply(
                    self.session.handle(InferenceFailed(turn.turn_id, RuntimeError("stream ended early")))
                )
        finally:
            if streaming:
                self._renderer.streaming -= 1
            if self._generations.get(turn.turn_id) is me:
                del self._generations[turn.turn_id]

    # -- outbound
    async def events(self) -> AsyncIterator[list[ServerEvent | str]]:
        """Batches of events (or pre-encoded frames), in order, until the connection ends."""
        while True:
            first = await self._out.get()
            if first is None:
                return
            batch = [first]
            while not self._out.empty():
                nxt = self._out.get_nowait()
                if nxt is None:
                    yield batch
                    return
                batch.append(nxt)
            yield batch

    def finish_with(self, frame: str) -> None:
        """Send ``frame`` as the last one and end ``events`` (e.g. the lifetime limit error)."""
        if self.state.accepting:
            self._queue_last(frame)
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
        self._apply(self.session.handle(DrainStarted()))  # ends the connection if the session is idle

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
            self._queue_last(None)

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
        self._out.put_nowait(None)


_TERMINAL = (ResponseCompleted, ResponseIncomplete, ResponseFailed)  # the events a ledger line goes with


def carry_evictions(fx: Effects) -> None:
    """Hand each session whose lane the host's cache budget took for this one its
    :class:`~actors.core.inputs.LaneEvicted` (it answers with nothing to do)."""
    for eviction in fx.evict:
        eviction.session.handle(LaneEvicted(eviction.lane, eviction.response_id))


async def _close(stream: EventStream) -> None:
    await stream.aclose()


def failed_instead(event: ServerEvent) -> ResponseFailed:
    """``response.failed`` without usage (not billed) in place of a terminal event whose
    record or ledger line could not be written: same sequence number, the output as
    generated; ``server_error`` unless the response had failed already."""
    assert isinstance(event, _TERMINAL)
    error = event.response.error if isinstance(event, ResponseFailed) else None
    response = event.response.model_copy(
        update={
            "status": "failed",
            "completed_at": None,
            "incomplete_details": None,
            "usage": None,
            "error": error or ResponseErrorBody(code=ServerError.code, message=ServerError().message),
        }
    )
    return ResponseFailed(sequence_number=event.sequence_number, response=response, stream_id=event.stream_id)
