"""Lanes, forks and steering over a real socket with the official SDK (checks 38–46, 52–56)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from openai import OpenAI

from bench.client import FINAL_EVENT_TYPES
from tests.support.wire import TOOLS, outputs_for, validated

MODEL = "emu-fast"


@pytest.fixture
def client(server_url):
    return OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)


def drain(conn, terminals: int) -> list[dict]:
    """Frames until ``terminals`` responses (or errors) ended."""
    out, ended = [], 0
    while ended < terminals:
        ev = validated(conn.recv_bytes().decode())
        out.append(ev)
        ended += ev["type"] in FINAL_EVENT_TYPES
    return out


def test_check_41_seventeen_lanes_at_most_sixteen_in_flight_all_complete(client):
    with client.responses.connect() as conn:
        for i in range(17):
            conn.response.create(model=MODEL, input="hello", stream_id=f"lane{i}", store=False)
        events = drain(conn, 17)
    running, peak = set(), 0
    for ev in events:
        rid = ev.get("response", {}).get("id")
        if ev["type"] == "response.created":
            running.add(rid)
            peak = max(peak, len(running))
        elif ev["type"] in FINAL_EVENT_TYPES:
            running.discard(rid)
    assert peak == 16 and sum(e["type"] == "response.completed" for e in events) == 17


@pytest.mark.parametrize("store", [True, False], ids=["stored", "store_false"])
def test_check_41_never_more_than_sixteen_in_flight_as_the_client_reads_the_socket(ws_url, store):
    """The limit as the wire shows it: between a response's ``response.created`` and its
    terminal event, in the order a raw client reads the frames.  A stored response's terminal
    event waits for its record's write; the response counts as in flight until it is sent."""

    async def main() -> tuple[int, list[str]]:
        async with websockets.connect(ws_url, max_size=None) as ws:
            await asyncio.gather(
                *(
                    ws.send(
                        json.dumps(
                            {
                                "type": "response.create",
                                "model": MODEL,
                                "input": "hello",
                                "stream_id": f"lane{i}",
                                "store": store,
                            }
                        )
                    )
                    for i in range(17)
                )
            )
            running, peak, ends = set(), 0, []
            while len(ends) < 17:
                ev = validated(await asyncio.wait_for(ws.recv(), 60))
                rid = ev.get("response", {}).get("id")
                if ev["type"] == "response.created":
                    running.add(rid)
                    peak = max(peak, len(running))
                elif ev["type"] in FINAL_EVENT_TYPES:
                    running.discard(rid)
                    ends.append(ev["type"])
            return peak, ends

    peak, ends = asyncio.run(main())
    assert ends == ["response.completed"] * 17
    assert peak == 16


def test_check_44_46_a_fork_runs_with_the_parent_context_next_to_its_source_lane(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Read the code", tools=TOOLS, stream_id="main", store=False)
        parent = drain(conn, 1)[-1]["response"]
        conn.response.create(
            model=MODEL,
            stream_id="fork",
            store=False,
            previous_response_id=parent["id"],
            tools=TOOLS,
            input=outputs_for(parent, "fork view"),
        )
        conn.response.create(
            model=MODEL,
            stream_id="main",
            store=False,
            previous_response_id=parent["id"],
            tools=TOOLS,
            input=outputs_for(parent, "main view"),
        )
        conn.response.create(model="gpt-unknown", stream_id="broken", input="x")
        events = drain(conn, 3)
    by_lane = {e["stream_id"]: e for e in events if e["type"] in FINAL_EVENT_TYPES}
    assert by_lane["fork"]["type"] == by_lane["main"]["type"] == "response.completed"
    assert by_lane["fork"]["response"]["previous_response_id"] == parent["id"]
    assert by_lane["broken"]["type"] == "error", "an error on one lane leaves the others streaming"
    fork_usage = by_lane["fork"]["response"]["usage"]["input_tokens"]
    assert fork_usage > parent["usage"]["input_tokens"], "the fork saw the parent's context"


def test_check_52_53_steer_an_active_response(client):
    with client.responses.connect() as conn:
        # emu-gpu at ~65 tok/s: ~3 s of text, still streaming when the steer arrives (sent at
        # its first delta).  The successor inherits the metadata and streams as long: 400
        # tokens cost this test ~6 s.
        conn.response.create(
            model="emu-gpu", input="Write at length", store=False, metadata={"emulator.text_tokens": "200"}
        )
        first = validated(conn.recv_bytes().decode())
        target = first["response"]["id"]
        while validated(conn.recv_bytes().decode())["type"] != "response.output_text.delta":
            pass
        conn.response.steer(previous_response_id=target, input="Stop, summarise instead")
        events = []
        while not any(e["type"] == "response.created" for e in events):
            events.append(validated(conn.recv_bytes().decode()))
        successor = drain(conn, 1)[-1]
    types = [e["type"] for e in events]
    accepted = events[types.index("response.steer.accepted")]
    assert accepted["steer"]["previous_response_id"] == target and accepted["steer"]["id"].startswith(
        "steer_"
    )
    steered = events[types.index("response.incomplete")]["response"]
    assert steered["id"] == target and steered["incomplete_details"] == {"reason": "steered"}
    assert steered["usage"]["output_tokens"] < 200
    assert events[-1]["response"]["previous_response_id"] == target
    assert successor["type"] == "response.completed"


def test_check_54_55_steer_pending_after_function_calls_and_unknown_target(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Read it", tools=TOOLS, store=False)
        resp = drain(conn, 1)[-1]["response"]
        conn.response.steer(previous_response_id=resp["id"], input="and mind the tests")
        accepted, pending = (validated(conn.recv_bytes().decode()) for _ in range(2))
        conn.response.steer(previous_response_id="resp_nope", input="x")
        failed = validated(conn.recv_bytes().decode())
        conn.response.create(
            model=MODEL, tools=TOOLS, store=False, previous_response_id=resp["id"], input=outputs_for(resp)
        )
        after = drain(conn, 1)[-1]["response"]
    assert accepted["type"] == "response.steer.accepted" and pending["type"] == "response.steer.pending"
    assert [r["call_id"] for r in pending["required_input"]] == [resp["output"][0]["call_id"]]
    assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == "response_not_found"
    assert failed["steer"]["input"] == "x"
    assert after["status"] == "completed"


# A call whose arguments take emu-gpu (~65 tok/s) a few seconds to stream: a steer sent on
# its response.output_item.added reaches the server while the call is still open.
LONG_CALL_TOOL = {
    "type": "function",
    "name": "write_note",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 600}},
        "required": ["text"],
        "additionalProperties": False,
    },
}
STEER = "Also mention the failing test"


