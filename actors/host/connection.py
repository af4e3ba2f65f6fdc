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
from ..core.render import Rendered, render_marked
from ..core.request_queue import InvalidTransition
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

    async def render(self, job: Render) -> Rendered | None:
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


def tokens_of(job: Render) -> Rendered | None:
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


_NEXT: dict[State, frozenset[State]] = {
    State.OPEN: frozenset({State.DRAINING, State.ENDING, State.CLOSED}),
    State.DRAINING: frozenset({State.ENDING, State.CLOSED}),
    State.ENDING: frozenset({State.CLOSED}),
    State.CLOSED: frozenset(),
}


@dataclass(slots=True)
class _Stored:
    """A terminal event held in its lane until the response's record is written."""

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
        self._held: dict[str | None, deque[ServerEvent | _Stored]] = {}  # lanes waiting on a write
        self._last: list[str | None] = []  # queued once no lane is held: a final frame, the end
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
        # before the close (take_late).
        self._late: list[ServerEvent] = []

    @property
    def server_ended(self) -> bool:
        """The server, not the client, ended the connection."""
        return self.close_code is not None

    def _move(self, state: State) -> None:
        if state not in _NEXT[self.state]:
            raise InvalidTransition(f"connection: {self.state.value} -> {state.value}")
        self.state = state

    # -- inbound
    def feed(self, data: str | bytes, received: float | None = None) -> None:
        """One client frame, its first bytes ``received`` at that ``time.perf_counter()``
        if known.  Never raises: bad input becomes an error event, and a bug the input hit
        becomes ``server_error`` (logged, its text not sent)."""
        if self.state.accepting:
            try:
                fx = self.session.on_frame(data, received)
            except Exception:
                log.exception("unexpected error handling a client frame")
                fx = Effects(events=[error_event(ServerError())])
            self._apply(fx)
        elif self.state is State.ENDING and self.session.draining:
            # The drain ended the connection; its close frame has not left, so the client
            # sent this without knowing: a create is answered (server_shutting_down), not
            # dropped.  Only error events: nothing else runs now.
            try:
                fx = self.session.on_frame(data, received)
            except Exception:
                log.exception("unexpected error handling a client frame")
                fx = Effects(events=[error_event(ServerError())])
            self._late.extend(e for e in fx.events if isinstance(e, ErrorEvent))

    @property
    def has_late(self) -> bool:
        return bool(self._late)

    def take_late(self) -> list[ServerEvent]:
        """The answers to frames read since the drain ended the connection (:meth:`feed`),
        to be written before the close frame; each is taken once."""
        late, self._late = self._late, []
        return late

    def create(self, create: ResponseCreate, timer: PhaseTimer | None = None) -> None:
        """A parsed create (the HTTP path, timed from the request's arrival)."""
        if self.state.accepting:
            self._apply(self.session.on_create(create, timer))

    def _apply(self, fx: Effects) -> None:
        for turn_id in fx.cancel:  # the response is over; stop its generation
            task = self._generations.pop(turn_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        # Model calls first, before this batch's events are read (a started turn's response
        # and its response.created are built on that read, Effects) and then queued,
        # encoded and written.  A call starts here, not when its task first runs, unless a
        # hook runs before it (then in its task, after the hook): over a direct channel its
        # request has left by then.
        for turn in fx.start:
            stream = self._started(turn.request) if self._inference.before_call is None else None
            task = self._renderer.track(self._spawn(self._run(turn, stream)))
            self._generations[turn.turn_id] = task
            if stream is not None:
                task.add_done_callback(functools.partial(self._unread, stream))
        records = {record.id: record for record in fx.persist}
        lines = {entry.response_id: entry for entry in fx.usage}
        journaled: list[tuple[str, bool]] = []  # store:false responses billed: (id, line kept)
        for event in fx.events:
            line = lines.pop(event.response.id, None) if isinstance(event, _TERMINAL) else None
            record = records.pop(line.response_id, None) if line is not None else None
            if line is None:
                self._send(event)
            elif record is None and self._store.commits_lines:
                held = _Stored(event)
                self._held.setdefault(event.stream_id, deque()).append(held)
                self._spawn(self._bill(line, held))
            elif record is None:
                kept = self._journal(line)
                if kept and self.checkpoint is not None:  # sent once the state is written
                    held = _Stored(event)
                    self._held.setdefault(event.stream_id, deque()).append(held)
                    self._spawn(self._checkpointed(line.response_id, held))
                    continue
                self._send(event if kept else failed_instead(event))
                journaled.append((line.response_id, kept))
            else:
                held = _Stored(event)
                self._held.setdefault(event.stream_id, deque()).append(held)
                self._spawn(self._persist(line, record, held))
        assert not records and not lines, "a record and a ledger line come with their terminal event"
        for report in fx.timings:  # taken again, and recorded, as the sender encodes the event
            self._reports[report.response_id] = report
        for load in fx.load:
            self._spawn(self._load(load))
        for job in fx.render:
            if self._renderer.crowded:
                self._renderer.track(self._spawn(self._render(job)))
            else:
                self._apply(self.session.on_rendered(job.render_id, tokens_of(job)))
        for response_id, kept in journaled:
            self._apply(self.session.on_written(response_id, stored=kept))
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
        figures are taken again now (:meth:`taken`), so the server's ``api_overhead`` holds
        everything before this frame."""
        report = self.deferred(event, always=True)
        if report is not None:
            self.taken(report)
        return event

    def deferred(self, event: ServerEvent, *, always: bool = False) -> Report | None:
        """The figures of a terminal event about to be sent, if its frame carries figures
        that may still change (or, ``always``, any it has): the sender takes them
        (:meth:`taken`) once it has encoded and written the rest of the frame."""
        if not isinstance(event, _TERMINAL):
            return None
        report = self._reports.get(event.response.id)
        if report is None or not (always or (report.into is not None and not report.final)):
            return None
        return self._reports.pop(event.response.id)

    def taken(self, report: Report) -> dict[str, float]:
        """The response's figures taken again now (:meth:`actors.core.timings.Report.restamp`),
        and recorded once the sender has written its frame (a dozen histograms are not
        the client's wait)."""
        ms = report.restamp()
        if self._observe is not None:
            asyncio.get_running_loop().call_soon(self._observe, self.session.transport, ms)
        return ms

    def _send(self, event: ServerEvent) -> None:
        held = self._held.get(event.stream_id)
        if held is None:
            self._out.put_nowait(event)
        else:
            held.append(event)

    async def _persist(self, line: UsageEntry, record: StoredResponse, held: _Stored) -> None:
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
            held.event = failed_instead(held.event)
            stored = False
        if self.checkpoint is not None and not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        held.written = True
        if self._observe is not None:
            self._observe(self.session.transport, {"store_write": (time.perf_counter() - started) * 1000.0})
        self._release(held.event.stream_id)
        self._apply(self.session.on_written(line.response_id, stored=stored))

    async def _bill(self, line: UsageEntry, held: _Stored) -> None:
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
            held.event = failed_instead(held.event)
            billed = False
        if self._observe is not None:
            self._observe(self.session.transport, {"ledger_write": (time.perf_counter() - started) * 1000.0})
        if billed and self.checkpoint is not None and not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        held.written = True
        self._release(held.event.stream_id)
        self._apply(self.session.on_written(line.response_id, stored=billed))

    async def _checkpointed(self, response_id: str, held: _Stored) -> None:
        """A ``store:false`` response's terminal event goes once the connection's state is
        written to the cluster store (resume on any node)."""
        assert self.checkpoint is not None
        started = time.perf_counter()
        if not await self.checkpoint():
            return  # another holder has the connection: nothing more is sent
        held.written = True
        if self._observe is not None:
            self._observe(self.session.transport, {"state_write": (time.perf_counter() - started) * 1000.0})
        self._release(held.event.stream_id)
        self._apply(self.session.on_written(response_id, stored=True))

    def _release(self, lane: str | None) -> None:
        """Queue the lane's held events up to the first write still running."""
        held = self._held[lane]
        while held:
            head = held[0]
            if isinstance(head, _Stored):
                if not head.written:
                    return
                head = head.event
            self._out.put_nowait(head)
            held.popleft()
        del self._held[lane]
        if not self._held:
            for last in self._last:
                self._out.put_nowait(last)
            self._last.clear()

    def _queue_last(self, frame: str | None) -> None:
        """Queue ``frame`` (``None``: the end of ``events``) after every held lane."""
        if self._held:
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
            self._apply(self.session.on_items_loaded(load.load_id, found))
            return
        try:
            record = await self._store.get(load.response_id, load.owner)
        except Exception:
            log.exception("loading %s from the store failed", load.response_id)
            record = None
        self._apply(self.session.on_loaded(load.load_id, record))

    async def _render(self, job: Render) -> None:
        self._apply(self.session.on_rendered(job.render_id, await self._renderer.render(job)))

    def _started(self, request: InferenceRequest) -> EventStream | None:
        try:
            return self._inference.stream(request)
        except Exception:  # noqa: BLE001 - not started: the task makes the call, and reports what it raises
            return None

    def _unread(self, stream: EventStream, task: asyncio.Task[None]) -> None:
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
                    self._apply(self.session.on_inference(turn.turn_id, chunk))
                    if self._generations.get(turn.turn_id) is not me:
                        return  # cut short (e.g. the output classifier): closing cancels the call
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as response.failed, text not leaked
            log.warning("inference failed for %s: %r", request.request_id, exc)
            self._apply(self.session.on_inference_error(turn.turn_id, exc))
        else:
            if not finished:  # a stream that ended without Done is a backend fault
                self._apply(self.session.on_inference_error(turn.turn_id, RuntimeError("stream ended early")))
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
        if self.state is not State.OPEN:
            return
        self._move(State.DRAINING)
        self._on_drained = on_drained
        self._apply(self.session.begin_drain())  # ends the connection if the session is idle

    @property
    def drained(self) -> bool:
        """Draining, and its last response has ended."""
        return self._drained

    def end(self, code: int, reason: str = "") -> None:
        """The server ends the connection: ``events`` ends after what is queued (and what
        waits on a store write), and the socket closes with ``code`` and ``reason``."""
        if self.state.accepting:
            self._move(State.ENDING)
            self.close_code = code
            self.close_reason = reason
            self._queue_last(None)

    async def close(self) -> None:
        """Cancel every running generation (frees the inference slots) and end ``events``;
        events held for a store write are dropped (the client is gone).  Store writes carry
        on in the writer, which its owner flushes."""
        if self.state is State.CLOSED:
            return
        self._move(State.CLOSED)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._out.put_nowait(None)


_TERMINAL = (ResponseCompleted, ResponseIncomplete, ResponseFailed)  # the events a ledger line goes with


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
