"""The session core's records: a started response (:class:`Turn`) and, in append mode, where
its rollout stands (:class:`Rollout`); the effects a session asks its driver to carry out
(:class:`Effects`).  Records, with no behaviour but building a started response's first
events when the session is told its call has left."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inference.formats import CL100K, ChatFormat
from inference.types import Breakpoint, InferenceRequest
from store import StoredResponse, UsageEntry

from ..protocol import InputItem, OutputItem, ResponseCreate, ServerEvent
from ..protocol.wire_types import JSONObject
from .context import ContextEntry
from .response_builder import ResponseBuilder, new_response
from .safety import Classifier
from .timings import PhaseTimer, Report

if TYPE_CHECKING:
    from .inputs import LaneEvicted


@dataclass(frozen=True, slots=True)
class NewResponse:
    """What a started turn's response is made of, built by :meth:`Turn.open` once its model
    call has left."""

    create: ResponseCreate
    store: bool
    echoed_tools: list[JSONObject]  # the create's tools as echoed, the connection's list (identity kept)
    clock: Callable[[], float]
    output_scan: Classifier | None
    pause_on_calls: bool
    first_item: OutputItem | None = None  # a compaction item, the response's first output


@dataclass(slots=True)
class Turn:
    """A started response: the model call to run and the builder of its events."""

    turn_id: int
    lane: str | None
    request: InferenceRequest
    response_from: NewResponse  # what its response is made of (open)
    parent: ContextEntry | None
    same_lane_parent: bool
    inputs: list[JSONObject]  # the input items as stored (with ids)
    input_tokens: Sequence[int]
    call_ids: frozenset[str]
    store: bool
    scan: Classifier  # the conversation's classifier state including this input
    timer: PhaseTimer
    timings_requested: bool
    create: ResponseCreate  # what a steered response's successor inherits
    prefix_len: int = 0  # prompt tokens before the conversation (tools, instructions)
    rollout: Rollout | None = None  # append mode only (actors.core.rollout)
    fmt: ChatFormat = CL100K  # the model's chat format (inference.formats)
    input_marks: tuple[Breakpoint, ...] = ()  # the prompt-cache breakpoints in input_tokens
    _builder: ResponseBuilder | None = field(default=None, init=False)
    _opening: list[ServerEvent] = field(default_factory=list, init=False)

    @property
    def opened(self) -> bool:
        return self._builder is not None

    def open(self) -> list[ServerEvent]:
        """The response's first events (``response.created``, ``response.in_progress``, a
        compaction item), built now: the session calls it once its model call has left
        (:class:`~actors.core.inputs.CallsStarted`); the same list after."""
        if self._builder is None:
            new = self.response_from
            response = new_response(
                new.create, new.store, new.clock, new.echoed_tools, self.request.request_id
            )
            self._builder = ResponseBuilder(
                response,
                stream_id=self.lane,
                clock=new.clock,
                output_scan=new.output_scan,
                pause_on_calls=new.pause_on_calls,
            )
            self._opening = self._builder.start()
            if new.first_item is not None:
                self._opening += self._builder.add_item(new.first_item)
        return self._opening

    @property
    def builder(self) -> ResponseBuilder:
        """The builder of the response's events (made by :meth:`open`)."""
        assert self._builder is not None, "the turn's response is built once its call has started"
        return self._builder


@dataclass(frozen=True, slots=True)
class Rollout:
    """Where an append-mode response stands between its model calls (docs/append-mode.md).

    ``context`` is the conversation the next model call continues: the parent's, the turn's
    input, the output of the calls so far (the first ``folded`` output items) and the tool
    results appended since.  ``open_calls`` are the response's calls still waiting for a
    ``function_call_output``."""

    context: ContextEntry
    folded: int = 0
    open_calls: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Load:
    """Fetch a stored response the connection's cache does not hold (docs/protocol.md §4),
    answered with a :class:`~actors.core.inputs.HistoryLoaded` input; or, with ``item_ids``,
    the stored items an input's ``item_reference`` items name (``response_id`` unused),
    answered with an :class:`~actors.core.inputs.ItemsLoaded` input."""

    load_id: int
    response_id: str
    owner: str
    item_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Render:
    """Tokenise a large input (``SessionConfig.render_offload_chars``) where
    :data:`RENDER_SITE` says, answered with a :class:`~actors.core.inputs.Rendered` input."""

    render_id: int
    items: tuple[InputItem, ...]
    fmt: ChatFormat = CL100K


class RenderSite(enum.Enum):
    """Where the host tokenises a :class:`Render`'s input."""

    INLINE = "inline"  # on the event loop, as the effects are carried out (tiktoken is faster there)
    WORKER = "worker"  # on a worker thread: the loop keeps serving (tiktoken releases the GIL)


# Where a render runs, by whether the host process has other work in flight (model calls and
# renders of its connections, actors.host.render_pool): inline would hold that work up.
RENDER_SITE: dict[bool, RenderSite] = {False: RenderSite.INLINE, True: RenderSite.WORKER}


@dataclass(frozen=True, slots=True)
class Eviction:
    """The host's cache budget evicted ``lane`` of another connection (``session``), whose
    latest response was ``response_id``, to make room: the driver hands that session a
    :class:`~actors.core.inputs.LaneEvicted`."""

    session: LaneOwner
    lane: str | None
    response_id: str


class LaneOwner(Protocol):
    """A session, as the owner of lanes another session's cache may evict."""

    def handle(self, event: LaneEvicted) -> Effects: ...


@dataclass(slots=True)
class Effects:
    """What the driver must do, in answer to one input to the session, in this order: stop
    the model calls of ``cancel``, start those of ``start`` (and then hand the session
    :class:`~actors.core.inputs.CallsStarted`: its answer holds the started responses'
    first events, so a call's request has left before its response is built), hand
    ``evict`` to the sessions named, send ``events`` (a terminal event once its ``usage``
    line, and its ``persist`` record if stored, are written or journaled), keep ``timings``,
    load ``load``, render ``render``.  Built eagerly: plain lists.  The session never calls
    its driver."""

    events: list[ServerEvent] = field(default_factory=list)
    start: list[Turn] = field(default_factory=list)
    load: list[Load] = field(default_factory=list)
    render: list[Render] = field(default_factory=list)
    persist: list[StoredResponse] = field(default_factory=list)
    usage: list[UsageEntry] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)  # turns whose model call must stop
    timings: list[Report] = field(default_factory=list)  # per finished response
    evict: list[Eviction] = field(default_factory=list)  # other connections' lanes the budget took

    @property
    def opening(self) -> tuple[int, ...]:
        """The started turns whose responses are not built yet (``CallsStarted`` builds them)."""
        return tuple(t.turn_id for t in self.start if not t.opened)

    def __iadd__(self, other: Effects) -> Effects:
        self.events += other.events
        self.start += other.start
        self.load += other.load
        self.render += other.render
        self.persist += other.persist
        self.usage += other.usage
        self.cancel += other.cancel
        self.timings += other.timings
        self.evict += other.evict
        return self
