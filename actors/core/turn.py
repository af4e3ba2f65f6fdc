"""The session core's records: a started response (:class:`Turn`) and, in append mode, where
its rollout stands (:class:`Rollout`); the effects a session asks its driver to carry out
(:class:`Effects`, whose events are read after its model calls are started).  Records, with
no behaviour but building a started response's first events when they are first read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from inference.formats import CL100K, ChatFormat
from inference.types import Breakpoint, InferenceRequest
from store import StoredResponse, UsageEntry

from ..protocol import InputItem, OutputItem, ResponseCreate, ServerEvent
from .context import ContextEntry
from .response_builder import ResponseBuilder, new_response
from .safety import Classifier
from .timings import PhaseTimer, Report


@dataclass(frozen=True, slots=True)
class NewResponse:
    """What a started turn's response is made of, built when its first events are first read
    (:meth:`Turn.open`): its model call is ready before, and is started first."""

    create: ResponseCreate
    store: bool
    echoed_tools: list[dict]  # the create's tools as echoed, the connection's list (identity kept)
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
    inputs: list[dict]  # the input items as stored (with ids)
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

    def open(self) -> list[ServerEvent]:
        """The response's first events (``response.created``, ``response.in_progress``, a
        compaction item): built on the first call, the same list after."""
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
        """The builder of the response's events (made by :meth:`open`, which runs now if the
        opening events were never read)."""
        if self._builder is None:
            self.open()
            assert self._builder is not None
        return self._builder


@dataclass(frozen=True, slots=True)
class Opening:
    """Where a started turn's first events go among an input's events (:class:`Effects`):
    they are built when the events are read, after the driver started the turn's call."""

    turn: Turn


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
    answered with ``Session.on_loaded``; or, with ``item_ids``, the stored items an input's
    ``item_reference`` items name (``response_id`` unused), answered with ``Session.on_items_loaded``."""

    load_id: int
    response_id: str
    owner: str
    item_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Render:
    """Tokenise a large input off the event loop and hand the ids back with
    ``Session.on_rendered`` (``SessionConfig.render_offload_chars``)."""

    render_id: int
    items: tuple[InputItem, ...]
    fmt: ChatFormat = CL100K


class Effects:
    """What the driver must do, in answer to one input to the session: start these model
    calls, send these events, load these stored responses, render these inputs, and (off the
    critical path) persist these records and ledger lines.  The session never calls its
    driver.

    Pull-style, as a sans-I/O protocol's output: ``start`` is ready at once, ``events`` is
    built when first read — a started turn's ``response.created`` and
    ``response.in_progress`` (and the response object they carry) are made then, in their
    place among the others (:class:`Opening`).  A driver reads ``start`` and starts the calls
    first, so their requests are on their way before that work, then reads ``events``."""

    __slots__ = ("_built", "_out", "cancel", "load", "persist", "render", "start", "timings", "usage")

    def __init__(
        self,
        events: Iterable[ServerEvent | Opening] = (),
        start: list[Turn] | None = None,
        load: list[Load] | None = None,
        render: list[Render] | None = None,
        persist: list[StoredResponse] | None = None,
        usage: list[UsageEntry] | None = None,
        cancel: list[int] | None = None,
        timings: list[Report] | None = None,
    ) -> None:
        self._out: list[ServerEvent | Opening] = list(events)
        self._built = not any(isinstance(e, Opening) for e in self._out)
        self.start: list[Turn] = start if start is not None else []
        self.load: list[Load] = load if load is not None else []
        self.render: list[Render] = render if render is not None else []
        self.persist: list[StoredResponse] = persist if persist is not None else []
        self.usage: list[UsageEntry] = usage if usage is not None else []
        self.cancel: list[int] = cancel if cancel is not None else []  # turns whose model call must stop
        self.timings: list[Report] = timings if timings is not None else []  # per finished response

    @property
    def events(self) -> list[ServerEvent]:
        """The events to send, in order; a started turn's opening events are built on the
        first read."""
        if not self._built:
            self._out = [
                e for item in self._out for e in (item.turn.open() if isinstance(item, Opening) else [item])
            ]
            self._built = True
        return cast(list[ServerEvent], self._out)  # built: no Opening is left

    @events.setter
    def events(self, events: list[ServerEvent]) -> None:
        self._out = list(events)
        self._built = True

    def __iadd__(self, other: Effects) -> Effects:
        self._out += other._out  # an opening not yet built stays so
        self._built = self._built and other._built
        self.start += other.start
        self.load += other.load
        self.render += other.render
        self.persist += other.persist
        self.usage += other.usage
        self.cancel += other.cancel
        self.timings += other.timings
        return self
