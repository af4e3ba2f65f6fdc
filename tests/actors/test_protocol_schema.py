"""Every object the protocol layer writes validates against the openai SDK's types and the
Open Responses schema (docs/protocol.md §3, §6), checked without a server: the session core
is driven with scripted inference chunks and each event goes through the one encode point.

The end-to-end corpus over HTTP, SSE and WebSocket is tests/integration/test_conformance.py.
"""

from __future__ import annotations

import json
import re

import pytest
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, InferenceFailed
from actors.core.session import Effects, Session
from actors.errors import InvalidRequest, ModelNotFound, NotFound, PreviousResponseNotFound, ServerError
from actors.protocol import (
    CompactedResponse,
    InputTokensDetails,
    ItemList,
    ResponseObject,
    Usage,
    encode,
    http_error_body,
    item_dict,
    parse_http_compact,
    parse_http_create,
    parse_items,
    sse_frame,
)
from inference.types import Done, FunctionCallDelta, Prefilled, TextDelta
from serve.compaction import compact
from tests.support import openresponses as orv
from tests.support.schemas import EXTENSIONS, OPEN_RESPONSES, SDK, Checker
from tests.support.session_driver import handled

MODEL = "emu-fast"
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def session() -> Session:
    return Session(SessionConfig(), [MODEL], session_key="conn-1", clock=lambda: 1_700_000_000.0)


def create(s: Session, **body) -> Effects:
    return handled(s, ClientFrame(json.dumps({"type": "response.create", "model": MODEL, **body})))


def text_answer(s: Session, fx: Effects, *, finish: str = "stop") -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(s, InferenceChunk(turn.turn_id, [Prefilled(7, 0, 0, 1), TextDelta("Hi", 1)]))
    out += handled(s, InferenceChunk(turn.turn_id, [TextDelta(" there", 1), Done(finish, 2, 2.0)]))
    return out


def call_answer(s: Session, fx: Effects) -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(
        s,
        InferenceChunk(
            turn.turn_id, [Prefilled(7, 0, 0, 1), FunctionCallDelta(0, "read_file", '{"path":', 2)]
        ),
    )
    out += handled(
        s,
        InferenceChunk(
            turn.turn_id, [FunctionCallDelta(0, "read_file", '"a.py"}', 3), Done("tool_calls", 5, 5.0)]
        ),
    )
    return out


def failed(s: Session, fx: Effects) -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(s, InferenceFailed(turn.turn_id, RuntimeError("backend down")))
    return out


def steered(s: Session, fx: Effects) -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(s, InferenceChunk(turn.turn_id, [Prefilled(7, 0, 0, 1), TextDelta("Hel", 1)]))
    out += handled(
        s,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.steer",
                    "previous_response_id": turn.builder.response.id,
                    "input": "Summarise instead",
                }
            )
        ),
    )
    return out


def warm_up(s: Session, fx: Effects) -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(s, InferenceChunk(turn.turn_id, [Prefilled(7, 0, 0, 1), Done("stop", 0, 0.0)]))
    return out


