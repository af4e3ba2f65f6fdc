"""A connection's requests and the stage each has reached (docs/protocol.md §4).

A create is *queued* until its lane is idle and a slot is free; it may then wait for its
parent from the store (*loading*) and for its input's tokens (*rendering*); it *runs* from
its ``response.created`` while its model call streams; a stored response is *finishing*
while its terminal event waits for the record's write.  A request leaves the table when it
is refused or done.  Every stage but *queued* counts against ``max_inflight``; a lane is
busy while one of its requests loads, renders or runs.  The session owns the table; pure.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass

from ..protocol import InputItem, ResponseCreate
from ..protocol.wire_types import JSONObject
from .context import ContextEntry
from .timings import PhaseTimer
from .turn import Turn


class Stage(enum.Enum):
    QUEUED = "queued"
    LOADING = "loading"  # its previous_response_id is read from the store
    RENDERING = "rendering"  # its input is tokenised off the event loop
    RUNNING = "running"  # response.created is out; the model call streams (or waits, append mode)
    FINISHING = "finishing"  # the terminal event waits for the response's record to be written

    @property
    def in_flight(self) -> bool:
        """Counts against the connection's ``max_inflight``."""
        return self is not Stage.QUEUED

    @property
    def holds_lane(self) -> bool:
        """The lane's next request waits (a finishing one's events wait in the driver instead)."""
        return self in (Stage.LOADING, Stage.RENDERING, Stage.RUNNING)


_NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.QUEUED: frozenset({Stage.LOADING, Stage.RENDERING, Stage.RUNNING}),
    Stage.LOADING: frozenset({Stage.RENDERING, Stage.RUNNING}),
    Stage.RENDERING: frozenset({Stage.RUNNING}),
    Stage.RUNNING: frozenset({Stage.FINISHING}),
    Stage.FINISHING: frozenset(),
}


class InvalidTransition(RuntimeError):
    """A request was moved to a stage that cannot follow its current one (a bug)."""


@dataclass(frozen=True, slots=True)
class Checked:
    """A request's input once its history is known and its function call outputs check out."""

    parent: ContextEntry | None
    items: list[InputItem]
    same_lane: bool  # the parent is the lane's latest response (a failure evicts it)
    call_ids: frozenset[str]
    tool_results: int


@dataclass(slots=True, eq=False)
class Request:
    id: int  # also the id of its Load, Render and Turn
    lane: str | None
    create: ResponseCreate
    timer: PhaseTimer
    stage: Stage = Stage.QUEUED
    asked: float = 0.0  # when the wait of this stage (a load, a render) began
    checked: Checked | None = None  # from rendering on
    # While its input's item references are looked up in the store (loading): the parent,
    # whether it is the lane's latest, the steer input that goes first, the items found so far.
    resolving: tuple[ContextEntry | None, bool, list[InputItem], dict[str, JSONObject]] | None = None
    turn: Turn | None = None  # from running on
    # The lane's entry this response replaced when it finished: put back if its write fails,
    # so that the same request sent again continues from where it did.
    replaced: ContextEntry | None = None


class Requests:
    """The requests of one connection: queued ones in the order they may start (an automatic
    successor goes first), and each request's stage, changed only through :meth:`move`."""

    def __init__(self) -> None:
        self._all: dict[int, Request] = {}
        self._queue: deque[Request] = deque()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._all)

    @property
    def in_flight(self) -> int:
        return len(self._all) - len(self._queue)

    def add(
        self, lane: str | None, create: ResponseCreate, timer: PhaseTimer, *, first: bool = False
    ) -> Request:
        request = Request(next(self._ids), lane, create, timer)
        timer.queued()
        self._all[request.id] = request
        if first:
            self._queue.appendleft(request)
        else:
            self._queue.append(request)
        return request

    def next_to_start(self, max_inflight: int) -> Request | None:
        """The oldest queued request whose lane is idle, if a slot is free."""
        if self.in_flight >= max_inflight:
            return None
        busy = {r.lane for r in self._all.values() if r.stage.holds_lane}
        return next((r for r in self._queue if r.lane not in busy), None)

    def move(self, request: Request, stage: Stage) -> None:
        if stage not in _NEXT[request.stage]:
            raise InvalidTransition(f"request {request.id}: {request.stage.value} -> {stage.value}")
        if request.stage is Stage.QUEUED:
            self._queue.remove(request)
        request.stage = stage

    def drop(self, request: Request) -> None:
        """``request`` is refused or done."""
        if self._all.pop(request.id, None) is not None and request.stage is Stage.QUEUED:
            self._queue.remove(request)

    def clear(self) -> None:
        self._all.clear()
        self._queue.clear()

    def at(self, request_id: int, stage: Stage) -> Request | None:
        """Request ``request_id`` if it is at ``stage`` (else it was dropped, or moved on)."""
        request = self._all.get(request_id)
        return request if request is not None and request.stage is stage else None

    def responding(self, response_id: object, stage: Stage) -> Request | None:
        """The request at ``stage`` whose response is ``response_id``."""
        return next(
            (
                r
                for r in self._all.values()
                if r.stage is stage and r.turn is not None and r.turn.request.request_id == response_id
            ),
            None,
        )
