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
from .protocol import ITEM_ADAPTER, InputItem, MessageItem, ResponseCreate, ResponseSteer

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