SCENARIOS = {
    "text answer": (dict(input="Say hello"), text_answer),
    "function call": (dict(input="Read it", tools=[TOOL]), call_answer),
    "incomplete at max_output_tokens": (
        dict(input="Write", max_output_tokens=2),
        lambda s, fx: text_answer(s, fx, finish="max_output_tokens"),
    ),
    "failed after created": (dict(input="x"), failed),
    "steered, then the successor starts": (dict(input="Write at length"), steered),
    "warm-up (generate:false)": (dict(input="warm", generate=False), warm_up),
    "named lane": (dict(input="x", stream_id="lane-a"), text_answer),
    "every echoed setting": (
        dict(
            input="x",
            instructions="be brief",
            temperature=0.5,
            top_p=0.9,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            top_logprobs=3,
            max_output_tokens=64,
            max_tool_calls=2,
            parallel_tool_calls=False,
            metadata={"k": "v"},
            truncation="auto",
            user="u-1",
            reasoning={"effort": "low"},
            text={"format": {"type": "json_object"}, "verbosity": "low"},
            service_tier="flex",
            prompt_cache_key="pk",
            safety_identifier="sid",
            tools=[TOOL],
            tool_choice={"type": "function", "name": "read_file"},
        ),
        call_answer,
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_event_validates_against_the_sdk_and_open_responses(name):
    body, play = SCENARIOS[name]
    s = session()
    fx = play(s, create(s, **body))
    check = Checker()
    events = [check.ws_event(encode(e)) for e in fx.events]
    assert events and not [e for e in events if e["type"] == "error"], events
    for event in fx.events:  # the same events as SSE frames (HTTP has no lanes and no steering)
        if event.stream_id is None and event.type not in EXTENSIONS:
            check.sse_event(sse_frame(event).split("data: ", 1)[1].strip())
        if hasattr(event, "response"):
            check.response(encode(event.response))
    assert check.total(SDK) and check.total(OPEN_RESPONSES)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda r: r["text"].update(verbosity=None), "$.text.verbosity"),  # the standard allows no null
        (lambda r: r.update(surprise=1), "'surprise' was unexpected"),  # a key it does not declare
        (lambda r: r["usage"].update(total_tokens="9"), "$.usage.total_tokens"),
        (lambda r: r["output"][0].update(type="note"), "$.output[0]"),
    ],
)
def test_the_open_responses_check_refuses_what_the_standard_does_not_allow(change, named):
    """The check is not blind: each change the SDK's types let pass (or not) the document refuses,
    and the failure names the field."""
    s = session()
    response = json.loads(encode(text_answer(s, create(s, input="x")).events[-1].response))
    Checker().response(json.dumps(response))
    change(response)
    with pytest.raises(AssertionError, match=re.escape(named)):
        Checker().open_responses(orv.response_schema(), response)


def test_the_response_object_carries_the_keys_open_responses_requires():
    required = {
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "temperature",
        "top_p",
        "service_tier",
        "text",
        "reasoning",
        "truncation",
        "tools",
        "tool_choice",
    }
    assert required <= set(ResponseObject.model_fields)
    s = session()
    (created, *_) = create(s, input="x").events
    r = created.response
    assert (r.presence_penalty, r.frequency_penalty, r.top_logprobs) == (0.0, 0.0, 0)
    assert (r.temperature, r.top_p, r.service_tier, r.reasoning) == (1.0, 1.0, "default", None)
    assert json.loads(encode(r))["text"] == {"format": {"type": "text"}, "verbosity": "medium"}


def test_echoed_settings_keep_every_key_of_their_schema():
    s = session()
    fx = create(
        s,
        input="x",
        presence_penalty=1.5,
        frequency_penalty=-2,
        top_logprobs=5,
        reasoning={"summary": "auto"},
        service_tier="auto",
        text={"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}},
    )
    r = json.loads(encode(fx.events[0].response))
    assert (r["presence_penalty"], r["frequency_penalty"], r["top_logprobs"]) == (1.5, -2, 5)
    assert r["reasoning"] == {"effort": None, "summary": "auto"}
    assert r["service_tier"] == "default", "the tier that served the request, not 'auto'"
    assert r["text"]["format"] == {
        "type": "json_schema",
        "name": "answer",
        "schema": {"type": "object"},
        "description": None,
        "strict": False,
    }


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", "0"),
        ("service_tier", "gold"),
        ("reasoning", {"effort": "extreme"}),
        ("text", {"format": {"type": "yaml"}}),
        ("text", {"format": {"type": "json_schema", "schema": {}}}),
        ("top_logprobs", 21),
    ],
)
def test_settings_the_response_echoes_are_validated_on_the_way_in(field, value):
    with pytest.raises(InvalidRequest) as err:
        parse_http_create(json.dumps({"model": MODEL, "input": "x", field: value}))
    assert err.value.param.startswith(field) and err.value.status == 400


