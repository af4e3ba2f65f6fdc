"""``response.inject`` (OpenAI's multi-agent beta) over a real socket, sent by the openai SDK's
own beta client (``client.beta.responses.connect()``, ``conn.response.inject``): the response
waits on its tool call, takes the injected output and completes, on the default lane and on
a named lane; the answers validate against the documented shapes and the SDK's beta types."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from bench.client import FINAL_EVENT_TYPES
from tests.support import beta_events
from tests.support.wire import TOOLS, validated

MODEL = "emu-fast"
BETA = {"OpenAI-Beta": "responses_multi_agent=v1"}


def frame(conn) -> dict:
    data = json.loads(conn.recv_bytes().decode())
    return (
        beta_events.check(data) if data["type"].startswith("response.inject") else validated(json.dumps(data))
    )


@pytest.mark.parametrize("lane", [None, "subagent-1"])
def test_the_sdk_beta_client_injects_tool_output_into_a_waiting_response(server_url, lane):
    client = OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0)
    with client.beta.responses.connect(extra_headers=BETA) as conn:
        conn.response.create(
            model=MODEL,
            input="Read the config and summarise it",
            tools=TOOLS,
            store=False,
            multi_agent={"enabled": True},
            metadata={"emulator.tool_rounds": "2"},
            **({"stream_id": lane} if lane else {}),
        )
        events, injected = [], 0
        while not events or events[-1]["type"] not in FINAL_EVENT_TYPES:
            ev = frame(conn)
            events.append(ev)
            if ev["type"] == "response.output_item.done" and ev["item"]["type"] == "function_call":
                conn.response.inject(
                    response_id=events[0]["response"]["id"],
                    input=[
                        {"type": "function_call_output", "call_id": ev["item"]["call_id"], "output": "ok"}
                    ],
                )
                injected += 1
        rid = events[0]["response"]["id"]
        created = [e for e in events if e["type"] == "response.inject.created"]
        assert injected == 2 and len(created) == 2 and all(e["response_id"] == rid for e in created)
        assert [e["type"] for e in events].count("response.created") == 1, "one response"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert all(e.get("stream_id") == lane for e in events)
        final = events[-1]["response"]
        assert events[-1]["type"] == "response.completed"
        assert [o["type"] for o in final["output"]] == ["function_call", "function_call", "message"]

        # The response is over: the platform's failure, with the input back.
        late = [{"type": "function_call_output", "call_id": "call_late", "output": "ok"}]
        conn.response.inject(response_id=rid, input=late)
        failed = frame(conn)
        assert failed["type"] == "response.inject.failed"
        assert failed["error"]["code"] == "response_already_completed" and failed["input"] == late
        conn.response.inject(response_id="resp_unknown", input=late)
        assert frame(conn)["error"]["code"] == "response_not_found"
