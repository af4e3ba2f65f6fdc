"""``response.steer`` (docs/protocol.md §2.3, §3.5, §5.4).

The steer input's validation (:func:`steer_items`), the successor ``response.create`` of a
steered response (:func:`successor`), and :class:`Steering`: the steer input a connection
has accepted and not delivered yet.  The session decides which response a steer reaches and
when a response ends; this module owns what waits meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from ..errors import APIError
from ..ids import new_id
from ..protocol import (
    ITEM_ADAPTER,
    InputItem,
    MessageItem,
    OutputCustomToolCall,
    OutputFunctionCall,
    RequiredInput,
    ResponseCreate,
    ResponseSteer,
    ServerEvent,
    SteerAccepted,
    SteerFailed,
    SteerFailedError,
    SteerPending,
    SteerRef,
)
from .response_builder import ResponseBuilder
from .turn import Turn

MAX_PENDING_STEERS = 8  # steer input items one response may hold


class SteerError(APIError):
    """A ``response.steer.failed`` reason (``code`` from docs/protocol.md §5.4); ``stream_id``
    is the target's lane when the target is known."""

    def __init__(self, code: str, message: str, *, stream_id: str | None = None) -> None:
        super().__init__(message, code=code)
        self.stream_id = stream_id


def steer_items(event: ResponseSteer) -> list[InputItem]:
    """The steer's input as user messages; :class:`SteerError` ``invalid_input`` otherwise."""
    extra = set(event.model_extra or {}) - {"event_id"}
    if extra:
        raise SteerError("invalid_input", f"Unsupported field(s) for response.steer: {sorted(extra)}.")
    if not isinstance(event.previous_response_id, str) or not event.previous_response_id:
        raise SteerError("invalid_input", "response.steer needs a previous_response_id.")
    raw: Any = event.input
    if isinstance(raw, str) and raw:
        return [MessageItem(role="user", content=raw)]
    if not isinstance(raw, list) or not raw:
        raise SteerError(
            "invalid_input", "The steer input must be a string or a non-empty list of user messages."
        )
    try:
        items = ITEM_ADAPTER.validate_python(raw)
    except ValidationError:
        raise SteerError("invalid_input", "The steer input must contain only user messages.") from None
    if not all(isinstance(i, MessageItem) and i.role == "user" for i in items):
        raise SteerError("invalid_input", "The steer input must contain only user messages.")
    return items


def steer_failed(event: ResponseSteer, exc: SteerError) -> SteerFailed:
    """The failure event of a steer that was never accepted: it returns the original input."""
    return SteerFailed(
        error=SteerFailedError(code=exc.code or "invalid_input", message=exc.message),
        stream_id=exc.stream_id,
        steer={"input": event.input, "previous_response_id": str(event.previous_response_id)},
    )


def successor(create: ResponseCreate, steered_id: str, items: list[InputItem]) -> ResponseCreate:
    """The automatic successor of a steered response: the steered response's settings, its
    id as ``previous_response_id``, the steer input as input."""
    return create.model_copy(
        update={"previous_response_id": steered_id, "input": list(items), "generate": None}
    )


def calls_started(builder: ResponseBuilder) -> bool:
    """Whether the response has begun a function call: the client will be asked to run it,
    so a steer must not cut the response (docs/protocol.md §2.3 (c))."""
    return any(isinstance(o, (OutputFunctionCall, OutputCustomToolCall)) for o in builder.output)


def required_input(turn: Turn) -> list[RequiredInput]:
    """The client-owned tool output a finished response waits for: the calls of a completed
    response (in append mode, those the rollout has no result for yet)."""
    response = turn.builder.response
    if response.status != "completed":
        return []
    open_calls = turn.rollout.open_calls if turn.rollout is not None else None
    return [
        RequiredInput(call_id=o.call_id, name=o.name)
        for o in response.output
        if isinstance(o, (OutputFunctionCall, OutputCustomToolCall))
        and (open_calls is None or o.call_id in open_calls)
    ]


@dataclass(slots=True)
class _Submission:
    """One accepted ``response.steer`` not announced yet (its input as the client sent it,
    should it have to be returned)."""

    ref: SteerRef
    raw_input: Any


class Numbering(Protocol):
    """Where a steered response's next sequence number comes from: its builder, or (restored
    on another holder, :class:`Resumed`) the number the snapshot kept."""

    @property
    def seq(self) -> int: ...

    def next_seq(self) -> int: ...


class Resumed:
    """The numbering of a response whose builder stayed with the connection's old holder."""

    def __init__(self, seq: int) -> None:
        self._seq = seq

    @property
    def seq(self) -> int:
        return self._seq

    def next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq


@dataclass(frozen=True, slots=True)
class WaitingSteer:
    """Steer input waiting on a response that stopped on function calls, as plain data (a
    snapshot's, :mod:`actors.core.resumable`)."""

    response_id: str
    lane: str | None
    seq: int  # the response's next sequence number
    items: list[InputItem]
    calls: list[RequiredInput]


