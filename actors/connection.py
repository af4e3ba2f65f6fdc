"""The asyncio driver of one connection's :class:`~actors.session.Session`.

It pumps client frames into the session, runs the model calls the session starts through an
:class:`InferenceClient`, and queues encoded server frames for the socket holder, which
drains them in batches (one Ray item carries every frame ready at that moment).  No Ray here:
the actor wraps it, and tests drive it with the real engine in-process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from inference.types import InferenceEvent, InferenceRequest

from .protocol import encode
from .session import Effects, Session, Turn

log = logging.getLogger(__name__)


class InferenceClient(Protocol):
    """The seam to inference: a streaming call returning chunks of events."""

    def stream(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]: ...


class Connection:
    def __init__(self, session: Session, inference: InferenceClient) -> None:
        self.session = session
        self._inference = inference
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True
        self._closed = False

    # -- inbound
    def feed(self, data: str | bytes) -> None:
        """One client frame.  Never raises: bad input becomes an error event."""
        if self._accepting:
            self._apply(self.session.on_frame(data))

    def _apply(self, fx: Effects) -> None:
        for event in fx.events:
            self._out.put_nowait(encode(event))
        for turn in fx.start:
            task = asyncio.get_running_loop().create_task(self._run(turn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, turn: Turn) -> None:
        try:
            async for chunk in self._inference.stream(turn.request):
                self._apply(self.session.on_inference(turn.turn_id, chunk))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as response.failed, text not leaked
            log.warning("inference failed for %s: %r", turn.request.request_id, exc)
            self._apply(self.session.on_inference_error(turn.turn_id, exc))
        else:
            # A stream that ended without Done is a backend fault, not a success.
            self._apply(self.session.on_inference_error(turn.turn_id, RuntimeError("stream ended early")))

    # -- outbound
    async def frames(self) -> AsyncIterator[list[str]]:
        """Batches of encoded frames, in order, until :meth:`close`."""
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
        """Send ``frame`` as the last one and end ``frames`` (e.g. the lifetime limit error)."""
        if self._accepting:
            self._accepting = False
            self._out.put_nowait(frame)
            self._out.put_nowait(None)

    async def close(self) -> None:
        """Cancel every running generation (frees the inference slots) and end ``frames``."""
        if self._closed:
            return
        self._closed = True
        self._accepting = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._out.put_nowait(None)

