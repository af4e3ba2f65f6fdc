"""The opt-in ``response.append`` rollout mode: one response per rollout, over a real socket."""

from __future__ import annotations

import asyncio
import json

import websockets

from bench.client import FINAL_EVENT_TYPES
from tests.support.wire import TOOLS, validated

MODEL = "emu-fast"


async def rollout(url: str, rounds: int) -> list[dict]:
    events = []
    async with websockets.connect(url) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "Fix the bug",
                    "tools": TOOLS,
                    "store": False,
                    "metadata": {"emulator.tool_rounds": str(rounds)},
                }
            )
        )
        while True:
            ev = validated(await ws.recv())
            events.append(ev)
            if ev["type"] in FINAL_EVENT_TYPES:
                return events
            if ev["type"] == "response.output_item.done" and ev["item"]["type"] == "function_call":
                await ws.send(
                    json.dumps(
                        {
                            "type": "response.append",
                            "response_id": events[0]["response"]["id"],
                            "input": [
                                {
                                    "type": "function_call_output",
                                    "call_id": ev["item"]["call_id"],
                                    "output": "print('hello')",
                                }
                            ],
                        }
                    )
                )


def test_a_rollout_is_one_response_paused_on_each_tool_call(ws_url):
    events = asyncio.run(rollout(ws_url + "?mode=append", rounds=3))
    assert [e["type"] for e in events].count("response.created") == 1
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["function_call"] * 3 + ["message"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_the_header_opts_in_too_and_standard_connections_are_unaffected(ws_url):
    async def standard():
        async with websockets.connect(ws_url) as ws:
            await ws.send(
                json.dumps(
                    {"type": "response.create", "model": MODEL, "input": "x", "tools": TOOLS, "store": False}
                )
            )
            first = []
            while not first or first[-1]["type"] not in FINAL_EVENT_TYPES:
                first.append(validated(await ws.recv()))
            await ws.send(
                json.dumps(
                    {"type": "response.append", "response_id": first[0]["response"]["id"], "input": []}
                )
            )
            return first, validated(await ws.recv())

    first, err = asyncio.run(standard())
    assert first[-1]["type"] == "response.completed", "standard mode never pauses"
    assert err["error"]["code"] == "unknown_event_type"

    async def with_header():
        async with websockets.connect(ws_url, additional_headers={"X-Responses-WS-Mode": "append"}) as ws:
            await ws.send(
                json.dumps(
                    {"type": "response.create", "model": MODEL, "input": "x", "tools": TOOLS, "store": False}
                )
            )
            while True:
                ev = validated(await ws.recv())
                if ev["type"] == "response.output_item.done":
                    return ev, await asyncio.wait_for(ws.recv(), 0.5)

    try:
        asyncio.run(with_header())
        paused = False
    except TimeoutError:
        paused = True  # nothing follows the call: the response waits for response.append
    assert paused
