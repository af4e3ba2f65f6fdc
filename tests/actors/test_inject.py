"""``response.inject`` (OpenAI's multi-agent beta) in the session core: tool output put into a
running response, committed at once when it waits on its calls, or when the running model
call stops; typed failures otherwise.  Every inject answer is checked against the shapes
docs/protocol.md documents (tests/support/beta_events.schema.json) and the SDK's beta types."""

from __future__ import annotations

import json

import jsonschema
import pytest

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, Written
from actors.core.session import Effects, Session
from inference.types import Done, FunctionCallDelta, Prefilled, TextDelta
from tests.support import beta_events
from tests.support.session_driver import handled

MODEL = "emu-fast"
TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
MULTI_AGENT = {"enabled": True}


def session(**kw) -> Session:
    return Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 1.0, **kw)


def create(s: Session, **body) -> Effects:
    body = {
        "type": "response.create",
        "model": MODEL,
        "input": "fix it",
        "tools": [TOOL],
        "store": False,
        **body,
    }
    return handled(s, ClientFrame(json.dumps(body)))


def calls(s: Session, turn, n: int = 1) -> Effects:
    """The running model call issues ``n`` calls and stops on them."""
    chunk = [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1)]
    chunk += [FunctionCallDelta(i, "read_file", f'{{"path":"{i}.py"}}', 3) for i in range(n)]
    return handled(s, InferenceChunk(turn.turn_id, [*chunk, Done("tool_calls", 3 * n, 1.0)]))


def text(s: Session, turn, words: str = "Done.", reason: str = "stop") -> Effects:
    prefill = Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1)
    return handled(s, InferenceChunk(turn.turn_id, [prefill, TextDelta(words, 2), Done(reason, 2, 1.0)]))


def inject(s: Session, response_id: str, *items: dict, **extra) -> Effects:
    """A well-formed ``response.inject`` (it has the documented shape)."""
    beta_events.check({"type": "response.inject", "response_id": response_id, "input": list(items), **extra})
    return handled(
        s,
        ClientFrame(
            json.dumps({"type": "response.inject", "response_id": response_id, "input": list(items), **extra})
        ),
    )


def output(call_id: str, out: str = "x = 1") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": out}


def dumped(fx: Effects) -> list[dict]:
    out = [json.loads(e.model_dump_json()) for e in fx.events]
    for e in out:
        if e["type"].startswith("response.inject"):
            beta_events.check(e)
    return out


def call_ids(fx: Effects) -> list[str]:
    return [e.item.call_id for e in fx.events if e.type == "response.output_item.done"]


@pytest.mark.parametrize("lane", [None, "agent-2"])
def test_a_multi_agent_response_waits_on_its_call_and_continues_with_the_injected_output(lane):
    s = session()
    fx = create(s, multi_agent=MULTI_AGENT, **({"stream_id": lane} if lane else {}))
    (turn,) = fx.start
    rid = turn.builder.response.id
    paused = calls(s, turn)
    assert "response.completed" not in [e.type for e in paused.events], "the response waits"
    (call_id,) = call_ids(paused)
    first_prompt = len(turn.request.prompt_token_ids)

    injected = inject(s, rid, output(call_id))
    (created,) = dumped(injected)
    assert created["type"] == "response.inject.created" and created["response_id"] == rid
    assert created.get("stream_id") == lane
    assert injected.start == [turn], "the same response resumes: no new response"
    assert len(turn.request.prompt_token_ids) > first_prompt and turn.request.tool_results_in_context == 1

    done = text(s, turn)
    events = dumped(fx) + dumped(paused) + [created] + dumped(done)
    assert [e["sequence_number"] for e in events] == list(range(len(events))), "one numbering"
    assert all(e.get("stream_id") == lane for e in events)
    final = events[-1]
    assert final["type"] == "response.completed"
    assert [o["type"] for o in final["response"]["output"]] == ["function_call", "message"]
    entry = s.cached(lane)
    assert [i["type"] for i in entry.items] == ["message", "function_call", "function_call_output", "message"]


def test_input_for_a_call_still_open_while_the_model_runs_is_committed_when_the_call_stops():
    s = session()
    (turn,) = create(s, multi_agent=MULTI_AGENT).start
    rid = turn.builder.response.id
    a, b = call_ids(calls(s, turn, 2))
    assert inject(s, rid, output(a)).start == [turn]  # resumes with b still open
    held = inject(s, rid, output(b, "y = 2"))
    assert held.events == [] and held.start == [], "held: the model call is running"
    assert dumped(inject(s, rid, output(b)))[0]["error"]["param"] == "input[0].call_id", "not twice"

    stopped = text(s, turn, "Reading b.")  # would have completed the response
    types = [e.type for e in stopped.events]
    assert "response.completed" not in types and types[-1] == "response.inject.created"
    assert stopped.start == [turn] and turn.request.tool_results_in_context == 2
    done = text(s, turn)
    assert done.events[-1].type == "response.completed"
    final = done.events[-1].response
    assert [o.type for o in final.output] == ["function_call", "function_call", "message", "message"]
    items = s.cached(None).items
    assert [i.get("output") for i in items if i["type"] == "function_call_output"] == ["x = 1", "y = 2"]


def test_held_input_of_a_response_that_ends_first_comes_back_after_its_terminal_event():
    s = session()
    (turn,) = create(s, multi_agent=MULTI_AGENT, max_output_tokens=50).start
    rid = turn.builder.response.id
    a, b = call_ids(calls(s, turn, 2))
    inject(s, rid, output(a))
    inject(s, rid, output(b))
    cut = dumped(text(s, turn, reason="max_output_tokens"))
    assert [e["type"] for e in cut[-2:]] == ["response.incomplete", "response.inject.failed"]
    assert cut[-1]["error"]["code"] == "response_already_completed"
    assert cut[-1]["input"] == [output(b)], "the input as sent"


