"""A session host's parser keeps the instructions and tools its connections resend
(actors.protocol.Recurring): a create that resends them gets the kept objects, parsed as a
create that did not would be; anything else is parsed as it is."""

from __future__ import annotations

import json

import pytest

from actors.errors import APIError
from actors.protocol import Recurring, ResponseCreate, parse_client_event

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
}
TOOLS = [
    {"type": "function", "name": f"tool_{i}", "description": "Reads a file. " * 8, "parameters": SCHEMA}
    for i in range(4)
]
INSTRUCTIONS = "You are a careful coding agent. " * 40


def frame(**fields: object) -> str:
    body = {"type": "response.create", "model": "m", "instructions": INSTRUCTIONS, "tools": TOOLS}
    return json.dumps({**body, "input": "hi", **fields})


def parsed(data: str, recurring: Recurring | None) -> ResponseCreate:
    event = parse_client_event(data, recurring)
    assert isinstance(event, ResponseCreate)
    return event


def test_a_resent_tool_list_and_text_are_the_kept_objects_parsed_as_they_would_be():
    rec = Recurring()
    first = parsed(frame(input="one"), rec)
    again = parsed(frame(input="two"), rec)
    alone = parsed(frame(input="two"), None)
    assert again.tools is first.tools and again.instructions is first.instructions
    assert rec.hits == 2
    assert again.model_dump_json() == alone.model_dump_json()
    compact = json.dumps(json.loads(frame(input="three")), separators=(",", ":"))
    other = parsed(compact, rec)  # other bytes, equal values: a tools member of its own
    assert other.tools is not first.tools and other.instructions is first.instructions
    assert other.model_dump_json() == parsed(compact, None).model_dump_json()


def outcome(data: str, recurring: Recurring | None) -> str:
    """The create's JSON as parsed, or the error's parameter and message."""
    try:
        return parsed(data, recurring).model_dump_json()
    except APIError as exc:
        return f"error {exc.param}: {exc}"


MIN_1_0 = {**SCHEMA, "properties": {**SCHEMA["properties"], "n": {"type": "integer", "minimum": 1.0}}}
REORDERED = {"properties": SCHEMA["properties"], "type": "object"}


@pytest.mark.parametrize(
    ("sent_first", "sent_then"),
    [
        ([TOOLS[0]], [{**TOOLS[0], "parameters": MIN_1_0}]),
        ([TOOLS[0]], [{**TOOLS[0], "parameters": REORDERED}]),
        ([{**TOOLS[0], "x_extra": 1}], [{**TOOLS[0], "x_extra": True}]),
    ],
    ids=["1-then-1.0", "key-order", "1-then-true"],
)
def test_tools_equal_in_value_but_not_in_text_echo_as_sent(
    sent_first: list[dict], sent_then: list[dict]
) -> None:
    assert sent_first == sent_then  # equal to Python, not the same JSON
    rec = Recurring()
    kept = parsed(frame(tools=sent_first), rec)
    got = parsed(frame(tools=sent_then), rec)
    assert got.tools is not kept.tools
    assert got.model_dump_json() == outcome(frame(tools=sent_then), None) != kept.model_dump_json()


def test_a_kept_tools_text_that_is_not_the_creates_tools_is_not_taken_for_them():
    rec = Recurring()
    kept = parsed(frame(), rec)
    member = '"tools": ' + json.dumps(TOOLS)
    item = {"type": "message", "role": "user", "content": "hi", "tools": TOOLS}
    inside = frame(tools=[], input=[item])
    assert member in inside
    assert outcome(inside, rec) == outcome(inside, None)
    doubled = frame()[:-1] + ', "tools": []}'  # a second tools key
    assert outcome(doubled, rec) == outcome(doubled, None)
    assert parsed(frame(), rec).tools is kept.tools


def test_a_nested_create_and_a_bad_frame_are_parsed_as_without_the_memo():
    rec = Recurring()
    parsed(frame(), rec)
    nested = json.dumps({"type": "response.create", "response": json.loads(frame())})
    assert outcome(nested, rec) == outcome(nested, None)
    bad_choice = frame(tool_choice={"type": "function", "name": "nope"})
    assert outcome(bad_choice, rec) == outcome(bad_choice, None)
    assert outcome(bad_choice, rec).startswith("error tool_choice")
    truncated = frame()[:-1]
    assert outcome(truncated, rec) == outcome(truncated, None)
    assert outcome(truncated, rec).startswith("error")


def test_short_values_are_not_kept_and_the_kept_ones_are_bounded():
    rec = Recurring(size=2)
    short = [{"type": "function", "name": "f"}]
    parsed(frame(tools=short, instructions="be brief"), rec)
    parsed(frame(tools=short, instructions="be brief"), rec)
    assert rec.hits == 0
    lists = [[{**TOOLS[0], "name": f"t{i}"}] for i in range(3)]
    kept = [parsed(frame(tools=tools), rec).tools for tools in lists]
    assert parsed(frame(tools=lists[2]), rec).tools is kept[2]
    assert parsed(frame(tools=lists[0]), rec).tools is not kept[0]  # only the 2 most recent were kept


def test_resent_instructions_are_recognised_by_their_bytes_from_their_second_sighting(monkeypatch):
    """From the second create that resends a kept text, its exact ``"instructions":"…"``
    member is kept: later creates are parsed with it stubbed out (the text's JSON string not
    scanned again), tools and all, as a create parsed without the memo would be."""
    import actors.protocol.recurring as recurring_module

    texts: list[str] = []
    load = recurring_module.load_json_object
    monkeypatch.setattr(recurring_module, "load_json_object", lambda data: texts.append(data) or load(data))
    rec = Recurring()
    first = parsed(frame(input="one"), rec)
    parsed(frame(input="two"), rec)  # the text seen again: its member learnt
    texts.clear()
    third = parsed(frame(input="three"), rec)
    assert third.instructions is first.instructions and third.tools is first.tools
    assert len(texts) == 1 and INSTRUCTIONS not in texts[0] and '"tool_0"' not in texts[0]
    assert third.model_dump_json() == parsed(frame(input="three"), None).model_dump_json()
    alone = parsed(frame(input="four", tools=[]), rec)  # the instructions member alone
    assert alone.instructions is first.instructions and not alone.tools
    assert alone.model_dump_json() == parsed(frame(input="four", tools=[]), None).model_dump_json()


def test_an_instructions_member_that_is_not_the_creates_own_is_not_taken_for_it():
    rec = Recurring()
    for _ in range(3):
        kept = parsed(frame(), rec)
    item = {"type": "message", "role": "user", "content": "hi", "instructions": INSTRUCTIONS}
    inside = frame(instructions="be brief", input=[item])  # the member's exact text, in an input item
    assert '"instructions": ' + json.dumps(INSTRUCTIONS) in inside
    assert outcome(inside, rec) == outcome(inside, None)
    escaped = json.dumps({**json.loads(frame()), "instructions": INSTRUCTIONS + "\u00e9"})
    assert outcome(escaped, rec) == outcome(escaped, None)  # another text: parsed as it is
    doubled = frame()[:-1] + ', "instructions": "other"}'  # a second instructions key
    assert outcome(doubled, rec) == outcome(doubled, None)
    assert parsed(frame(), rec).instructions is kept.instructions
