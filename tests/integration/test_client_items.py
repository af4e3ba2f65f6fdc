"""The input items real clients send (docs/protocol.md §2.2), through the real server: a
full history of every shape is accepted on a socket and over HTTP, answered, stored and
listed back as sent; the model's custom tool call streams events the SDK reads strictly."""

from __future__ import annotations

import asyncio
import json

import httpx
import websockets

from actors.protocol import item_dict, parse_items
from tests.actors.test_input_items import GOAL, PATCH_TOOL, TOOL_ITEMS
from tests.support.wire import raw_collect

MODEL = "emu-fast"
HISTORY = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the parser"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAA"},
    {
        "type": "message",
        "role": "assistant",
        "phase": "commentary",
        "content": [{"type": "output_text", "text": "Looking."}],
    },
    {
        "type": "function_call",
        "call_id": "call_f",
        "name": "spawn",
        "namespace": "multi_agent_v1",
        "arguments": "{}",
    },
    {"type": "function_call_output", "call_id": "call_f", "output": "spawned"},
    GOAL,
    {
        "type": "custom_tool_call",
        "call_id": "call_p",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch",
    },
    {"type": "custom_tool_call_output", "call_id": "call_p", "output": "apply_patch verification failed"},
    *TOOL_ITEMS,
]
# (An item reference must name an item the server holds: tests/integration/test_item_references.py.)
# Every tool call of the model, whichever it picks; no tool rounds are left, so it answers.
TOOLS = [PATCH_TOOL, {"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


def test_a_full_history_of_every_shape_is_answered_over_http_and_listed_as_sent(server_url):
    body = {"model": MODEL, "input": HISTORY, "tools": TOOLS, "metadata": {"emulator.tool_rounds": "0"}}
    with httpx.Client(base_url=server_url, headers={"Authorization": "Bearer sk-items"}, timeout=30) as http:
        r = http.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        response = r.json()
        assert response["status"] == "completed" and response["output"][0]["type"] == "message"
        listed = http.get(
            f"/v1/responses/{response['id']}/input_items", params={"order": "asc", "limit": 100}
        )
    items = listed.json()["data"]
    assert len(items) == len(HISTORY)
    for sent, stored, parsed in zip(HISTORY, items, parse_items(HISTORY)):
        assert stored == item_dict(parsed, stored.get("id", "")), sent  # every field kept


def test_on_a_socket_the_history_is_accepted_and_a_custom_call_is_answered_by_its_output(ws_url):
    async def main():
        async with websockets.connect(ws_url, additional_headers={"Authorization": "Bearer sk-items"}) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": False,
                        "input": HISTORY,
                        "tools": [PATCH_TOOL],
                        "tool_choice": "required",
                    }
                )
            )
            first = await raw_collect(ws)  # every frame validated strictly as an SDK event
            call = first[-1]["response"]["output"][0]
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": False,
                        "previous_response_id": first[-1]["response"]["id"],
                        "tools": [PATCH_TOOL],
                        "tool_choice": "none",
                        "input": [
                            {
                                "type": "custom_tool_call_output",
                                "call_id": call["call_id"],
                                "output": "verification failed",
                            }
                        ],
                    }
                )
            )
            return first, call, await raw_collect(ws)

    first, call, second = asyncio.run(main())
    kinds = [e["type"] for e in first]
    assert (
        "response.custom_tool_call_input.delta" in kinds and "response.custom_tool_call_input.done" in kinds
    )
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert call["input"].startswith("*** Begin Patch\n*** Update File: emulator-scratch-")
    assert second[-1]["type"] == "response.completed", second[-1]
    # The continuation's prompt is the whole conversation: the history, the call, its output.
    assert second[-1]["response"]["usage"]["input_tokens"] > first[-1]["response"]["usage"]["input_tokens"]