def test_check_54_steering_during_a_function_call_completes_it_then_pending_and_the_next_create_gets_the_input(
    ws_url,
):
    async def main():
        async with websockets.connect(ws_url) as ws:

            async def recv() -> dict:
                return validated(await asyncio.wait_for(ws.recv(), 60))

            create = {
                "type": "response.create",
                "model": "emu-gpu",
                "input": "Write the note",
                "store": False,
                "stream_id": "main",
                "tools": [LONG_CALL_TOOL],
                "tool_choice": "required",
            }
            await ws.send(json.dumps(create))
            events = [await recv()]
            while not (
                events[-1]["type"] == "response.output_item.added"
                and events[-1]["item"]["type"] == "function_call"
            ):
                events.append(await recv())
            target = events[0]["response"]["id"]
            await ws.send(
                json.dumps({"type": "response.steer", "previous_response_id": target, "input": STEER})
            )
            while events[-1]["type"] not in ("response.steer.pending", "response.incomplete", "error"):
                events.append(await recv())
            if events[-1]["type"] != "response.steer.pending":
                return events, []
            await ws.send(
                json.dumps(
                    {
                        **create,
                        "previous_response_id": target,
                        "tool_choice": "auto",
                        "input": outputs_for(events[-2]["response"]),
                    }
                )
            )
            nxt = [await recv()]
            while nxt[-1]["type"] not in (
                "response.completed",
                "response.incomplete",
                "response.failed",
                "error",
            ):
                nxt.append(await recv())
            return events, nxt

    from inference import chat_format

    events, nxt = asyncio.run(main())
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1, "no automatic successor"
    assert types[-2:] == ["response.completed", "response.steer.pending"]
    assert types.index("response.steer.accepted") < types.index("response.function_call_arguments.done"), (
        "the steer arrived while the call was streaming"
    )
    accepted, first, pending = (
        events[types.index("response.steer.accepted")],
        events[-2]["response"],
        events[-1],
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert first["status"] == "completed" and first["output"][0]["status"] == "completed"
    assert pending["stream_id"] == "main" and pending["steer"] == accepted["steer"]
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": o["call_id"], "name": o["name"]} for o in first["output"]
    ]
    # The continuation on the same lane sees the steer input in front of the tool results.
    created, done = nxt[0]["response"], nxt[-1]["response"]
    assert created["previous_response_id"] == first["id"] and nxt[0]["stream_id"] == "main"
    assert done["status"] == "completed"
    calls = sum(len(chat_format.render_function_call(o["name"], o["arguments"])) for o in first["output"])
    results = sum(len(chat_format.render_function_call_output("ok")) for o in first["output"])
    steer = len(chat_format.render_message("user", STEER))
    assert done["usage"]["input_tokens"] == first["usage"]["input_tokens"] + calls + steer + results


def test_check_38_39_45_the_sdk_lane_helper_runs_two_conversations_on_one_socket(server_url):
    import asyncio

    from openai import AsyncOpenAI
    from openai.lib.responses_websocket import AsyncResponsesWebSocketSession, ResponsesWebSocketLimits

    async def main():
        client = AsyncOpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)
        async with client.responses.connect() as connection:
            limits = ResponsesWebSocketLimits(
                max_lanes=4,
                max_events_per_lane=256,
                max_events=1024,
                max_bytes_per_lane=8 << 20,
                max_bytes=16 << 20,
            )
            async with AsyncResponsesWebSocketSession(connection, limits=limits) as session:
                a, b = session.lane("a"), session.lane("b")
                await a.send({"type": "response.create", "model": MODEL, "input": "one", "store": False})
                await b.send({"type": "response.create", "model": MODEL, "input": "two", "store": False})
                ra, rb = await asyncio.gather(a.get_final_response(), b.get_final_response())
                # Reusing a lane without previous_response_id starts a fresh conversation.
                await a.send({"type": "response.create", "model": MODEL, "input": "three", "store": False})
                ra2 = await a.get_final_response()
                await a.send(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "input": "four",
                        "store": False,
                        "previous_response_id": ra2.id,
                    }
                )
                ra3 = await a.get_final_response()
                return ra, rb, ra2, ra3

    ra, rb, ra2, ra3 = asyncio.run(main())
    assert ra.status == rb.status == ra2.status == ra3.status == "completed"
    assert ra2.previous_response_id is None and ra3.previous_response_id == ra2.id
    assert ra3.usage.input_tokens > ra2.usage.input_tokens
