"""Event-sequence assertions read as the protocol page's tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

TEXT_ANSWER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta*",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
FUNCTION_CALL_ANSWER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta*",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


def event_type(ev: Any) -> str:
    return ev["type"] if isinstance(ev, dict) else ev.type


def assert_event_types(events: Iterable[Any], expected: Sequence[str]) -> None:
    """``expected`` lists types in order; a trailing ``*`` means one or more of that type."""
    types = [event_type(e) for e in events]
    i = 0
    for want in expected:
        repeat = want.endswith("*")
        name = want.rstrip("*")
        assert i < len(types) and types[i] == name, (
            f"expected {name} at {i}, got {types[i : i + 3]} in {types}"
        )
        i += 1
        while repeat and i < len(types) and types[i] == name:
            i += 1
    assert i == len(types), f"unexpected trailing events {types[i:]}"
