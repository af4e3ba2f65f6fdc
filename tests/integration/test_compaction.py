"""Server-side compaction (``context_management``) through the real server and the openai SDK:
over a WebSocket a Codex-length chain passes 400k tokens of history and runs to the end, its
compacting responses carry a ``compaction`` item and the turns after them are rendered from
the compacted window; the same over HTTP, JSON and SSE, continuing stored responses."""

from __future__ import annotations

import pytest
from openai import OpenAI

from inference.tokenizer import encode
from tests.support.wire import collect, validated

MODEL = "emu-fast"
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}


def tool_output(turn: int, tokens: int) -> str:
    return "".join(f"{turn}:{i} value = {i * 7}\n" for i in range(tokens // 8))


def turn_input(call_id: str | None, n: int, tokens: int) -> object:
    if call_id is None:
        return "Audit every file of the repository."
    return [{"type": "function_call_output", "call_id": call_id, "output": tool_output(n, tokens)}]


@pytest.fixture
def client(server_url):
    return OpenAI(base_url=server_url + "/v1", api_key="sk-test", max_retries=0, timeout=120)


def test_a_websocket_session_past_400k_tokens_of_history_runs_to_the_end_with_compaction(client):
    cm = [{"type": "compaction", "compact_threshold": 100_000}]
    rows, previous, call_id = [], None, None
    with client.responses.connect() as conn:
        for n in range(26):
            conn.response.create(
                model=MODEL,
                input=turn_input(call_id, n, 16_000),
                tools=[TOOL],
                tool_choice="required",
                store=False,
                previous_response_id=previous,
                context_management=cm,
            )
            events = collect(conn)
            final = events[-1]
            assert final["type"] == "response.completed", final
            response = final["response"]
            rows.append((n, response["usage"]["input_tokens"], [o["type"] for o in response["output"]]))
            previous, call_id = response["id"], response["output"][-1]["call_id"]
    print("\nturn  input_tokens  output")
    for n, tokens, output in rows:
        print(f"{n:4}  {tokens:12}  {','.join(output)}")
    total = sum(len(encode(tool_output(n, 16_000))) for n in range(1, 26))
    print(f"tool output sent: {total} tokens")
    assert total > 400_000, "more tool output than the prompt limit"
    compacting = [i for i, (_, _, output) in enumerate(rows) if output[0] == "compaction"]
    assert len(compacting) >= 3
    for i in compacting:
        assert rows[i][1] < rows[i - 1][1], "fewer input tokens once compacted"
    assert max(tokens for _, tokens, _ in rows) < 120_000


def test_http_json_and_sse_compact_and_chain_stored_responses(client):
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    previous, call_id, rows = None, None, []
    for n in range(5):
        kwargs = dict(
            model=MODEL,
            input=turn_input(call_id, n, 600),
            tools=[TOOL],
            tool_choice="required",
            previous_response_id=previous,
            context_management=cm,
        )
        if n % 2:
            with client.responses.stream(**kwargs) as stream:
                events = [validated(e.model_dump_json()) for e in stream]
            final = events[-1]["response"]
            added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
            assert added == [o["type"] for o in final["output"]], "the compaction item streams too"
        else:
            final = client.responses.create(**kwargs).model_dump(mode="json")
        rows.append((final["usage"]["input_tokens"], [o["type"] for o in final["output"]]))
        previous, call_id = final["id"], final["output"][-1]["call_id"]
    assert [output[0] for _, output in rows][2:] == ["compaction"] * 3, rows
    assert rows[2][0] < rows[1][0] + 600, rows
    stored = client.responses.retrieve(previous)
    assert stored.output[0].type == "compaction"
