"""The asyncio driver of one :class:`~actors.session.Session`.

It feeds client input into the session, runs the model calls the session starts through an
:class:`InferenceClient`, answers the session's store loads, hands post-inference writes
(stored responses, ledger lines) to a write-behind :class:`~store.writer.StoreWriter`
so they stay off the response's critical path, and queues server events for whoever holds
the client (a WebSocket, an HTTP response), who drains them in batches.  No Ray here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from inference.types import Done, InferenceEvent, InferenceRequest

from ..errors import ServerError
from ..protocol import ResponseCreate, ServerEvent, error_event
from ..session import Effects, Load, Session, Turn
from store import StoreWriter
from ..timings import PhaseTimer

log = logging.getLogger(__name__)


class InferenceClient(Protocol):
    """The seam to inference: a streaming call returning chunks of events."""

    def stream(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]: ...


class Connection:
    def __init__(self, session: Session, inference: InferenceClient, store: StoreWriter,
                 observe: Callable[[str, dict[str, float]], None] | None = None) -> None:
        self.session = session
        self._inference = inference
        self._store = store
        self._observe = observe
        self._out: asyncio.Queue[ServerEvent | str | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._generations: dict[int, asyncio.Task[None]] = {}
        self._accepting = True
        self._closed = False
        self.server_ended = False  # the server, not the client, ended the connection
        self.close_code = 1000  # of the close the server sends when it ends the connection

    # -- inbound
    def feed(self, data: str | bytes) -> None:
        """One client frame.  Never raises: bad input becomes an error event, and a bug
        the input hit becomes ``server_error`` (logged, its text not sent)."""
        if self._accepting:
            try:
                fx = self.session.on_frame(data)
            except Exception:  # noqa: BLE001 - the socket must stay usable
                log.exception("unexpected error handling a client frame")
                fx = Effects(events=[error_event(ServerError())])
            self._apply(fx)

    def create(self, create: ResponseCreate, timer: PhaseTimer | None = None) -> None:
        """A parsed create (the HTTP path, timed from the request's arrival)."""
        if self._accepting:
            self._apply(self.session.on_create(create, timer))

    def _apply(self, fx: Effects) -> None:
        for event in fx.events:
            self._out.put_nowait(event)
        for record in fx.persist:
            self._store.submit_put(record)
        for entry in fx.usage:
            self._store.submit_usage(entry)
        for turn_id in fx.cancel:  # the response is over; stop its generation
            task = self._generations.pop(turn_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self._observe is not None:
            for report in fx.timings:
                self._observe(self.session.transport, report)
        for turn in fx.start:
            self._generations[turn.turn_id] = self._spawn(self._run(turn))
        for load in fx.load:
            self._spawn(self._load(load))
        if self.session.draining and self.session.idle:
            self.end(1001)

    def _spawn(self, coro) -> asyncio.Task[None]:  # noqa: ANN001
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, load: Load) -> None:
        try:
            record = await self._store.get(load.response_id, load.owner)
        except Exception:  # noqa: BLE001 - an unreachable store reads as "not found", logged
            log.exception("loading %s from the store failed", load.response_id)
            record = None
        self._apply(self.session.on_loaded(load.load_id, record))

    async def _run(self, turn: Turn) -> None:
        me = asyncio.current_task()
        request = turn.request
        finished = False
        try:
            async with contextlib.aclosing(self._inference.stream(request)) as stream:
                async for chunk in stream:
                    finished = finished or any(isinstance(ev, Done) for ev in chunk)
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
        if self._accepting:
            self._out.put_nowait(frame)
            self.end(1000)

    def drain(self) -> None:
        """Shutdown: refuse new creates (``server_shutting_down``), let the responses in
        flight finish, then end the connection with 1001 (clients reconnect elsewhere)."""
        self.session.draining = True
        if self.session.idle:
            self.end(1001)

    def end(self, code: int) -> None:
        """The server ends the connection: ``events`` ends after what is queued, and the
        socket closes with ``code``."""
        if self._accepting:
            self._accepting = False
            self.server_ended = True
            self.close_code = code
            self._out.put_nowait(None)

    async def close(self) -> None:
        """Cancel every running generation (frees the inference slots) and end ``events``.
        Pending store writes stay queued in the writer, which its owner flushes."""
        if self._closed:
            return
        self._closed = True
        self._accepting = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._out.put_nowait(None)
