"""Server-side compaction (``context_management``) in the session core: a response whose
prompt passes ``compact_threshold`` runs on its inherited conversation compacted, starts its
output with a ``compaction`` item, and the chain continues from the compacted window with
``previous_response_id`` — a Codex-length session of 400k+ tokens of history runs to the end
instead of failing with ``context_length_exceeded``."""

from __future__ import annotations

import json

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, Written
from actors.core.render import compaction_text, render_items
from actors.core.session import Session
from actors.protocol import parse_items
from inference.types import Done, FunctionCallDelta, Prefilled
from tests.support.session_driver import handled

MODEL = "emu-fast"
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}


def tool_output(turn: int, tokens: int) -> str:
    """About ``tokens`` cl100k tokens of a file listing (each line ~8 tokens)."""
    return "".join(f"{turn}:{i} value = {i * 7}\n" for i in range(tokens // 8))


def chain(turns: int, out_tokens: int, threshold: int | None) -> list[dict]:
    """Drive ``turns`` tool rounds on one lane, each answering the last call with a large
    output; per turn: its input tokens, its output item types, or the error that ended it."""
    s = Session(SessionConfig(render_offload_chars=0), [MODEL], session_key="c", clock=lambda: 1.0)
    extra = (
        {"context_management": [{"type": "compaction", "compact_threshold": threshold}]} if threshold else {}
    )
    previous, call_id, history, rows = None, None, 0, []
    for n in range(turns):
        body = {"type": "response.create", "model": MODEL, "tools": [TOOL], "tool_choice": "required"}
        body |= {"store": False, "previous_response_id": previous, **extra}
        if call_id is None:
            body["input"] = "Audit every file of the repository."
        else:
            text = tool_output(n, out_tokens)
            body["input"] = [{"type": "function_call_output", "call_id": call_id, "output": text}]
        fx = handled(s, ClientFrame(json.dumps(body)))
        if not fx.start:
            (err,) = fx.events
            rows.append({"turn": n, "error": err.error.code, "history": history})
            return rows
        (turn,) = fx.start
        prompt = len(turn.request.prompt_token_ids)
        fx += handled(
            s,
            InferenceChunk(
                turn.turn_id,
                [
                    Prefilled(prompt, 0, 0, 1),
                    FunctionCallDelta(0, "read_file", "{}", 2),
                    Done("tool_calls", 2, 1.0),
                ],
            ),
        )
        response = fx.events[-1].response
        handled(s, Written(response.id, True))
        history += len(render_items(parse_items(turn.inputs)))
        rows.append(
            {
                "turn": n,
                "input_tokens": response.usage.input_tokens,
                "output": [o.type for o in response.output],
                "history": history,
                "events": [e.type for e in fx.events],
            }
        )
        previous, call_id = response.id, response.output[-1].call_id
    return rows


def test_without_compaction_a_long_session_fails_at_the_prompt_limit():
    rows = chain(40, 16_000, None)
    assert rows[-1].get("error") == "context_length_exceeded"
    assert rows[-1]["history"] < 400_000


def test_with_compaction_a_session_past_400k_tokens_of_history_runs_to_the_end():
    rows = chain(40, 16_000, 100_000)
    print("\nturn  input_tokens  history  output")  # shown with pytest -s
    for r in rows:
        print(f"{r['turn']:4}  {r['input_tokens']:12}  {r['history']:7}  {','.join(r['output'])}")
    assert all("error" not in r for r in rows) and len(rows) == 40
    assert rows[-1]["history"] > 400_000, "more history than the prompt limit"
    compacting = [r for r in rows if r["output"][0] == "compaction"]
    assert len(compacting) >= 4
    for r in compacting:
        assert r["output"] == ["compaction", "function_call"]
        assert r["events"][2:5] == [
            "response.output_item.added",
            "response.compaction.compacting",  # while it runs: between the item's added and done
            "response.output_item.done",
        ]
        before = rows[r["turn"] - 1]["input_tokens"]
        assert r["input_tokens"] < before, "rendered from the compacted window: fewer input tokens"
    assert max(r["input_tokens"] for r in rows) < 100_000 + 16_000 + 1_000
    # Turns after a compaction continue from the compacted window (they grow from it).
    after = rows[compacting[0]["turn"] + 1]
    assert (
        compacting[0]["input_tokens"]
        < after["input_tokens"]
        < rows[compacting[0]["turn"] - 1]["input_tokens"]
    )


def test_the_compacted_window_holds_the_summary_then_the_answered_call_and_its_output():
    s = Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 1.0)
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    fx = handled(
        s,
        ClientFrame(json.dumps({"type": "response.create", "model": MODEL, "input": "go", "tools": [TOOL]})),
    )
    (turn,) = fx.start
    fx += handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [Prefilled(9, 0, 0, 1), FunctionCallDelta(0, "read_file", "{}", 2), Done("tool_calls", 2, 1.0)],
        ),
    )
    first = fx.events[-1].response
    handled(s, Written(first.id, True))
    call = first.output[0].call_id
    big = [{"type": "function_call_output", "call_id": call, "output": tool_output(0, 1500)}]
    fx = handled(
        s,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "previous_response_id": first.id,
                    "input": big,
                    "tools": [TOOL],
                    "context_management": cm,
                }
            )
        ),
    )
    (turn,) = fx.start
    # Under the threshold before this input: nothing to compact yet beyond the first turn.
    fx += handled(s, InferenceChunk(turn.turn_id, [Prefilled(9, 0, 0, 1), Done("stop", 0, 1.0)]))
    second = fx.events[-1].response
    handled(s, Written(second.id, True))
    assert second.output[0].type == "compaction"
    items = s.cached(None).items
    assert [i["type"] for i in items] == ["message", "compaction", "function_call", "function_call_output"]
    assert items[1]["id"] == second.output[0].id
    assert "Summary of the earlier conversation" in compaction_text(items[1]["encrypted_content"])


def test_a_threshold_under_1000_is_refused():
    s = Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 1.0)
    body = {"type": "response.create", "model": MODEL, "input": "x"}
    body["context_management"] = [{"type": "compaction", "compact_threshold": 10}]
    (err,) = handled(s, ClientFrame(json.dumps(body))).events
    assert err.error.param == "context_management[0].compact_threshold"
