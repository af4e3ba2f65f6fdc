"""``item_reference`` through the real server (docs/protocol.md §2.2): a reference to an
item of a stored response is the item itself — the same prompt (input tokens) and the same
scripted answer as sending the item whole — on a socket, over HTTP with a JSON answer and
over HTTP with an SSE stream; a ``store:false`` response's items are referenced on the
socket that holds them and nowhere else; an unknown id is a typed 400 on every transport.
Every frame and body is validated against the SDK's types and the Open Responses schema."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import websockets

from bench.client import TERMINAL_EVENT_TYPES
from tests.support.schemas import Checker

MODEL = "emu-fast"
KEY = "sk-item-refs"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "12"}
QUESTION = {"role": "user", "content": "Tell me about Paris."}
FOLLOW_UP = {"role": "user", "content": "And what about Rome?"}


def body(input: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": input, "metadata": TEXT, "store": False, **extra}


async def over_websocket(ws_url: str, payloads: list[dict[str, Any]], check: Checker) -> list[dict[str, Any]]:
    """Each create on one socket; the terminal Response of each, or its ``error`` event."""
    out = []
    async with websockets.connect(ws_url, additional_headers=AUTH) as ws:
        for payload in payloads:
            await ws.send(json.dumps({"type": "response.create", **payload}))
            while True:
                event = check.ws_event(await ws.recv())
                if event["type"] == "error":
                    out.append(event)
                    break
                if event["type"] in TERMINAL_EVENT_TYPES:
                    out.append(event["response"])
                    break
    return out


def over_http(http: httpx.Client, payload: dict[str, Any], check: Checker) -> tuple[int, dict[str, Any]]:
    r = http.post("/v1/responses", json=payload)
    return r.status_code, (check.response(r.content) if r.status_code == 200 else check.error_body(r.content))


def over_sse(http: httpx.Client, payload: dict[str, Any], check: Checker) -> tuple[int, dict[str, Any]]:
    with http.stream("POST", "/v1/responses", json={**payload, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, check.error_body(r.content)
        terminal = None
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = check.sse_event(line.removeprefix("data: "))
                if event["type"].startswith("response.") and "response" in event:
                    terminal = event["response"]
        assert terminal is not None
        return 200, terminal


def text_of(response: dict[str, Any]) -> str:
    return "".join(
        part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"]
    )


def test_a_reference_to_a_stored_item_renders_as_the_item_itself_on_every_transport(server_url, ws_url):
    check = Checker()
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=30) as http:
        status, first = over_http(http, body([QUESTION], store=True), check)
        assert status == 200
        message = first["output"][0]
        inline = [QUESTION, {"role": "assistant", "content": text_of(first)}, FOLLOW_UP]
        by_ref = [QUESTION, {"type": "item_reference", "id": message["id"]}, FOLLOW_UP]
        untyped = [QUESTION, {"id": message["id"]}, FOLLOW_UP]
        answers = {}
        for name, items in (("inline", inline), ("ref", by_ref), ("untyped", untyped)):
            answers[f"http {name}"] = over_http(http, body(items, store=True), check)[1]
            answers[f"sse {name}"] = over_sse(http, body(items), check)[1]
        ws = asyncio.run(over_websocket(ws_url, [body(inline), body(by_ref), body(untyped)], check))
        answers.update(zip(("ws inline", "ws ref", "ws untyped"), ws))
        stored = answers["http ref"]["id"]
        listed = check.item_list(
            http.get(f"/v1/responses/{stored}/input_items", params={"order": "asc"}).content
        )
    assert all(a["status"] == "completed" for a in answers.values()), answers
    tokens = {name: a["usage"]["input_tokens"] for name, a in answers.items()}
    assert len(set(tokens.values())) == 1, tokens  # the same prompt everywhere: the item, not a placeholder
    assert len({text_of(a) for a in answers.values()}) == 1, "the same conversation, the same scripted answer"
    # The stored input lists the referenced item itself.
    assert [i["type"] for i in listed["data"]] == ["message", "message", "message"]
    assert listed["data"][1]["id"] == message["id"] and listed["data"][1]["role"] == "assistant"
    assert listed["data"][1]["content"][0]["text"] == text_of(first)


def test_store_false_items_are_referenced_on_their_socket_only_and_unknown_ids_are_a_typed_400(
    server_url, ws_url
):
    check = Checker()

    async def main():
        async with websockets.connect(ws_url, additional_headers=AUTH) as ws:

            async def turn(payload: dict[str, Any]) -> dict[str, Any]:
                await ws.send(json.dumps({"type": "response.create", **payload}))
                while True:
                    event = check.ws_event(await ws.recv())
                    if event["type"] in ("error", "response.completed"):
                        return event if event["type"] == "error" else event["response"]

            first = await turn(body([QUESTION]))
            ref = [QUESTION, {"type": "item_reference", "id": first["output"][0]["id"]}, FOLLOW_UP]
            await turn(body([FOLLOW_UP], stream_id="b"))  # another lane: still held by the connection
            same = await turn(body(ref))
        # A new socket never saw it: store:false items are kept by their connection only.
        other = await over_websocket(ws_url, [body(ref)], check)
        unknown = await over_websocket(
            ws_url, [body([QUESTION, {"type": "item_reference", "id": "msg_nope"}]), body([QUESTION])], check
        )
        return same, other, unknown

    same, other, unknown = asyncio.run(main())
    assert same["status"] == "completed"
    for error in (other[0], unknown[0]):
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "item_not_found" and error["error"]["param"] == "input[1]"
    assert unknown[1]["status"] == "completed", "the socket goes on"
    missing = body([QUESTION, {"type": "item_reference", "id": "msg_nope"}])
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=30) as http:
        for send in (over_http, over_sse):
            status, error = send(http, missing, check)
            assert status == 400 and error["error"]["code"] == "item_not_found", error
            assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == "input[1]"