@dataclass(slots=True)
class _Queued:
    """Steer input accepted for one response and not delivered yet."""

    lane: str | None
    response_id: str
    numbering: Numbering  # steering events take the steered response's sequence numbers
    items: list[InputItem] = field(default_factory=list)
    unannounced: list[_Submission] = field(default_factory=list)  # accepted while it ran
    calls: list[RequiredInput] = field(default_factory=list)  # the tool output it stopped for

    def add(self, items: list[InputItem]) -> SteerRef:
        if len(self.items) + len(items) > MAX_PENDING_STEERS:
            raise SteerError(
                "too_many_pending_steers", "Too much steering input is pending.", stream_id=self.lane
            )
        self.items += items
        return SteerRef(id=new_id("steer"), previous_response_id=self.response_id)

    def accepted(self, ref: SteerRef) -> SteerAccepted:
        return SteerAccepted(sequence_number=self.numbering.next_seq(), steer=ref, stream_id=self.lane)

    def pending(self, ref: SteerRef) -> SteerPending:
        return SteerPending(
            sequence_number=self.numbering.next_seq(),
            required_input=self.calls,
            steer=ref,
            stream_id=self.lane,
        )

    def failed(self, sub: _Submission) -> SteerFailed:
        return SteerFailed(
            sequence_number=self.numbering.next_seq(),
            stream_id=self.lane,
            error=SteerFailedError(
                code="response_not_active",
                message="The response failed before the steer input could be used.",
            ),
            steer={
                "input": sub.raw_input,
                "previous_response_id": sub.ref.previous_response_id,
                "id": sub.ref.id,
            },
        )


class Steering:
    """Steer input a connection accepted and has not delivered yet (docs/protocol.md §2.3).

    It waits in one of two places:

    * on a *running* response that has begun a function call (:meth:`accept_running`): a steer never
      cuts a call the client is about to be asked to run, so the input waits for the end;
    * on a response that *stopped on function calls*, its lane's latest (:meth:`accept_stopped`): the
      input goes in front of the client's next ``response.create`` continuing that response
      on that lane (:meth:`take_for`).

    When a response ends, :meth:`settle` moves what it held: to waiting for the client's tool
    output (``response.steer.pending``), or out as the input of an automatic successor.
    """

    def __init__(self) -> None:
        self._running: dict[str, _Queued] = {}
        self._stopped: dict[str, _Queued] = {}

    def accept_running(
        self, lane: str | None, builder: ResponseBuilder, items: list[InputItem], raw_input: Any
    ) -> list[ServerEvent]:
        """Accept steer input for the running response of ``builder``."""
        rid = builder.response.id
        queued = self._running.get(rid) or _Queued(lane, rid, builder)
        ref = queued.add(items)
        self._running[rid] = queued
        queued.unannounced.append(_Submission(ref, raw_input))
        return [queued.accepted(ref)]

    def accept_stopped(self, target: str, items: list[InputItem]) -> list[ServerEvent] | None:
        """Accept steer input for ``target`` if it stopped on function calls: accepted and
        pending at once.  ``None`` if nothing waits on ``target``."""
        queued = self._stopped.get(target)
        if queued is None:
            return None
        ref = queued.add(items)
        return [queued.accepted(ref), queued.pending(ref)]

    def settle(
        self, lane: str | None, builder: ResponseBuilder, calls: list[RequiredInput]
    ) -> tuple[list[ServerEvent], list[InputItem]]:
        """``builder``'s response ended and its terminal event is out; ``calls`` is the tool
        output it waits for (see :func:`required_input`).  Returns the events that follow
        the terminal event, and the steer input an automatic successor must take (input held
        for a response that ended without waiting for tool output)."""
        held = self._running.pop(builder.response.id, None)
        if builder.response.status == "failed":
            return ([held.failed(sub) for sub in held.unannounced] if held else []), []
        # The lane moved on: what waited for its previous response can no longer be continued.
        self._stopped = {rid: q for rid, q in self._stopped.items() if q.lane != lane}
        if not calls:
            return [], held.items if held else []
        # The response is over: its steering events number on from its last, and the
        # builder (its response, classifier, every event's state) is not kept while the
        # client runs the tools.
        queued = held or _Queued(lane, builder.response.id, builder)
        queued.numbering = Resumed(queued.numbering.seq)
        queued.calls = calls
        self._stopped[builder.response.id] = queued
        events: list[ServerEvent] = [queued.pending(sub.ref) for sub in queued.unannounced]
        queued.unannounced.clear()
        return events, []

    def take_for(self, previous_response_id: str | None, lane: str | None) -> list[InputItem]:
        """The steer input queued for a create continuing ``previous_response_id`` on
        ``lane``, in submission order (delivered once)."""
        queued = self._stopped.get(previous_response_id or "")
        if queued is None or queued.lane != lane:
            return []
        del self._stopped[previous_response_id or ""]
        return queued.items

    def waiting(self) -> list[WaitingSteer]:
        """The steer input waiting on responses that stopped on function calls."""
        return [
            WaitingSteer(rid, q.lane, q.numbering.seq, list(q.items), list(q.calls))
            for rid, q in self._stopped.items()
        ]

    def restore(self, waiting: WaitingSteer) -> None:
        """Steer input a snapshot kept (:meth:`waiting`), on this holder now."""
        queued = _Queued(waiting.lane, waiting.response_id, Resumed(waiting.seq))
        queued.items = list(waiting.items)
        queued.calls = list(waiting.calls)
        self._stopped[waiting.response_id] = queued

    def drop_running(self) -> None:
        """The running responses are gone (disconnect): so is what they held."""
        self._running.clear()
