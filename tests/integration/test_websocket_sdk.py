"""WebSocket mode with the official openai SDK against a real embedded Ray/Serve deployment.

Test names carry the docs/protocol.md §7 check numbers they cover.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from openai import AsyncOpenAI, OpenAI

from inference import chat_format
from tests.support.event_order import FUNCTION_CALL_ANSWER, TEXT_ANSWER, assert_event_types
from tests.support.wire import TOOLS, acollect, collect, outputs_for

MODEL = "emu-fast"


@pytest.fixture
def client(server_url):
    return OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)


def test_check_01_08_15_17_19_21_sdk_connect_text_answer(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Say hello", store=False)
        events = collect(conn)
    assert_event_types(events, TEXT_ANSWER)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    created, done = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    assert created["id"] == done["id"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text and text == events[-4]["text"] == events[-3]["part"]["text"]
    assert done["output"][0]["content"][0]["text"] == text


def test_check_16_18_20_function_call_answer_and_usage(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Read main.py", tools=TOOLS, store=False)
        events = collect(conn)
    assert_event_types(events, FUNCTION_CALL_ANSWER)
    item = events[2]["item"]
    for ev in events[3:-1]:
        assert ev["output_index"] == 0
        assert ev.get("item_id", ev.get("item", {}).get("id")) == item["id"]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert args == events[-3]["arguments"] == events[-2]["item"]["arguments"]
    parsed = json.loads(args)  # valid for the tool's schema
    assert isinstance(parsed["path"], str) and parsed["path"] and 1 <= parsed["max_lines"] <= 500
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["completed_at"] is not None
    usage = done["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert {"cached_tokens", "cache_write_tokens"} <= usage["input_tokens_details"].keys()
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    tool = done["tools"][0]
    assert tool["description"] == TOOLS[0]["description"] and tool["strict"] is True
    assert tool["parameters"] == TOOLS[0]["parameters"]


# Prompts below 1024 tokens report no cached tokens (OpenAI's rule); these tests make them
# longer so that the reported value, the reused prefix in 128-token steps, is meaningful.
LONG_INSTRUCTIONS = "You are a coding agent. Keep answers short and run the tests. " * 120
LONG_INPUT = "Read it. Here is the context of the task. " * 150


def reported(inherited: int) -> int:
    """``cached_tokens`` for an inherited prefix: from 1024 tokens, rounded down to 128."""
    stepped = inherited // 128 * 128
    return stepped if stepped >= 1024 else 0


def test_20_turn_tool_loop_sends_only_new_items_and_cached_tokens_grow(client):
    """The agent loop of the issue: store:false, previous_response_id, only tool outputs."""
    cached, expected, calls, prev = [], [], 0, None
    with client.responses.connect() as conn:
        conn.response.create(
            model=MODEL,
            input="Fix the failing test",
            tools=TOOLS,
            store=False,
            instructions=LONG_INSTRUCTIONS,
        )
        while True:
            events = collect(conn)
            resp = events[-1]["response"]
            assert events[-1]["type"] == "response.completed", events[-1]
            assert resp["previous_response_id"] == prev
            cached.append(resp["usage"]["input_tokens_details"]["cached_tokens"])
            new_items = outputs_for(resp, "x = 1\n" * 40)
            if not new_items:
                break
            calls += 1
            prev = resp["id"]
            (call,) = resp["output"]
            expected.append(
                reported(
                    resp["usage"]["input_tokens"]
                    + len(chat_format.render_function_call(call["name"], call["arguments"]))
                )
            )
            conn.response.create(
                model=MODEL,
                input=new_items,
                tools=TOOLS,
                store=False,
                previous_response_id=prev,
                instructions=LONG_INSTRUCTIONS,
            )
    assert calls == 20, "the server's policy answers in text after 20 tool results"
    assert cached[0] == 0
    assert cached[1:] == expected  # each turn reuses everything it inherited, in 128-token steps
    assert all(b >= a for a, b in itertools.pairwise(cached)), cached
    assert cached[-1] > cached[1] >= 1024


def test_check_27_cached_tokens_equal_the_inherited_prefix_and_another_keys_socket_reports_zero(
    client, server_url
):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=LONG_INPUT, tools=TOOLS, store=False)
        first = collect(conn)[-1]["response"]
        (call,) = first["output"]
        conn.response.create(
            model=MODEL, input=outputs_for(first), tools=TOOLS, store=False, previous_response_id=first["id"]
        )
        second = collect(conn)[-1]["response"]
    inherited = first["usage"]["input_tokens"] + len(
        chat_format.render_function_call(call["name"], call["arguments"])
    )
    assert inherited > 1024
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == reported(inherited)
    # The same conversation resent in full on a new socket under another API key finds
    # nothing cached; under the same key it may (one cache scope per key).
    full = [
        {"role": "user", "content": LONG_INPUT},
        {k: call[k] for k in ("type", "call_id", "name", "arguments")},
        *outputs_for(first),
    ]
    other = OpenAI(base_url=server_url + "/v1", api_key="sk-test-another-key", max_retries=0)
    with other.responses.connect() as conn:
        conn.response.create(model=MODEL, input=full, tools=TOOLS, store=False)
        fresh = collect(conn)[-1]["response"]
    assert fresh["usage"]["input_tokens"] == second["usage"]["input_tokens"]
    assert fresh["usage"]["input_tokens_details"]["cached_tokens"] == 0
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=full, tools=TOOLS, store=False)
        same_key = collect(conn)[-1]["response"]
    assert same_key["usage"]["input_tokens_details"]["cached_tokens"] >= reported(inherited)


def test_check_13_14_generate_false_warm_up_then_continue_with_cache(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=LONG_INPUT, generate=False, store=False, tools=TOOLS)
        warm = collect(conn)
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        resp = warm[-1]["response"]
        assert resp["output"] == [] and resp["usage"]["output_tokens"] == 0
        conn.response.create(
            model=MODEL, input="Go", tools=TOOLS, store=False, previous_response_id=resp["id"]
        )
        after = collect(conn)[-1]["response"]
    # the warm-up's prompt is reused whole (its full KV blocks), reported in 128-token steps
    assert (
        after["usage"]["input_tokens_details"]["cached_tokens"] == reported(resp["usage"]["input_tokens"]) > 0
    )


def test_check_26_28_29_continuation_echoes_parent_and_drops_old_instructions(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="one", store=False, instructions="Be terse.")
        r1 = collect(conn)[-1]["response"]
        conn.response.create(model=MODEL, input="two", store=False, previous_response_id=r1["id"])
        r2 = collect(conn)[-1]["response"]
        assert r2["previous_response_id"] == r1["id"] and r2["instructions"] is None
        # The model did not see the old instructions: fewer input tokens than carried over.
        conn.response.create(model=MODEL, input="three", store=False, previous_response_id=r1["id"])
        (err,) = collect(conn)
    assert err["error"]["code"] == "previous_response_not_found"


def test_check_31_34_36_37_errors_and_recovery_on_one_socket(client):
    with client.responses.connect() as a:
        a.response.create(model=MODEL, input="hi", store=False, tools=TOOLS)
        r1 = collect(a)[-1]["response"]
        with client.responses.connect() as b:
            b.response.create(model=MODEL, input="x", store=False, previous_response_id=r1["id"])
            (err,) = collect(b)
        assert err == {
            "type": "error",
            "status": 400,
            "error": {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": f"Previous response with id '{r1['id']}' not found.",
                "param": "previous_response_id",
            },
        }
        a.response.create(
            model=MODEL,
            store=False,
            previous_response_id=r1["id"],
            tools=TOOLS,
            input=[{"type": "function_call_output", "call_id": "call_bogus", "output": "x"}],
        )
        (bad,) = collect(a)
        assert bad["status"] == 400
        a.response.create(model=MODEL, input="retry", store=False, previous_response_id=r1["id"])
        (gone,) = collect(a)
        assert gone["error"]["code"] == "previous_response_not_found"
        a.response.create(
            model=MODEL, input="start over with full context", store=False, previous_response_id=None
        )
        assert collect(a)[-1]["type"] == "response.completed"


def test_check_22_38_45_named_lanes_echo_stream_id_and_run(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="a", stream_id="a", store=False)
        conn.response.create(model=MODEL, input="b", stream_id="b", store=False)
        events, done = [], 0
        while done < 2:
            ev = collect(conn)
            events += ev
            done += 1
        conn.response.create(model=MODEL, input="fresh", stream_id="a", store=False)
        again = collect(conn)
    assert {e["stream_id"] for e in events} == {"a", "b"}
    assert all("stream_id" in e for e in events)
    assert again[-1]["response"]["previous_response_id"] is None


def test_check_24_max_output_tokens_is_incomplete(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="Write a lot", max_output_tokens=5, store=False)
        events = collect(conn)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["usage"]["output_tokens"] == 5


def test_check_39_40_second_create_is_queued_fifo(client):
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="first", store=False)
        conn.response.create(model=MODEL, input="second", store=False)
        first, second = collect(conn), collect(conn)
    assert first[-1]["type"] == second[-1]["type"] == "response.completed"
    assert first[0]["response"]["id"] != second[0]["response"]["id"]


def test_tolerated_fields_hosted_tools_roles_and_item_ids(client):
    with client.responses.connect() as conn:
        conn.send(
            {
                "type": "response.create",
                "model": MODEL,
                "store": False,
                "stream": True,
                "stream_options": {"include_obfuscation": False},
                "client_metadata": {"x": "y"},
                "include": ["reasoning.encrypted_content"],
                "prompt_cache_key": "k",
                "totally_unknown_field": 1,
                "tools": [
                    {"type": "web_search"},
                    {"type": "namespace", "name": "ns", "description": "d", "tools": []},
                    *TOOLS,
                ],
                "input": [
                    {"role": "developer", "content": "rules"},
                    {"role": "system", "content": "sys"},
                    {
                        "type": "message",
                        "role": "user",
                        "id": "msg_1",
                        "status": "completed",
                        "content": [{"type": "input_text", "text": "hello"}],
                    },
                ],
            }
        )
        events = collect(conn)
    assert events[-1]["type"] == "response.completed"
    calls = [o for o in events[-1]["response"]["output"] if o["type"] == "function_call"]
    assert all(c["name"] == "read_file" for c in calls), "hosted tools are never called"


def test_unknown_model_is_model_not_found(client):
    with client.responses.connect() as conn:
        conn.response.create(model="gpt-nonexistent", input="x")
        (err,) = collect(conn)
    assert (
        err["status"] == 404
        and err["error"]["code"] == "model_not_found"
        and err["error"]["param"] == "model"
    )


def test_async_sdk_connection_runs_a_tool_turn(server_url):
    async def main():
        client = AsyncOpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)
        async with client.responses.connect() as conn:
            await conn.response.create(model=MODEL, input=LONG_INPUT, tools=TOOLS, store=False)
            first = (await acollect(conn))[-1]["response"]
            await conn.response.create(
                model=MODEL,
                input=outputs_for(first),
                tools=TOOLS,
                store=False,
                previous_response_id=first["id"],
            )
            return first, (await acollect(conn))[-1]["response"]

    first, second = asyncio.run(main())
    assert first["output"][0]["type"] == "function_call"
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_check_51_sdk_iterator_is_usable_for_a_whole_turn(client):
    """The SDK's own ``for event in connection`` parses every event we send."""
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="hi", store=False)
        types = []
        for event in conn:
            types.append(event.type)
            if event.type == "response.completed":
                break
    assert types[0] == "response.created" and types[-1] == "response.completed"
