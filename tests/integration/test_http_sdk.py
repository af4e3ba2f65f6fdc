"""HTTP mode and the response store, with the official openai SDK (docs/protocol.md §6, checks 30–33, 57–62)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import websockets
from openai import OpenAI
from openai.types.responses import ResponseItemList, ResponseOutputMessage

from tests.support.wire import TOOLS, outputs_for, raw_collect

MODEL = "emu-fast"


@pytest.fixture
def client(server_url):
    return OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)


def ws_turn(ws_url: str, key: str = "sk-test", **body) -> dict:
    async def main():
        async with websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
            return (await raw_collect(ws))[-1]

    return asyncio.run(main())


def test_check_57_create_returns_the_complete_response(client):
    resp = client.responses.create(model=MODEL, input="Say hi", tools=TOOLS)
    assert resp.status == "completed" and resp.object == "response" and resp.store is True
    assert resp.output[0].type == "function_call"
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


def test_check_58_sse_stream_in_spec_order_with_the_strict_helper(client):
    with client.responses.stream(model=MODEL, input="Tell me something") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert final.output_text and final.status == "completed"
    events = list(client.responses.create(model=MODEL, input="again", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_sse_frames_name_their_event_carry_no_stream_id_and_end_with_done(server_url):
    with httpx.stream(
        "POST",
        server_url + "/v1/responses",
        json={"model": MODEL, "input": "x", "stream": True},
        headers={"Authorization": "Bearer sk-test"},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        blocks = r.read().decode().strip().split("\n\n")
    assert blocks.pop() == "data: [DONE]", "Open Responses ends the stream with [DONE]"
    for block in blocks:
        event_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}" and "stream_id" not in data and "error" not in data


def test_check_59_60_33_chain_retrieve_delete_and_store_false(client):
    first = client.responses.create(model=MODEL, input="Read the file", tools=TOOLS)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, input=outputs_for(first.model_dump())
    )
    assert second.previous_response_id == first.id and second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    quiet = client.responses.create(model=MODEL, input="not stored", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(quiet.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="x", previous_response_id=quiet.id)
    assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"


def test_check_61_input_items_newest_first_with_pagination(client):
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    resp = client.responses.create(model=MODEL, input=items)
    page = client.responses.input_items.list(resp.id, limit=2)

    def texts(page):
        return [item.content[0].text for item in page.data]

    assert texts(page) == ["message 4", "message 3"] and page.has_more is True
    rest = client.responses.input_items.list(resp.id, limit=10, after=page.last_id)
    assert texts(rest) == ["message 2", "message 1", "message 0"] and rest.has_more is False
    asc = client.responses.input_items.list(resp.id, order="asc", limit=100)
    assert texts(asc)[0] == "message 0"
    assert all(i.id and i.status == "completed" for i in asc.data)


def test_input_items_of_a_response_whose_input_held_an_assistant_message(client):
    """The SDK reads a listed assistant message as its ``ResponseOutputMessage``, whose
    ``output_text`` parts need ``annotations``: a string or a part without them is listed
    complete (regression: it used to list ``{"type": "output_text", "text": …}`` only)."""
    resp = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "My name is Alice."},
            {"role": "assistant", "content": "Hello Alice!"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "How can I help?"}]},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    raw = client.responses.input_items.with_raw_response.list(resp.id, order="asc")
    ResponseItemList.model_validate_json(raw.http_response.text, strict=True)
    page = raw.parse()
    _, string, parts, _ = page.data
    for item, text in ((string, "Hello Alice!"), (parts, "How can I help?")):
        assert isinstance(item, ResponseOutputMessage) and item.status == "completed"
        assert item.content[0].text == text and item.content[0].annotations == []


def test_check_62_stream_id_and_generate_are_rejected_over_http(client):
    for field, value in (("stream_id", "a"), ("generate", False)):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=MODEL, input="x", extra_body={field: value})
        assert err.value.code == "unknown_parameter" and err.value.param == field


def test_http_errors_are_typed(client, server_url):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="gpt-nope", input="x")
    assert err.value.code == "model_not_found"
    r = httpx.post(
        server_url + "/v1/responses", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(server_url + "/v1/responses", json={"model": MODEL, "input": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = httpx.get(server_url + "/v1/responses/resp_x/input_items", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


def test_compact_output_starts_a_new_chain(client):
    first = client.responses.create(model=MODEL, input="Fix the bug in app.py", tools=TOOLS)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=TOOLS,
        input=outputs_for(first.model_dump(), "def f(): return 1\n" * 50),
    )
    compacted = client.responses.compact(model=MODEL, previous_response_id=second.id)
    assert compacted.object == "response.compaction"
    window = [item.model_dump(exclude_none=True) for item in compacted.output]
    assert window[0]["role"] == "user" and window[-1]["type"] == "compaction"
    assert compacted.usage.output_tokens < compacted.usage.input_tokens
    fresh = client.responses.create(model=MODEL, input=window, tools=TOOLS)
    assert fresh.status == "completed" and fresh.usage.input_tokens < second.usage.input_tokens


def test_check_30_32_cross_transport_chain_http_ws_http(client, ws_url):
    h1 = client.responses.create(model=MODEL, input="Start over HTTP", tools=TOOLS)
    w2 = ws_turn(ws_url, previous_response_id=h1.id, tools=TOOLS, input=outputs_for(h1.model_dump()))
    assert w2["type"] == "response.completed" and w2["response"]["previous_response_id"] == h1.id
    w2r = w2["response"]
    h3 = client.responses.create(
        model=MODEL, previous_response_id=w2r["id"], tools=TOOLS, input=outputs_for(w2r)
    )
    assert h3.status == "completed" and h3.usage.input_tokens > w2r["usage"]["input_tokens"]
    # A stored non-latest id still continues (from the store), on a new socket too.
    again = ws_turn(ws_url, previous_response_id=h1.id, tools=TOOLS, input=outputs_for(h1.model_dump()))
    assert again["type"] == "response.completed"
