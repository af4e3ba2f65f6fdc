"""A connection's :class:`EventEncoder` writes exactly what :func:`encode` writes, byte for
byte, for every event of every kind of response — also when the echoed instructions or
tools change between responses, hold non-ASCII text, or a client's text looks like the
encoder's placeholder."""

from __future__ import annotations

import json

import pytest

from actors.protocol import EventEncoder, encode
from tests.actors.test_protocol_schema import SCENARIOS, TOOL, create, session

WIDE = {
    "type": "function",
    "name": "grep",
    "description": 'Sök «mönster» — 検索 \u2028 "quoted" \\ \x07',
    "parameters": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0.5, "maximum": 1e21},
            "flag": {"type": "boolean", "default": None},
        },
    },
}


def encoded_both_ways(bodies: list[dict], answer) -> list[tuple[str, str]]:
    encoder, pairs = EventEncoder(), []
    for body in bodies:
        s = session()  # one encoder across responses, as a connection's
        events = answer(s, create(s, store=False, **body)).events
        pairs += [(encoder(e), encode(e)) for e in events]
    return pairs


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_event_of_every_response_is_encoded_as_encode_does(name):
    body, answer = SCENARIOS[name]
    for mine, reference in encoded_both_ways([body, body], answer):
        assert mine == reference


def test_changed_instructions_and_tools_are_encoded_afresh():
    _, answer = SCENARIOS["function call"]
    bodies = [
        dict(input="a", instructions="first", tools=[TOOL]),
        dict(input="b", instructions="ändrad — 変更", tools=[TOOL, WIDE]),
        dict(input="c", tools=[WIDE]),  # no instructions: null
        dict(input="d", instructions="first", tools=[TOOL]),
    ]
    pairs = encoded_both_ways(bodies, answer)
    for mine, reference in pairs:
        assert mine == reference
    echoed = [json.loads(m)["response"] for m, _ in pairs if json.loads(m).get("type") == "response.created"]
    assert [r["instructions"] for r in echoed] == ["first", "ändrad — 変更", None, "first"]
    assert [len(r["tools"]) for r in echoed] == [1, 2, 1, 1]


def test_a_client_text_that_looks_like_a_placeholder_is_left_as_it_is():
    encoder = EventEncoder()
    s = session()
    _, answer = SCENARIOS["text answer"]
    lookalike = f"{'0' * 32}:instructions"
    events = answer(s, create(s, input=lookalike, instructions=lookalike, metadata={"x": lookalike})).events
    for event in events:
        assert encoder(event) == encode(event)


def test_a_connection_echoes_unchanged_tools_as_one_list_and_changed_ones_afresh():
    """The encoder tells the echoed tools by identity (no compare): a connection's
    responses share one echo while the definitions are unchanged, never across a change."""
    s, encoder = session(), EventEncoder()
    _, answer = SCENARIOS["function call"]
    echoes = []
    for tools in ([TOOL], [TOOL], [TOOL, WIDE], [TOOL, WIDE]):
        events = answer(s, create(s, store=False, input="go", tools=tools)).events
        echoes.append(events[0].response.tools)
        assert all(encoder(e) == encode(e) for e in events)
    assert echoes[0] is echoes[1] and echoes[2] is echoes[3] and echoes[1] is not echoes[2]
    assert [len(e) for e in echoes] == [1, 1, 2, 2]
