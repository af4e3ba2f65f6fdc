"""The conformance corpus: scenarios driven against the real embedded server over HTTP JSON,
SSE and WebSocket, where each applies, and every object the server emits — Responses,
streaming events, item lists, compaction results, error bodies and error events — validated
strictly against both the openai SDK's types and the Open Responses OpenAPI document itself
(:mod:`tests.support.schemas`; docs/protocol.md §3, §6, §10).

Where the server departs from the Open Responses document on purpose, the checker names the
departure and its reason: ``stream_id`` on named lanes, the steering events (SDK only), a
``json_schema`` text format's echoed ``schema``, echoed hosted tools, and the few keys the
document does not declare (:data:`tests.support.schemas.EXTRA_KEYS`).

Run with ``-s`` to see how many objects each schema validated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI
from websockets.sync.client import connect

from bench.client import FINAL_EVENT_TYPES
from tests.support.schemas import HOSTED_TOOL_LEFT_OUT, OPEN_RESPONSES, SCHEMA_READ_AS_NULL, SDK, Checker

MODEL = "emu-fast"
AUTH = {"Authorization": "Bearer sk-test"}
SHORT = {"emulator.text_tokens": "12"}  # short text answers keep the corpus fast

# A tool whose schema has nested objects, enums, arrays of enums and of objects, and a
# nullable number: the arguments the model writes must validate against it.
TICKET = {
    "type": "function",
    "name": "create_ticket",
    "description": "File a ticket in the tracker",
    "strict": True,
    "parameters": {
        "type": "object",
        "additionalProperties": False,
        "required": ["title", "priority", "labels", "assignee", "steps", "estimate"],
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 80},
            "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
            "labels": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "uniqueItems": True,
                "items": {"type": "string", "enum": ["bug", "docs", "perf", "security"]},
            },
            "assignee": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "team"],
                "properties": {
                    "name": {"type": "string"},
                    "team": {"type": "string", "enum": ["core", "infra", "web"]},
                    "backup": {"type": ["string", "null"]},
                },
            },
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["order", "action"],
                    "properties": {
                        "order": {"type": "integer", "minimum": 1, "maximum": 10},
                        "action": {"type": "string"},
                        "blocking": {"type": "boolean"},
                    },
                },
            },
            "estimate": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 40}, {"type": "null"}]},
        },
    },
}
LOOKUP = {
    "type": "function",
    "name": "lookup_user",
    "description": "Find a user by e-mail",
    "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
}


# --------------------------------------------------------------------------- transports


@pytest.fixture(scope="module")
def check() -> Iterator[Checker]:
    checker = Checker()
    yield checker
    print(
        f"\nconformance corpus: {len(RUNS)} scenario runs, "
        f"{checker.total(SDK)} objects valid as the openai SDK's types, "
        f"{checker.total(OPEN_RESPONSES)} valid as Open Responses\n{checker.summary()}"
    )


RUNS: set[tuple[str, str]] = set()


@dataclass
class Outcome:
    """What one create produced: a status, the events (streams) and the final Response, or an error."""

    status: int
    events: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


OMIT = "<omitted>"  # a body value that means "leave the key out"


def payload(body: dict, **extra: Any) -> dict:
    """The create body: ``model`` defaults to :data:`MODEL`; keys set to :data:`OMIT` are left out."""
    return {k: v for k, v in {"model": MODEL, **body, **extra}.items() if v != OMIT}


@pytest.fixture(scope="module")
def http(server_url) -> Iterator[httpx.Client]:
    """The corpus's HTTP client (one for the module: a client per request costs more than
    the request)."""
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=120) as client:
        yield client


def http_json(http: httpx.Client, check: Checker, body: dict) -> Outcome:
    r = http.post("/v1/responses", json=payload(body))
    if r.status_code != 200:
        return Outcome(r.status_code, error=check.error_body(r.content)["error"])
    return Outcome(200, response=check.response(r.content))


def http_sse(http: httpx.Client, check: Checker, body: dict) -> Outcome:
    with http.stream("POST", "/v1/responses", json=payload(body, stream=True)) as r:
        raw = r.read()
    if r.status_code != 200:  # refused before the stream started: a JSON error body
        return Outcome(r.status_code, error=check.error_body(raw)["error"])
    assert r.headers["content-type"].startswith("text/event-stream")
    blocks = raw.decode().strip().split("\n\n")
    assert blocks.pop() == "data: [DONE]", "Open Responses: the stream ends with [DONE]"
    events = []
    for block in blocks:
        event_line, data_line = block.split("\n")
        event = check.sse_event(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        events.append(event)
    return Outcome(200, events=events, response=events[-1].get("response"))


class Socket:
    """A raw WebSocket client: every text frame is validated as it arrives."""

    def __init__(self, ws_url: str, check: Checker) -> None:
        self._ws = connect(ws_url, additional_headers=AUTH, max_size=None)
        self._check = check

    def __enter__(self) -> Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self._ws.close()

    def send(self, frame: dict) -> None:
        self._ws.send(json.dumps(frame))

    def create(self, **body: Any) -> None:
        self.send({"type": "response.create", **payload(body)})

    def recv(self) -> dict[str, Any]:
        raw = self._ws.recv(timeout=120)
        assert isinstance(raw, str), "server frames are text frames"
        return self._check.ws_event(raw)

    def until(self, terminals: int = 1) -> list[dict[str, Any]]:
        events, ended = [], 0
        while ended < terminals:
            events.append(self.recv())
            ended += events[-1]["type"] in FINAL_EVENT_TYPES
        return events

    def turn(self, **body: Any) -> Outcome:
        self.create(**body)
        events = self.until()
        last = events[-1]
        if last["type"] == "error":
            return Outcome(last["status"], events=events, error=last["error"])
        return Outcome(200, events=events, response=last["response"])


def websocket(ws_url: str, check: Checker, body: dict) -> Outcome:
    with Socket(ws_url, check) as ws:
        return ws.turn(**body)


TRANSPORTS = ("http", "sse", "ws")


@pytest.fixture
def run(http, ws_url, check):
    """``run(transport, body)``: one create over ``"http"`` (JSON), ``"sse"`` or ``"ws"``."""

    def play(transport: str, body: dict, scenario: str) -> Outcome:
        RUNS.add((scenario, transport))
        if transport == "http":
            return http_json(http, check, body)
        if transport == "sse":
            return http_sse(http, check, body)
        return websocket(ws_url, check, body)

    return play


# --------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_text_answer(run, transport):
    out = run(transport, {"input": "Say hello in three words.", "metadata": SHORT}, "text answer")
    resp = out.response
    assert resp["status"] == "completed" and resp["output"][0]["type"] == "message"
    part = resp["output"][0]["content"][0]
    assert part["type"] == "output_text" and part["text"] and part["annotations"] == []
    assert (resp["presence_penalty"], resp["frequency_penalty"], resp["top_logprobs"]) == (0, 0, 0)
    if transport != "http":
        deltas = "".join(e["delta"] for e in out.events if e["type"] == "response.output_text.delta")
        assert deltas == part["text"]


# A 1x1 PNG: the emulated model does not look at images, the server must still take the part.
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_conversation_with_a_system_prompt_an_image_and_history(run, transport):
    """The shapes of the Open Responses compliance suite's requests: a system message,
    ``type: message`` items with string content, an image part, an assistant turn."""
    out = run(
        transport,
        {
            "metadata": SHORT,
            "input": [
                {"type": "message", "role": "system", "content": "You are a pirate."},
                {"type": "message", "role": "user", "content": "My name is Alice."},
                {"type": "message", "role": "assistant", "content": "Ahoy Alice!"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in this picture, and what is my name?"},
                        {"type": "input_image", "image_url": PIXEL},
                    ],
                },
            ],
        },
        "conversation",
    )
    assert out.response["status"] == "completed" and out.response["output"][0]["type"] == "message"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_function_calls_with_a_rich_json_schema(run, transport):
    out = run(
        transport,
        {
            "input": "File a ticket for the flaky test",
            "tools": [TICKET, LOOKUP],
            "tool_choice": {"type": "function", "name": "create_ticket"},
        },
        "function call",
    )
    resp = out.response
    (call,) = resp["output"]
    assert (
        call["type"] == "function_call" and call["name"] == "create_ticket" and call["status"] == "completed"
    )
    jsonschema.validate(json.loads(call["arguments"]), TICKET["parameters"])
    assert [t["name"] for t in resp["tools"]] == ["create_ticket", "lookup_user"]
    assert resp["tools"][0]["parameters"] == TICKET["parameters"]
    assert resp["tool_choice"] == {"type": "function", "name": "create_ticket"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hosted_tool_is_echoed_and_never_called(run, check, transport):
    """Codex and the SDKs offer hosted tools (``web_search``…) beside function tools: the
    Response echoes them as the hosted API does, and Open Responses, which knows function
    tools only, validates the Response without them (counted under the checker's extensions)."""
    before = check.extensions[HOSTED_TOOL_LEFT_OUT]
    out = run(
        transport,
        {
            "input": "Who is bob@example.com?",
            "tools": [{"type": "web_search"}, LOOKUP],
            "metadata": {"emulator.tool_rounds": "1"},
        },
        "hosted tool",
    )
    (call,) = out.response["output"]
    assert call["type"] == "function_call" and call["name"] == "lookup_user"
    assert [t["type"] for t in out.response["tools"]] == ["web_search", "function"]
    assert check.extensions[HOSTED_TOOL_LEFT_OUT] > before


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_function_call_then_its_output(run, transport):
    """The agent loop: the call's output goes back with ``previous_response_id`` (each
    create here is a new request or socket, so the parent comes from the store)."""
    first = run(
        transport,
        {
            "input": "Who is bob@example.com?",
            "tools": [LOOKUP],
            "metadata": {"emulator.tool_rounds": "1", **SHORT},
        },
        "function call output",
    )
    (call,) = first.response["output"]
    second = run(
        transport,
        {
            "previous_response_id": first.response["id"],
            "tools": [LOOKUP],
            "metadata": {"emulator.tool_rounds": "1", **SHORT},
            "input": [
                {"type": "function_call_output", "call_id": call["call_id"], "output": '{"name": "Bob"}'}
            ],
        },
        "function call output",
    )
    resp = second.response
    assert resp["status"] == "completed" and resp["previous_response_id"] == first.response["id"]
    assert resp["output"][0]["type"] == "message"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_echoed_setting(run, transport):
    """Settings the Response echoes keep every key both schemas require."""
    out = run(
        transport,
        {
            "input": "x",
            "metadata": {**SHORT, "team": "core"},
            "instructions": "Be brief.",
            "temperature": 0.2,
            "top_p": 0.5,
            "presence_penalty": 0.25,
            "frequency_penalty": -0.5,
            "top_logprobs": 2,
            "max_output_tokens": 200,
            "max_tool_calls": 3,
            "parallel_tool_calls": False,
            "truncation": "auto",
            "reasoning": {"effort": "low"},
            "service_tier": "auto",
            "text": {"format": {"type": "json_object"}, "verbosity": "low"},
            "prompt_cache_key": "corpus",
            "safety_identifier": "user-42",
            "user": "u-1",
        },
        "echoed settings",
    )
    resp = out.response
    assert (resp["presence_penalty"], resp["frequency_penalty"], resp["top_logprobs"]) == (0.25, -0.5, 2)
    assert resp["reasoning"] == {"effort": "low", "summary": None}
    assert resp["text"] == {"format": {"type": "json_object"}, "verbosity": "low"}
    assert resp["service_tier"] == "default" and resp["truncation"] == "auto"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_structured_output_echoes_its_json_schema(run, http, check, transport):
    """The ``json_schema`` format is echoed with its schema, as the SDK requires; Open
    Responses types that ``schema`` as null, so it validates the echo with a null schema
    (counted under the checker's extensions).  The stored Response reads back the same."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    before = check.extensions[SCHEMA_READ_AS_NULL]
    out = run(
        transport,
        {
            "input": "x",
            "metadata": SHORT,
            "text": {"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}},
        },
        "structured output",
    )
    assert out.response["text"]["format"] == {
        "type": "json_schema",
        "name": "reply",
        "schema": schema,
        "description": None,
        "strict": True,
    }
    assert check.extensions[SCHEMA_READ_AS_NULL] > before
    stored = http.get(f"/v1/responses/{out.response['id']}")
    assert check.response(stored.content) == out.response


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_incomplete_at_max_output_tokens(run, transport):
    out = run(
        transport,
        {"input": "Write at length", "max_output_tokens": 8, "metadata": {"emulator.text_tokens": "40"}},
        "incomplete",
    )
    resp = out.response
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["output"][0]["status"] == "incomplete" and resp["usage"]["output_tokens"] == 8
    if transport != "http":
        assert out.events[-1]["type"] == "response.incomplete"


ERRORS = {
    # scenario: (body, status, code, param)
    "bad request: input of the wrong type": ({"input": 5}, 400, "invalid_type", "input"),
    "bad request: an unknown message role": (
        {"input": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_value",
        "input[0].role",
    ),
    "bad request: an out-of-range setting": (
        {"input": "x", "presence_penalty": 3},
        400,
        "invalid_value",
        "presence_penalty",
    ),
    "unknown previous_response_id": (
        {"input": "x", "previous_response_id": "resp_unknown"},
        400,
        "previous_response_not_found",
        "previous_response_id",
    ),
    "bad request: no model": ({"input": "x", "model": OMIT}, 400, "missing_required_parameter", "model"),
    "unknown model": ({"input": "x", "model": "gpt-nope"}, 404, "model_not_found", "model"),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scenario", ERRORS)
def test_errors(run, transport, scenario):
    body, status, code, param = ERRORS[scenario]
    out = run(transport, body, scenario)
    assert out.status == status and out.response is None
    assert (out.error["type"], out.error["code"], out.error["param"]) == (
        "invalid_request_error",
        code,
        param,
    )
    if transport == "ws":
        assert [e["type"] for e in out.events] == ["error"], "no response.created for a refused create"


def test_steering_a_long_in_flight_text_response(ws_url, check):
    """WebSocket only.  The steered response ends ``incomplete`` (``steered``) and its
    successor runs; the ``response.steer.*`` frames are an extension (SDK schema only)."""
    RUNS.add(("steering", "ws"))
    with Socket(ws_url, check) as ws:
        # emu-gpu at ~65 tokens/s: ~3 s of text, still streaming when the steer arrives (sent
        # at its first delta); the successor inherits the metadata, so it streams as long.
        ws.create(
            model="emu-gpu", input="Write at length", store=False, metadata={"emulator.text_tokens": "200"}
        )
        target = ws.recv()["response"]["id"]
        while ws.recv()["type"] != "response.output_text.delta":
            pass
        ws.send(
            {"type": "response.steer", "previous_response_id": target, "input": "Stop, summarise instead"}
        )
        events = ws.until(2)  # the steered response, then its successor
    types = [e["type"] for e in events]
    accepted = events[types.index("response.steer.accepted")]
    assert accepted["steer"]["previous_response_id"] == target
    steered = events[types.index("response.incomplete")]["response"]
    assert steered["id"] == target and steered["incomplete_details"] == {"reason": "steered"}
    successor = events[-1]["response"]
    assert successor["previous_response_id"] == target and successor["status"] == "completed"
    assert check.extensions["response.steer.accepted"] >= 1


def test_a_warm_up_then_a_turn_that_reuses_it(ws_url, check):
    """WebSocket only (``generate`` is rejected over HTTP): ``generate:false`` prefills and
    completes with no output; the next turn continues from it."""
    RUNS.add(("warm-up", "ws"))
    with Socket(ws_url, check) as ws:
        warm = ws.turn(input="Here is the repository layout. " * 250, generate=False, store=False)
        assert [e["type"] for e in warm.events] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        assert warm.response["output"] == [] and warm.response["usage"]["output_tokens"] == 0
        after = ws.turn(input="Go", store=False, previous_response_id=warm.response["id"], metadata=SHORT)
    assert after.response["status"] == "completed"
    assert after.response["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_named_lanes(ws_url, check):
    """WebSocket only: two lanes interleave on one socket; every event carries its lane's
    ``stream_id``, an extension Open Responses does not know (validated with it removed)."""
    RUNS.add(("lanes", "ws"))
    with Socket(ws_url, check) as ws:
        ws.create(input="one", stream_id="lane-a", store=False, metadata=SHORT)
        ws.create(input="two", stream_id="lane-b", store=False, tools=[TICKET])
        ws.create(input="three", stream_id="lane-c", previous_response_id="resp_unknown")
        events = ws.until(3)
    by_lane: dict[str, list[str]] = {}
    for event in events:
        by_lane.setdefault(event["stream_id"], []).append(event["type"])
    assert by_lane["lane-a"][-1] == by_lane["lane-b"][-1] == "response.completed"
    assert by_lane["lane-c"] == ["error"]


def test_compaction(server_url, http, check):
    """HTTP only: ``POST /v1/responses/compact`` returns the user messages and one
    ``compaction`` item; sent back as input, the window starts a new chain."""
    RUNS.add(("compaction", "http"))
    client = OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)
    first = client.responses.create(
        model=MODEL, input="Fix the bug in app.py", tools=[LOOKUP], metadata={"emulator.tool_rounds": "1"}
    )
    call = first.output[0]
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[LOOKUP],
        metadata=SHORT,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "def f(): return 1\n" * 20}
        ],
    )
    post = lambda path, body: http.post(path, json=body)  # noqa: E731
    r = post(
        "/v1/responses/compact", {"model": MODEL, "previous_response_id": second.id, "input": "and now?"}
    )
    assert r.status_code == 200
    compacted = check.compacted(r.content)
    window = compacted["output"]
    assert [i["type"] for i in window] == ["message", "message", "compaction"]
    assert [i["role"] for i in window[:2]] == ["user", "user"]
    fresh = post("/v1/responses", {"model": MODEL, "input": window, "metadata": SHORT})
    assert check.response(fresh.content)["status"] == "completed"
    for body, status, code, param in (
        ({"input": "x"}, 400, "missing_required_parameter", "model"),
        ({"model": 7, "input": "x"}, 400, "invalid_type", "model"),
        ({"model": "gpt-nope", "input": "x"}, 404, "model_not_found", "model"),
        (
            {"model": MODEL, "previous_response_id": "resp_unknown"},
            400,
            "previous_response_not_found",
            "previous_response_id",
        ),
    ):
        r = post("/v1/responses/compact", body)
        error = check.error_body(r.content)["error"]
        assert (r.status_code, error["code"], error["param"]) == (status, code, param)


def test_input_items_listing(server_url, http, check):
    """HTTP only: every kind of input item lists with an ``id`` and a ``status``, messages
    with complete parts; pages validate as the SDK's ``ResponseItemList``."""
    RUNS.add(("input_items", "http"))
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in this picture?"},
                {"type": "input_image", "image_url": "https://example.com/cat.png"},
            ],
        },
        {"role": "assistant", "content": "A cat."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup_user",
            "arguments": '{"email": "a@b.c"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"name": "Ann"}'},
        {"role": "user", "content": "Thanks"},
    ]
    created = http.post(
        "/v1/responses", json={"model": MODEL, "input": items, "tools": [LOOKUP], "metadata": SHORT}
    )
    resp_id = check.response(created.content)["id"]
    listed = []
    after = None
    while True:
        params = {"order": "asc", "limit": 4, **({"after": after} if after else {})}
        r = http.get(f"/v1/responses/{resp_id}/input_items", params=params)
        page = check.item_list(r.content)
        listed += page["data"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [i["type"] for i in listed] == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert all(i["id"] and i["status"] == "completed" for i in listed)
    assert listed[1]["content"][1] == {
        "type": "input_image",
        "detail": "auto",
        "image_url": "https://example.com/cat.png",
        "file_id": None,
    }
    assert listed[2]["content"] == [{"type": "output_text", "text": "A cat.", "annotations": []}]
    # Through the SDK: the assistant message is an output message with its annotations.
    client = OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)
    assert client.responses.input_items.list(resp_id, order="asc").data[2].content[0].annotations == []


def test_retrieve_and_delete(http, check):
    """HTTP only: a stored Response reads back in the same shape; 404s are error bodies."""
    RUNS.add(("retrieve and delete", "http"))
    created = check.response(
        http.post("/v1/responses", json={"model": MODEL, "input": "x", "metadata": SHORT}).content
    )
    url = f"/v1/responses/{created['id']}"
    assert check.response(http.get(url).content) == created
    deleted = http.delete(url)
    assert deleted.json() == {"id": created["id"], "object": "response.deleted", "deleted": True}
    for r in (http.get(url), http.delete(url)):
        assert (
            r.status_code == 404 and check.error_body(r.content)["error"]["type"] == "invalid_request_error"
        )
