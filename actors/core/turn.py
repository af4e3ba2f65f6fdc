"""The session core's records: a started response (:class:`Turn`) and, in append mode, where
its rollout stands (:class:`Rollout`); the effects a session asks its driver to carry out.
Plain dataclasses, no behaviour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from inference.formats import CL100K, ChatFormat
from inference.types import InferenceRequest
from store import StoredResponse, UsageEntry

from ..protocol import InputItem, ResponseCreate, ServerEvent
from .context import ContextEntry
from .response_builder import ResponseBuilder
from .safety import Classifier
from .timings import PhaseTimer, Report


@dataclass(slots=True)
class Turn:
    """A started response: the model call to run and the builder of its events."""

    turn_id: int
    lane: str | None
    request: InferenceRequest
    builder: ResponseBuilder
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


@dataclass(slots=True)
class Effects:
    """What the driver must do, in answer to one input to the session: start these model
    calls (first, so their requests are on their way while the events are encoded), send
    these events, load these stored responses, render these inputs, and (off the critical
    path) persist these records and ledger lines.  The session never calls its driver."""

    events: list[ServerEvent] = field(default_factory=list)
    start: list[Turn] = field(default_factory=list)
    load: list[Load] = field(default_factory=list)
    render: list[Render] = field(default_factory=list)
    persist: list[StoredResponse] = field(default_factory=list)
    usage: list[UsageEntry] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)  # turns whose model call must stop
    timings: list[Report] = field(default_factory=list)  # per finished response

    def __iadd__(self, other: Effects) -> Effects:
        self.events += other.events
        self.start += other.start
        self.load += other.load
        self.render += other.render
        self.persist += other.persist
        self.usage += other.usage
        self.cancel += other.cancel
        self.timings += other.timings
        return self
