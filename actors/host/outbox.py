"""A connection's outgoing events, in order, for whoever holds the client (a WebSocket, an
HTTP response) to drain in batches.

Read-your-writes: a terminal event that waits on a write (its record, its ledger line, the
connection's state) holds back its lane — it and every later event of that lane — until the
write returns; other lanes' events keep flowing.  A last frame, and the end, go after every
waiting lane.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..protocol import ServerEvent


@dataclass(slots=True)
class AwaitingWrite:
    """A terminal event waiting in its lane until the response's record, ledger line or
    state is written (its owner may swap the event, e.g. for ``response.failed``)."""

    event: ServerEvent
    written: bool = False


class Outbox:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[ServerEvent | str | None] = asyncio.Queue()
        self._waiting_lanes: dict[str | None, deque[ServerEvent | AwaitingWrite]] = {}
        self._last: list[str | None] = []  # queued once no lane waits: a final frame, the end

    def send(self, event: ServerEvent) -> None:
        """Queue ``event``, behind its lane's waiting terminal event if there is one."""
        lane = self._waiting_lanes.get(event.stream_id)
        if lane is None:
            self._queue.put_nowait(event)
        else:
            lane.append(event)

    def await_write(self, event: ServerEvent) -> AwaitingWrite:
        """Hold ``event`` (and its lane's later events) until :meth:`written`."""
        waiting = AwaitingWrite(event)
        self._waiting_lanes.setdefault(event.stream_id, deque()).append(waiting)
        return waiting

    def written(self, waiting: AwaitingWrite) -> None:
        """The write ``waiting`` waited on returned: queue its lane's events up to the first
        write still running."""
        waiting.written = True
        lane = waiting.event.stream_id
        queue = self._waiting_lanes[lane]
        while queue:
            head = queue[0]
            if isinstance(head, AwaitingWrite):
                if not head.written:
                    return
                head = head.event
            self._queue.put_nowait(head)
            queue.popleft()
        del self._waiting_lanes[lane]
        if not self._waiting_lanes:
            for last in self._last:
                self._queue.put_nowait(last)
            self._last.clear()

    def last(self, frame: str | None) -> None:
        """Queue ``frame`` (``None``: the end of :meth:`batches`) after every waiting lane."""
        if self._waiting_lanes:
            self._last.append(frame)
        else:
            self._queue.put_nowait(frame)

    def end_now(self) -> None:
        """End :meth:`batches` after what is queued; what waits on a write is dropped."""
        self._queue.put_nowait(None)

    async def batches(self) -> AsyncIterator[list[ServerEvent | str]]:
        """Batches of events (or pre-encoded frames), in order, until the end.  A batch
        handed out is not kept while the next is awaited: a response's terminal event holds
        the whole response, and a coding agent's next create comes seconds later."""
        while True:
            batch, ended = self._batch(await self._queue.get())
            if batch:
                yield batch
            if ended:
                return
            del batch

    def _batch(self, first: ServerEvent | str | None) -> tuple[list[ServerEvent | str], bool]:
        """``first`` and what is queued behind it; whether the end came with them."""
        if first is None:
            return [], True
        batch = [first]
        while not self._queue.empty():
            nxt = self._queue.get_nowait()
            if nxt is None:
                return batch, True
            batch.append(nxt)
        return batch, False
