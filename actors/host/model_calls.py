"""A connection's model calls: one task each, started as the session asks (its ``start``
effects) through the connection's :class:`~actors.backend.InferenceClient` (its
``before_call`` hook first), stopped when a response is over (``cancel``); each chunk of a
call goes back to the session as :class:`~actors.core.inputs.InferenceChunk`, a call that
fails as :class:`~actors.core.inputs.InferenceFailed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine

from inference.types import Done, InferenceRequest

from ..backend import EventStream, InferenceClient, ModelCall
from ..core.inputs import InferenceChunk, InferenceFailed, Input
from ..core.session import Effects, Turn
from .render_pool import RenderPool

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[object, object, None]], "asyncio.Task[None]"]


class ModelCalls:
    """The running model calls of one connection, by turn; ``drive`` hands the session its
    inputs (the connection's :class:`~actors.core.driver.Driver`), ``spawn`` runs a task the
    connection cancels when it closes."""

    def __init__(
        self, inference: InferenceClient, renderer: RenderPool, drive: Callable[[Input], None], spawn: Spawn
    ) -> None:
        self._inference = inference
        self._renderer = renderer
        self._drive = drive
        self._spawn = spawn
        self._generations: dict[int, asyncio.Task[None]] = {}

    def start(self, fx: Effects) -> None:
        """Stop the model calls of ``fx.cancel``, start those of ``fx.start``."""
        for turn_id in fx.cancel:  # the response is over; stop its generation
            task = self._generations.pop(turn_id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        # Model calls first; then the session builds the started turns' responses and their
        # response.created (the driver hands it CallsStarted), and this batch's events are
        # queued, encoded and written.  A call starts here, not when its task first runs,
        # unless a hook runs before it (then in its task, after the hook): over a direct
        # channel its request has left by then.
        for turn in fx.start:
            stream = self._started(turn.request) if self._inference.before_call is None else None
            task = self._renderer.track(self._spawn(self._run(turn, stream)))
            self._generations[turn.turn_id] = task
            if stream is not None:
                task.add_done_callback(functools.partial(self._close_if_cancelled, stream))

    def _started(self, request: InferenceRequest) -> EventStream | None:
        try:
            return self._inference.stream(request)
        except Exception:  # noqa: BLE001 - not started: the task makes the call, and reports what it raises
            return None

    def _close_if_cancelled(self, stream: EventStream, task: asyncio.Task[None]) -> None:
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
                    self._drive(InferenceChunk(turn.turn_id, chunk))
                    if self._generations.get(turn.turn_id) is not me:
                        return  # cut short (e.g. the output classifier): closing cancels the call
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as response.failed, text not leaked
            log.warning("inference failed for %s: %r", request.request_id, exc)
            self._drive(InferenceFailed(turn.turn_id, exc))
        else:
            if not finished:  # a stream that ended without Done is a backend fault
                self._drive(InferenceFailed(turn.turn_id, RuntimeError("stream ended early")))
        finally:
            if streaming:
                self._renderer.streaming -= 1
            if self._generations.get(turn.turn_id) is me:
                del self._generations[turn.turn_id]


async def _close(stream: EventStream) -> None:
    await stream.aclose()
