"""Every input the session core takes, one frozen record each: :meth:`Session.handle
<actors.core.session.Session.handle>` is the one way in, and answers each with the
:class:`~actors.core.turn.Effects` its driver carries out.

From the client: :class:`ClientFrame` (a WebSocket frame) or :class:`ParsedCreate` (the
HTTP path's create).  From the driver's work: :class:`CallsStarted` (the model calls of the
last effects have left), :class:`InferenceChunk` and :class:`InferenceFailed` (a model
call's output), :class:`HistoryLoaded` and :class:`ItemsLoaded` (a :class:`~actors.core.turn.Load`
answered), :class:`Rendered` (a :class:`~actors.core.turn.Render` answered), :class:`Written`
(a response's record or ledger line written).  From the host: :class:`DrainStarted`,
:class:`Disconnected`, :class:`StateRestored` (a resume on another node), :class:`LaneEvicted`
(the host's cache budget took a lane for another connection), :class:`Released` (the state
is dropped for good).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inference.types import InferenceEvent
from store import StoredResponse

from ..protocol import ResponseCreate
from ..protocol.wire_types import JSONObject
from .render import MarkedTokens
from .timings import PhaseTimer


@dataclass(frozen=True, slots=True)
class ClientFrame:
    """One client frame, its first bytes ``received`` at that time on the session's
    ``perf`` clock, if known."""

    data: str | bytes
    received: float | None = None


@dataclass(frozen=True, slots=True)
class ParsedCreate:
    """A ``response.create`` parsed by its transport (the HTTP path), timed by ``timer``."""

    create: ResponseCreate
    timer: PhaseTimer | None = None


@dataclass(frozen=True, slots=True)
class CallsStarted:
    """The driver started the model calls of the effects it was given (``Effects.start``):
    their requests have left, and the responses' first events are made now."""

    turn_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InferenceChunk:
    """A chunk of model output for a started turn."""

    turn_id: int
    chunk: Sequence[InferenceEvent]


@dataclass(frozen=True, slots=True)
class InferenceFailed:
    """A started turn's model call raised (after ``response.created``)."""

    turn_id: int
    error: BaseException


@dataclass(frozen=True, slots=True)
class HistoryLoaded:
    """The store's answer to a :class:`~actors.core.turn.Load` of a response (``None``: not
    found for this owner)."""

    load_id: int
    record: StoredResponse | None


@dataclass(frozen=True, slots=True)
class ItemsLoaded:
    """The store's answer to a :class:`~actors.core.turn.Load` of ``item_ids``: the items
    it has, by id."""

    load_id: int
    found: Mapping[str, JSONObject]


@dataclass(frozen=True, slots=True)
class Rendered:
    """The answer to a :class:`~actors.core.turn.Render` (``None``: rendering failed, a
    server fault)."""

    render_id: int
    rendered: MarkedTokens | None


@dataclass(frozen=True, slots=True)
class Written:
    """A response's record and ledger line (or its line alone) are written and its terminal
    event is sent; ``stored`` is false if the write failed."""

    response_id: str
    stored: bool


@dataclass(frozen=True, slots=True)
class DrainStarted:
    """The host is shutting down: later creates are refused, what runs finishes."""


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The socket is gone (its driver cancelled the model calls)."""


@dataclass(frozen=True, slots=True)
class StateRestored:
    """A snapshot of another holder of this connection (``Session.snapshot``) to take."""

    raw: bytes


@dataclass(frozen=True, slots=True)
class LaneEvicted:
    """The host's cache budget evicted this lane's cached conversation to make room for
    another connection's (:class:`~actors.core.turn.Eviction`): it no longer counts, and is
    cleared unless the lane has moved on from ``response_id``."""

    lane: str | None
    response_id: str


@dataclass(frozen=True, slots=True)
class Released:
    """The connection's state is dropped for good: what it cached stops counting against
    the host's budget."""


Input = (
    ClientFrame
    | ParsedCreate
    | CallsStarted
    | InferenceChunk
    | InferenceFailed
    | HistoryLoaded
    | ItemsLoaded
    | Rendered
    | Written
    | DrainStarted
    | Disconnected
    | StateRestored
    | LaneEvicted
    | Released
)
