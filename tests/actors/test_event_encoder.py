"""A connection's :class:`EventEncoder` writes exactly what :func:`encode` writes, byte for
byte, for every event of every kind of response — also when the echoed instructions or
tools change between responses, hold non-ASCII text, or a client's text looks like the
encoder's placeholder."""

from __future__ import annotations

import json

import pytest

from actors.config import SessionConfig
from actors.core.prompt_parts import PromptParts
from actors.core.session import Session
from actors.protocol import EventEncoder, encode
from actors.protocol.echoes import EchoJSON
from tests.actors.test_protocol_schema import MODEL, SCENARIOS, TOOL, create, session

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


def test_connections_of_a_host_share_the_echoes_json_and_write_what_encode_writes():
    """Two connections of one host (sharing its prompt parts, as a session host's do) echo
    the same text and the host's one prepared tool list: the second takes both JSONs from
    the process's :class:`EchoJSON`; a tool list that is equal but another object is
    encoded afresh (tools are known by identity)."""
    echoes, parts = EchoJSON(), PromptParts()
    _, answer = SCENARIOS["function call"]
    text = "You are a coding agent. " * 40
    tools = [TOOL, WIDE, {**TOOL, "name": "write_file"}]
    echoed = []
    for i in range(2):
        s = Session(SessionConfig(), [MODEL], session_key=f"c{i}", clock=lambda: 1.7e9, prompt_parts=parts)
        events = answer(
            s, create(s, store=False, input=f"go {i}", instructions="".join(text), tools=tools)
        ).events
        encoder = EventEncoder(echoes)
        assert all(encoder(e) == encode(e) for e in events)
        echoed.append(events[0].response.tools)
    assert echoed[0] is echoed[1]
    assert (echoes.misses, echoes.hits) == (2, 2)  # text and tools once each; the second connection hits both
    equal_list = list(echoed[0])
    assert equal_list == echoed[0] and echoes.json(equal_list) == encode_list(equal_list)
    assert echoes.misses == 3


def test_the_echoes_keep_the_most_recent_within_their_bound():
    echoes = EchoJSON(max_chars=1000)
    texts = [f"{i}" * 300 for i in range(5)]
    for text in texts:
        assert echoes.json(text) == json.dumps(text)
    assert len(echoes) == 3  # 302 chars each: the two oldest went
    echoes.json(texts[2])
    echoes.json("short")  # short JSON is not kept
    assert (echoes.hits, echoes.misses, len(echoes)) == (1, 5, 3)


def encode_list(tools: list) -> str:
    return json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
