"""``response.steer`` (spec §2.3, §3.5, §5.4): the pure parts.

Validating the steer input, and deriving the successor ``response.create`` of a steered
response (it inherits the steered response's settings; its ``previous_response_id`` is the
steered response and its input is the queued steer input).  The state transitions live in
the session.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import APIError
from .ids import new_id
from .protocol import (
    ITEM_ADAPTER,
    InputItem,
    MessageItem,
    OutputFunctionCall,
    RequiredInput,
    ResponseCreate,
    ResponseSteer,
    SteerAccepted,
    SteerFailed,
    SteerFailedError,
    SteerPending,
    SteerRef,
)
from .timings import PhaseTimer
from .turn import Effects, Turn, Waiting

MAX_PENDING_STEERS = 8


class SteerError(APIError):
    """A ``response.steer.failed`` reason (``code`` from spec §5.4)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


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
        raise SteerError("invalid_input", "The steer input must be a string or a non-empty list of user messages.")
    try:
        items = ITEM_ADAPTER.validate_python(raw)
    except ValidationError:
        raise SteerError("invalid_input", "The steer input must contain only user messages.") from None
    if not all(isinstance(i, MessageItem) and i.role == "user" for i in items):
        raise SteerError("invalid_input", "The steer input must contain only user messages.")
    return items


def successor(create: ResponseCreate, steered_id: str, items: list[InputItem]) -> ResponseCreate:
    """The automatic successor of a steered response."""
    return create.model_copy(update={"previous_response_id": steered_id, "input": list(items),
                                     "generate": None})


class SteeringMixin:
    """The session's steering transitions (mixed into :class:`actors.session.Session`)."""

    def _on_steer(self, event: ResponseSteer) -> Effects:
        """``response.steer`` (spec §2.3): stop an active response and start a successor with
        the input, or queue the input for the client's next create after function calls."""
        target = event.previous_response_id
        lane: str | None = None
        try:
            items = steer_items(event)
            turn = next((t for t in self._turns.values() if t.builder.response.id == target), None)
            if turn is not None:
                return self._steer_active(turn, items)
            waiting = self._waiting.get(target)
            if waiting is not None:
                lane = waiting.lane
                if len(waiting.items) + len(items) > MAX_PENDING_STEERS:
                    raise SteerError("too_many_pending_steers", "Too much steering input is pending.")
                waiting.items += items
                ref = SteerRef(id=new_id("steer"), previous_response_id=target)
                b = waiting.builder
                return Effects(events=[
                    SteerAccepted(sequence_number=b.next_seq(), steer=ref, stream_id=lane),
                    SteerPending(sequence_number=b.next_seq(), required_input=waiting.calls, steer=ref,
                                 stream_id=lane)])
            for name, candidate in self._lanes.items():
                if candidate.latest is not None and candidate.latest.response_id == target:
                    lane = name
                    raise SteerError("response_already_completed", "The response already completed.")
            raise SteerError("response_not_found", f"No response with id '{target}' on this connection.")
        except SteerError as exc:
            return Effects(events=[SteerFailed(
                error=SteerFailedError(code=exc.code or "invalid_input", message=exc.message), stream_id=lane,
                steer={"input": event.input, "previous_response_id": str(target)})])

    def _steer_active(self, turn: Turn, items: list[InputItem]) -> Effects:
        b = turn.builder
        ref = SteerRef(id=new_id("steer"), previous_response_id=b.response.id)
        fx = Effects(events=[SteerAccepted(sequence_number=b.next_seq(), steer=ref, stream_id=turn.lane)])
        # Stop at this chunk boundary (incomplete, "steered"); the successor goes first on the lane.
        fx.events += b.cut("steered")
        fx.cancel.append(turn.turn_id)
        turn.timer.inference_done()
        self._pending.appendleft((turn.lane, successor(turn.create, b.response.id, items), PhaseTimer(self._perf)))
        fx += self._finish(turn, failed=False)
        return fx


    def _remember_calls(self, turn: Turn) -> None:
        """The lane's latest response, if it stopped on function calls, can take steer input."""
        for rid, waiting in list(self._waiting.items()):
            if waiting.lane == turn.lane:
                del self._waiting[rid]
        r = turn.builder.response
        calls = [RequiredInput(call_id=o.call_id, name=o.name) for o in r.output if isinstance(o, OutputFunctionCall)]
        if calls and r.status == "completed":
            self._waiting[r.id] = Waiting(turn.lane, turn.builder, calls)