# ----------------------------------------------------------------- stored and listed items

LISTED_INPUTS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello, how can I help?"},
    {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "phase": "final_answer",
        "content": [{"type": "output_text", "text": "Listed part"}],
    },
    {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "file_id": "file-1"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-2", "filename": "a.txt"},
        ],
    },
    {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "data"},
    {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "data"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}]},
    {"type": "compaction", "encrypted_content": "abc"},
]


def listed(raw_items: list[dict]) -> list[dict]:
    return [item_dict(item, f"item_{i}") for i, item in enumerate(parse_items(raw_items))]


def test_an_assistant_message_in_the_input_lists_as_an_output_message_with_annotations():
    user, assistant = listed(LISTED_INPUTS[:2])
    assert assistant["content"] == [
        {"type": "output_text", "text": "Hello, how can I help?", "annotations": []}
    ]
    assert user["content"] == [{"type": "input_text", "text": "Hi"}]
    sdk_item = TypeAdapter(ResponseItem).validate_python(assistant, strict=True)
    assert type(sdk_item).__name__ == "ResponseOutputMessage" and sdk_item.content[0].annotations == []


def test_every_listed_input_item_validates_against_both_schemas_and_reads_back():
    items = listed(LISTED_INPUTS)
    page = ItemList(data=items, first_id=items[0]["id"], last_id=items[-1]["id"], has_more=False)
    check = Checker()
    check.item_list(encode(page))
    assert sum(check.counts[(OPEN_RESPONSES, c)] for c in set(orv.item_schemas().values())) == len(
        LISTED_INPUTS
    )
    image = items[4]["content"][1]
    assert image == {"type": "input_image", "detail": "auto", "image_url": None, "file_id": "file-1"}
    assert set(orv.item_schemas()) >= {i["type"] for i in items}
    # The stored form is also the context a continuation reads back (strictly).
    assert [item_dict(i, "x") for i in parse_items(items)] == items


def test_an_item_reference_is_stored_as_sent_and_reads_back():
    (stored,) = listed([{"type": "item_reference", "id": "msg_1"}])
    assert stored == {"type": "item_reference", "id": "msg_1"}
    assert parse_items([stored])[0].id == "msg_1"


def test_compaction_output_validates_against_both_schemas():
    output, _ = compact(parse_items(LISTED_INPUTS))
    body = CompactedResponse(
        id="resp_1",
        created_at=1,
        output=output,
        usage=Usage(
            input_tokens=9, input_tokens_details=InputTokensDetails(), output_tokens=3, total_tokens=12
        ),
    )
    data = Checker().compacted(encode(body))
    assert [i["type"] for i in data["output"]] == ["message", "message", "compaction"]


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "exc",
    [
        InvalidRequest("Bad.", param="input"),
        PreviousResponseNotFound("resp_x"),
        ModelNotFound("gpt-x"),
        NotFound("Response with id 'resp_x' not found."),
        ServerError(),
        ValueError("internal"),
    ],
)
def test_http_error_bodies_validate_as_the_sdk_error_object_and_open_responses_error_payload(exc):
    _, body = http_error_body(exc)
    Checker().error_body(json.dumps(body))


def test_a_compact_request_without_model_is_a_400_missing_required_parameter():
    with pytest.raises(InvalidRequest) as err:
        parse_http_compact(json.dumps({"input": "x"}))
    assert (err.value.status, err.value.code, err.value.param) == (400, "missing_required_parameter", "model")
    with pytest.raises(InvalidRequest) as err:
        parse_http_compact(json.dumps({"model": 5}))
    assert (err.value.code, err.value.param) == ("invalid_type", "model")
    assert parse_http_compact(json.dumps({"model": MODEL, "input": "x"})).items[0].role == "user"