def test_a_finished_or_unknown_response_fails_with_its_code_and_the_input_back():
    s = session()
    fx = create(s, stream_id="lane-1")
    (turn,) = fx.start
    rid = turn.builder.response.id
    text(s, turn)
    handled(s, Written(rid, True))
    (done,) = dumped(inject(s, rid, output("call_1")))
    assert done["error"]["code"] == "response_already_completed" and done["stream_id"] == "lane-1"
    assert done["input"] == [output("call_1")] and done["response_id"] == rid
    (unknown,) = dumped(inject(s, "resp_nope", output("call_1")))
    assert unknown["error"]["code"] == "response_not_found" and "stream_id" not in unknown


def test_a_stream_id_must_name_the_targets_lane():
    s = session()
    (turn,) = create(s, multi_agent=MULTI_AGENT, stream_id="a").start
    rid = turn.builder.response.id
    (call_id,) = call_ids(calls(s, turn))
    (other,) = dumped(inject(s, rid, output(call_id), stream_id="b"))
    assert other["error"]["code"] == "response_not_found"
    (ok,) = dumped(inject(s, rid, output(call_id), stream_id="a", event_id="evt_1"))
    assert ok["type"] == "response.inject.created" and ok["stream_id"] == "a"


@pytest.mark.parametrize(
    "frame, code, param",
    [
        ({"input": [output("call_1")]}, "missing_required_parameter", "response_id"),
        ({"response_id": "", "input": [output("call_1")]}, "invalid_value", "response_id"),
        ({"response_id": "resp_1", "input": []}, "invalid_value", "input"),
        ({"response_id": "resp_1", "input": "x = 1"}, "invalid_type", "input"),
        (
            {"response_id": "resp_1", "input": [{"type": "function_call_output"}]},
            "missing_required_parameter",
            "input[0].output",
        ),
        ({"response_id": "resp_1", "input": [output("c")], "junk": 1}, "unknown_parameter", "junk"),
        (
            {"response_id": "resp_1", "input": [output("c")], "stream_id": "a b"},
            "invalid_stream_id",
            "stream_id",
        ),
    ],
)
def test_malformed_injects_are_typed_errors(frame, code, param):
    if not param.startswith("input["):  # the documented shape refuses the frame too (items: §2.2)
        with pytest.raises(jsonschema.ValidationError):
            beta_events.check({"type": "response.inject", **frame})
    (err,) = dumped(handled(session(), ClientFrame(json.dumps({"type": "response.inject", **frame}))))
    assert err["type"] == "error" and err["status"] == 400
    assert (err["error"]["code"], err["error"]["param"]) == (code, param)


def test_input_a_running_response_cannot_take_is_refused_naming_what():
    s = session()
    (turn,) = create(s, multi_agent=MULTI_AGENT, stream_id="x").start
    rid = turn.builder.response.id
    (call_id,) = call_ids(calls(s, turn))
    message = {"type": "message", "role": "user", "content": "hi"}
    (err,) = dumped(inject(s, rid, message))
    assert err["error"]["param"] == "input[0]" and err["stream_id"] == "x"
    (err,) = dumped(inject(s, rid, output("call_other")))
    assert err["error"]["param"] == "input[0].call_id"
    (err,) = dumped(inject(s, rid, output(call_id), output(call_id)))
    assert err["error"]["param"] == "input[1].call_id", "one result per call"
    assert dumped(inject(s, rid, output(call_id)))[0]["type"] == "response.inject.created"

    plain = session()
    (turn,) = create(plain).start  # no multi_agent: it never waits for injected input
    (err,) = dumped(inject(plain, turn.builder.response.id, output("call_1")))
    assert err["error"]["param"] == "response_id"


def test_append_mode_responses_take_injected_input_too():
    s = session(append_mode=True)
    (turn,) = create(s).start
    (call_id,) = call_ids(calls(s, turn))
    (created,) = dumped(inject(s, turn.builder.response.id, output(call_id)))
    assert created["type"] == "response.inject.created"


def test_multi_agent_is_ignored_over_http():
    s = session(transport="http")
    (turn,) = create(s, multi_agent=MULTI_AGENT).start
    assert calls(s, turn).events[-1].type == "response.completed"


@pytest.mark.parametrize("event", ["response.inject", "response.append"])
def test_item_references_in_a_running_responses_input_resolve_from_what_the_connection_holds(event):
    """A reference names a tool output this connection holds (here, another lane's input); an id
    it does not hold is ``item_not_found`` (the store is not asked), and the response still waits."""
    s = session(append_mode=event == "response.append")
    (turn,) = create(s, **({"multi_agent": MULTI_AGENT} if event == "response.inject" else {})).start
    rid = turn.builder.response.id
    (call_id,) = call_ids(calls(s, turn))
    call = {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"}
    (other,) = create(s, stream_id="b", input=[call, output(call_id, "from lane b")]).start
    text(s, other)
    held_id = s.cached("b").items[1]["id"]

    def send(*items: dict) -> Effects:
        return handled(s, ClientFrame(json.dumps({"type": event, "response_id": rid, "input": list(items)})))

    (err,) = dumped(send({"type": "item_reference", "id": "fco_missing"}))
    assert (err["error"]["code"], err["error"]["param"]) == ("item_not_found", "input[0]")
    resumed = send({"type": "item_reference", "id": held_id})
    assert resumed.start == [turn] and turn.request.tool_results_in_context == 1
    done = text(s, turn)
    items = s.cached(None).items
    assert [i.get("output") for i in items if i["type"] == "function_call_output"] == ["from lane b"]
    assert done.events[-1].type == "response.completed"
