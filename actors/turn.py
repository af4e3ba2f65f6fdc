"""The session core's records: a started response (:class:`Turn`), a lane, the effects a
session asks its driver to carry out.  Plain dataclasses, no behaviour."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from inference.types import InferenceRequest

from .context import ContextEntry
from .protocol import InputItem, RequiredInput, ResponseCreate, ServerEvent
from .response_builder import ResponseBuilder
from .safety import Classifier
from store import StoredResponse, UsageEntry
from .timings import PhaseTimer


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
    input_tokens: list[int]
    call_ids: frozenset[str]
    store: bool
    scan: Classifier  # the conversation's classifier state including this input
    timer: PhaseTimer
    timings_requested: bool
    create: ResponseCreate  # what a steered response's successor inherits
    # Append mode: the conversation so far inside this one response (tokens and items).
    prefix_len: int = 0  # prompt tokens before the conversation (tools, instructions)
    convo: tuple[array, list[dict]] | None = None
    open_calls: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Waiting:
    """A response that stopped on function calls; steer input waits for the client's next
    create on the lane (spec §2.3 (c))."""

    lane: str | None
    builder: ResponseBuilder
    calls: list[RequiredInput]
    items: list[InputItem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Load:
    """Fetch a stored response the connection's cache does not hold (spec §4.3)."""

    load_id: int
    response_id: str
    owner: str


@dataclass(slots=True)
class Effects:
    """What the driver must do: send these events, start these model calls, load these
    stored responses, and (off the critical path) persist these records and ledger lines."""

    events: list[ServerEvent] = field(default_factory=list)
    start: list[Turn] = field(default_factory=list)
    load: list[Load] = field(default_factory=list)
    persist: list[StoredResponse] = field(default_factory=list)
    usage: list[UsageEntry] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)  # turns whose model call must stop
    timings: list[dict[str, float]] = field(default_factory=list)  # per finished response

    def __iadd__(self, other: Effects) -> Effects:
        self.events += other.events
        self.start += other.start
        self.load += other.load
        self.persist += other.persist
        self.usage += other.usage
        self.cancel += other.cancel
        self.timings += other.timings
        return self


@dataclass(slots=True)
class Lane:
    latest: ContextEntry | None = None
    busy: bool = False  # a response is loading its parent or running

