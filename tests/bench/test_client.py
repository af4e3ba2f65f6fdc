"""The lab's client reads the wire as the server writes it."""

from __future__ import annotations

from actors.protocol import TERMINAL_EVENT_TYPES as SERVER_TERMINAL_EVENT_TYPES
from bench.client import FINAL_EVENT_TYPES, TERMINAL_EVENT_TYPES, output_text


def test_the_clients_terminal_events_are_the_servers():
    assert TERMINAL_EVENT_TYPES == SERVER_TERMINAL_EVENT_TYPES
    assert TERMINAL_EVENT_TYPES | {"error"} == FINAL_EVENT_TYPES


def test_output_text_joins_the_text_parts_of_messages_only():
    response = {
        "output": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "message", "content": [{"type": "output_text", "text": "a"}, {"type": "refusal"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "b"}]},
        ]
    }
    assert output_text(response) == "ab"
