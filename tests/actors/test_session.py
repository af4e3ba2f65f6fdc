"""The session core, driven without Ray or asyncio: frames and inference chunks in, events out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.backend.emulator_metadata import check_emulator_metadata
from actors.config import SessionConfig
from actors.core.cache_budget import CacheBudget
from actors.core.inputs import (
    CallsStarted,
    ClientFrame,
    Disconnected,
    DrainStarted,
    HistoryLoaded,
    InferenceChunk,
    InferenceFailed,
    LaneEvicted,
    Released,
    Rendered,
    Written,
)
from actors.core.render import render_items, render_marked
from actors.core.session import Effects, Session
from actors.errors import InvalidRequest
from actors.protocol import ResponseObject, error_event
from inference.types import Done, FunctionCallDelta, Prefilled, ReasoningDone, TextDelta
from tests.support.event_order import FUNCTION_CALL_ANSWER, TEXT_ANSWER, assert_event_types
from tests.support.session_driver import handled

MODEL = "emu-fast"
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def new_session(**cfg) -> Session:
    """A session with the emulator backend's metadata check, as a session host gives it."""
    return Session(
        SessionConfig(**cfg),
        [MODEL],
        session_key="conn-1",
        clock=lambda: 1_700_000_000.0,
        check_metadata=check_emulator_metadata,
    )


def send(session: Session, records: dict | None = None, **body) -> Effects:
    """A create frame; loads the session asks for are answered from ``records`` (default: none)."""
    fx = handled(session, ClientFrame(json.dumps({"type": "response.create", "model": MODEL, **body})))
    while fx.load:
        load = fx.load.pop(0)
        record = (records or {}).get(load.response_id)
        fx += handled(
            session, HistoryLoaded(load.load_id, record if record and record.owner == load.owner else None)
        )
    return fx


def dumped(fx: Effects) -> list[dict]:
    return [e.model_dump() for e in fx.events]


def answer_text(session: Session, fx: Effects, text: str = "Hi there", *, written: bool = True) -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(
        session, InferenceChunk(turn.turn_id, [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1)])
    )
    out += handled(session, InferenceChunk(turn.turn_id, [TextDelta(text[:2], 1), TextDelta(text[2:], 2)]))
    out += handled(session, InferenceChunk(turn.turn_id, [Done("stop", 3, 3.0)]))
    return stored(session, out) if written else out


def answer_call(session: Session, fx: Effects, args: str = '{"path":"a.py"}') -> Effects:
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(
        session,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1),
                FunctionCallDelta(0, "read_file", args[:5], 2),
            ],
        ),
    )
    out += handled(
        session,
        InferenceChunk(
            turn.turn_id, [FunctionCallDelta(0, "read_file", args[5:], 4), Done("tool_calls", 6, 6.0)]
        ),
    )
    return stored(session, out)


def stored(session: Session, fx: Effects) -> Effects:
    """The driver's part once a response ends: its ledger line (and record) is written and
    its terminal sent."""
    for line in list(fx.usage):
        fx += handled(session, Written(line.response_id, True))
    return fx


def terminal(fx: Effects) -> dict:
    return dumped(fx)[-1]["response"]


def test_text_answer_follows_spec_order_with_sequence_numbers_from_zero():
    s = new_session()
    events = dumped(answer_text(s, send(s, input="hello")))
    assert_event_types(events, TEXT_ANSWER)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all("stream_id" not in e for e in events)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = events[-1]["response"]
    assert deltas == "Hi there" == done["output"][0]["content"][0]["text"]
    assert (
        done["status"] == "completed" and done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + 3
    )
    assert events[0]["response"]["usage"] is None and events[0]["response"]["output"] == []


def test_function_call_answer_has_consistent_ids_and_arguments():
    s = new_session()
    events = dumped(answer_call(s, send(s, input="read it", tools=[TOOL])))
    assert_event_types(events, FUNCTION_CALL_ANSWER)
    item = events[2]["item"]
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    deltas = [e for e in events if e["type"].endswith("arguments.delta")]
    assert all(e["item_id"] == item["id"] and e["output_index"] == 0 for e in deltas)
    assert "".join(e["delta"] for e in deltas) == events[-3]["arguments"] == '{"path":"a.py"}'
    tool = events[-1]["response"]["tools"][0]
    assert tool["description"] == "Read a file" and tool["strict"] is True and tool["parameters"]


def test_continuation_sends_only_new_items_and_prompt_extends_the_cached_context():
    s = new_session()
    first = send(s, input="read it", tools=[TOOL], store=False)
    resp = terminal(answer_call(s, first))
    call_id = resp["output"][0]["call_id"]
    fx = send(
        s,
        previous_response_id=resp["id"],
        store=False,
        tools=[TOOL],
        input=[{"type": "function_call_output", "call_id": call_id, "output": "print(1)"}],
    )
    (turn,) = fx.start
    prompt = list(turn.request.prompt_token_ids)
    assert turn.request.tool_results_in_context == 1
    assert len(prompt) > len(first.start[0].request.prompt_token_ids)
    assert prompt[: len(first.start[0].request.prompt_token_ids)] == list(
        first.start[0].request.prompt_token_ids
    )
    created = dumped(fx)[0]["response"]
    assert created["previous_response_id"] == resp["id"]


def test_unknown_previous_response_is_an_error_and_not_a_response():
    s = new_session()
    fx = send(s, previous_response_id="resp_nope", input="x")
    (err,) = dumped(fx)
    assert err["type"] == "error" and err["status"] == 400
    assert err["error"]["code"] == "previous_response_not_found"
    assert err["error"]["param"] == "previous_response_id"
    assert fx.start == []


def test_non_latest_store_false_response_is_gone_from_the_cache():
    s = new_session()
    r1 = terminal(answer_text(s, send(s, input="one", store=False)))
    answer_text(s, send(s, input="two", store=False, previous_response_id=r1["id"]))
    (err,) = dumped(send(s, input="three", store=False, previous_response_id=r1["id"]))
    assert err["error"]["code"] == "previous_response_not_found"


def test_failed_continuation_with_unknown_call_id_evicts_its_parent():
    s = new_session()
    r1 = terminal(answer_call(s, send(s, input="go", tools=[TOOL], store=False)))
    bad = [{"type": "function_call_output", "call_id": "call_never_issued", "output": "x"}]
    (err,) = dumped(send(s, previous_response_id=r1["id"], input=bad, store=False))
    assert err["status"] == 400 and err["error"]["param"] == "input[0].call_id"
    (again,) = dumped(send(s, previous_response_id=r1["id"], input="retry", store=False))
    assert again["error"]["code"] == "previous_response_not_found"
    # Recovery per docs/protocol.md §4.8: a fresh chain with the full input works on the same socket.
    assert send(s, input="from scratch").start


def test_second_create_on_a_lane_is_queued_fifo_not_rejected():
    s = new_session()
    first = send(s, input="one")
    second = send(s, input="two")
    assert second.events == [] and second.start == []
    after = answer_text(s, first)
    assert after.start
    assert [e.type for e in after.events[-3:]] == [
        "response.completed",
        "response.created",
        "response.in_progress",
    ]


def test_inflight_responses_are_capped_per_connection():
    s = new_session(max_inflight=2)
    started = [send(s, input="x", stream_id=f"lane{i}") for i in range(3)]
    assert [bool(fx.start) for fx in started] == [True, True, False]
    freed = answer_text(s, started[0])
    assert freed.start and freed.start[0].lane == "lane2"


def test_a_stored_response_is_in_flight_until_its_record_is_written_and_its_terminal_sent():
    s = new_session(max_inflight=1)
    first, second = send(s, input="x", stream_id="a"), send(s, input="x", stream_id="b")
    done = answer_text(s, first, written=False)
    (record,) = done.persist
    assert not second.start and not done.start and s.inflight == 1 and not s.idle
    nxt = handled(s, Written(record.id, True))
    assert [t.lane for t in nxt.start] == ["b"]
    assert handled(s, Written(record.id, True)).start == []  # an answer twice changes nothing


def test_queued_creates_refused_when_they_start_each_get_their_error_and_leave_the_queue():
    s = new_session(max_inflight=1)
    first = send(s, input="x", stream_id="a")
    unanswered = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    queued = [send(s, input=unanswered, stream_id=lane) for lane in ("b", "c")]
    assert [fx.events for fx in queued] == [[], []]
    errors = [e for e in dumped(answer_text(s, first)) if e["type"] == "error"]
    assert [(e["stream_id"], e["error"]["param"]) for e in errors] == [
        ("b", "input[0].call_id"),
        ("c", "input[0].call_id"),
    ]
    assert s.idle


@pytest.mark.parametrize(
    "frame, code, param",
    [
        ("{not json", "invalid_json", None),
        ('{"type":"response.cancel"}', "unknown_event_type", "type"),
        ('{"type":"response.create","model":"emu-fast","background":true}', "invalid_value", "background"),
        ('{"type":"response.create","model":"gpt-nope","input":"x"}', "model_not_found", "model"),
        (
            '{"type":"response.create","model":"emu-fast","input":[{"role":"robot","content":"x"}]}',
            "invalid_value",
            "input[0].role",
        ),
        ('{"type":"response.create","model":"emu-fast","stream_id":""}', "invalid_stream_id", "stream_id"),
    ],
)
def test_bad_frames_get_typed_errors_and_the_session_stays_usable(frame, code, param):
    s = new_session()
    (err,) = dumped(handled(s, ClientFrame(frame)))
    assert err["type"] == "error" and err["error"]["code"] == code and err["error"]["param"] == param
    assert "stream_id" not in err and "sequence_number" not in err
    assert err["status"] == (404 if code == "model_not_found" else 400)
    assert send(s, input="still works").start


def test_lenient_by_default_and_strict_mode_rejects_unknown_fields():
    body = dict(
        input="x",
        stream=True,
        stream_options={"include_obfuscation": False},
        client_metadata={"a": 1},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        some_future_field=1,
        tools=[{"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": []}, TOOL],
    )
    assert send(new_session(), **body).start
    (err,) = dumped(send(new_session(strict_params=True), **body))
    assert err["error"]["code"] == "unknown_parameter" and err["error"]["param"] == "some_future_field"


def test_generate_false_prefills_and_completes_with_empty_output():
    s = new_session()
    fx = send(s, input="warm", generate=False)
    (turn,) = fx.start
    assert turn.request.generate is False
    out = handled(s, InferenceChunk(turn.turn_id, [Prefilled(10, 0, 0, 1), Done("stop", 0, 0.0)]))
    events = dumped(fx) + dumped(out)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    resp = events[-1]["response"]
    assert resp["output"] == [] and resp["usage"]["output_tokens"] == 0
    assert send(s, input="go", previous_response_id=resp["id"]).start


def test_max_output_tokens_ends_incomplete():
    s = new_session()
    fx = send(s, input="long", max_output_tokens=2)
    (turn,) = fx.start
    out = handled(
        s,
        InferenceChunk(
            turn.turn_id, [Prefilled(5, 0, 0, 1), TextDelta("ab", 2), Done("max_output_tokens", 2, 2.0)]
        ),
    )
    resp = dumped(out)[-1]
    assert resp["type"] == "response.incomplete"
    assert resp["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_hidden_reasoning_counts_in_usage_and_emits_no_event():
    s = new_session()
    fx = send(s, input="think first")
    (turn,) = fx.start
    out = handled(s, InferenceChunk(turn.turn_id, [Prefilled(5, 0, 0, 1), ReasoningDone(120)]))
    assert dumped(out) == []  # nothing to show for reasoning
    out = handled(s, InferenceChunk(turn.turn_id, [TextDelta("ok", 1), Done("stop", 121, 130.0)]))
    usage = dumped(out)[-1]["response"]["usage"]
    assert usage["output_tokens"] == 121
    assert usage["output_tokens_details"] == {"reasoning_tokens": 120}


def test_inference_failure_after_created_is_response_failed_and_evicts_same_lane_parent():
    s = new_session()
    r1 = terminal(answer_text(s, send(s, input="one", store=False)))
    fx = send(s, input="two", store=False, previous_response_id=r1["id"])
    (turn,) = fx.start
    failed = dumped(handled(s, InferenceFailed(turn.turn_id, RuntimeError("secret internals"))))[-1]
    assert failed["type"] == "response.failed" and failed["response"]["error"]["code"] == "server_error"
    assert "secret" not in json.dumps(failed)
    (err,) = dumped(send(s, input="three", store=False, previous_response_id=r1["id"]))
    assert err["error"]["code"] == "previous_response_not_found"


def test_named_lane_events_all_echo_stream_id():
    s = new_session()
    events = dumped(answer_text(s, send(s, input="x", stream_id="main")))
    assert all(e["stream_id"] == "main" for e in events)


def test_33rd_named_lane_is_refused_and_known_lanes_keep_working():
    s = new_session()
    for i in range(32):
        answer_text(s, send(s, input="x", stream_id=f"l{i}"))
    (err,) = dumped(send(s, input="x", stream_id="l32"))
    assert err["error"]["code"] == "websocket_stream_limit_reached" and err["stream_id"] == "l32"
    assert send(s, input="x", stream_id="l0").start and send(s, input="x").start


def test_response_object_has_every_key():
    keys = set(ResponseObject.model_fields)
    assert {
        "id",
        "object",
        "created_at",
        "status",
        "completed_at",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "metadata",
        "previous_response_id",
        "reasoning",
        "store",
        "temperature",
        "top_p",
        "text",
        "truncation",
        "usage",
        "user",
        "background",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "output",
        "model",
    } <= keys


def test_store_true_responses_are_persisted_with_inputs_and_context_and_store_false_never():
    s = new_session()
    fx = answer_call(s, send(s, input="read it", tools=[TOOL]))
    (record,) = fx.persist
    assert record.id == terminal(fx)["id"] and record.response["status"] == "completed"
    assert [i["type"] for i in record.input_items] == ["message"] and record.input_items[0]["id"].startswith(
        "msg_"
    )
    assert [i["type"] for i in record.context] == ["message", "function_call"]
    (usage,) = fx.usage
    assert usage.response_id == record.id and usage.output_tokens == 6 and usage.transport == "websocket"
    quiet = answer_text(s, send(s, input="x", store=False))
    assert quiet.persist == [] and len(quiet.usage) == 1


def test_a_store_false_response_is_in_flight_until_its_ledger_line_is_written():
    s = new_session()
    first = answer_text(s, send(s, input="x", store=False), written=False)
    (line,) = first.usage
    assert line.response_id == terminal(first)["id"] and first.persist == []
    assert s.inflight == 1, "it counts against max_inflight while its line is written"
    handled(s, Written(line.response_id, True))
    assert s.inflight == 0 and s.idle


def test_a_failure_after_inference_ran_is_billed_for_what_it_used_and_one_before_is_not():
    s = new_session()
    (turn,) = send(s, input="x", store=False).start
    handled(
        s,
        InferenceChunk(
            turn.turn_id, [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1), TextDelta("Hi", 1)]
        ),
    )
    fx = handled(s, InferenceFailed(turn.turn_id, RuntimeError("replica died")))
    (line,) = fx.usage
    usage = terminal(fx)["usage"]
    assert (
        (line.input_tokens, line.output_tokens)
        == (usage["input_tokens"], usage["output_tokens"])
        == (len(turn.request.prompt_token_ids), 1)
    )
    handled(s, Written(line.response_id, True))
    (early,) = send(s, input="x", store=False, stream_id="b").start
    fx = handled(s, InferenceFailed(early.turn_id, RuntimeError("no replica")))
    assert fx.usage == [] and terminal(fx)["usage"] is None, "no tokens used, nothing billed"


def test_continuing_from_the_store_renders_the_same_prompt_as_the_cache():
    """The stateless path (load, re-render, re-tokenise) and the cached path agree exactly."""
    s = new_session()
    first = answer_call(s, send(s, input="read it", tools=[TOOL]))
    (record,) = first.persist
    outputs = [{"type": "function_call_output", "call_id": record.context[-1]["call_id"], "output": "data"}]
    cached = send(s, previous_response_id=record.id, tools=[TOOL], input=outputs)
    other = new_session()  # e.g. another socket, or an HTTP request
    loaded = send(
        other, records={record.id: record}, previous_response_id=record.id, tools=[TOOL], input=outputs
    )
    assert list(loaded.start[0].request.prompt_token_ids) == list(cached.start[0].request.prompt_token_ids)
    assert loaded.start[0].request.tool_results_in_context == 1


def test_a_stored_response_of_another_owner_is_not_found():
    s = new_session()
    (record,) = answer_text(s, send(s, input="mine")).persist
    other = Session(SessionConfig(), [MODEL], session_key="c2", owner="someone-else", clock=lambda: 0.0)
    (err,) = dumped(send(other, records={record.id: record}, previous_response_id=record.id, input="x"))
    assert err["error"]["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"metadata": {"emulator.tool_rounds": "lots"}}, "metadata.emulator.tool_rounds"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ],
)
def test_inference_knobs_are_validated_before_a_response_starts(body, param):
    s = new_session()
    (err,) = dumped(send(s, input="x", **body))
    assert err["status"] == 400 and err["error"]["param"] == param


def test_failures_with_codes_outside_the_sdk_enum_are_server_error():
    class Overloaded(Exception):
        code = "server_is_overloaded"

    s = new_session()
    (turn,) = send(s, input="x").start
    failed = dumped(handled(s, InferenceFailed(turn.turn_id, Overloaded())))[-1]
    assert failed["response"]["error"]["code"] == "server_error"


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
TURN = st.lists(
    st.one_of(
        st.builds(lambda t: {"role": "user", "content": t}, TEXT),
        st.builds(lambda t: {"role": "developer", "content": [{"type": "input_text", "text": t}]}, TEXT),
        st.just("tool_output"),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(st.tuples(TURN, st.booleans(), TEXT), min_size=1, max_size=6))
def test_incremental_rendering_equals_rendering_the_whole_conversation(turns):
    """Turn by turn the session only appends the new items' tokens; the result is exactly
    what rendering the whole conversation at once gives (the stateless path)."""
    from actors.core.context import from_record
    from actors.core.safety import Classifier, SafetyConfig, build_matcher
    from actors.core.timings import PhaseTimer
    from actors.protocol import parse_items
    from inference.types import FunctionCallDelta

    s = new_session(safety={"enabled": False})
    prev, pending_calls = None, []
    for items, call, text in turns:
        inputs = [
            {"type": "function_call_output", "call_id": c, "output": text} if i == "tool_output" else i
            for i in items
            for c in (pending_calls[:1] or [None])
            if i != "tool_output" or c
        ]
        fx = send(s, input=inputs or "go", previous_response_id=prev, tools=[TOOL])
        (turn,) = fx.start
        events = [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1)]
        events += (
            [FunctionCallDelta(0, "read_file", f'{{"path":"{len(text)}"}}', 3)]
            if call
            else [TextDelta(text or ".", 2)]
        )
        out = handled(
            s, InferenceChunk(turn.turn_id, events + [Done("tool_calls" if call else "stop", 3, 3.0)])
        )
        response = terminal(out)
        prev = response["id"]
        pending_calls = [o["call_id"] for o in response["output"] if o["type"] == "function_call"]
    entry = s.cached(None)
    assert list(entry.tokens) == render_items(parse_items(entry.items))
    record = out.persist[0]
    safety = SafetyConfig(enabled=False)
    matcher = build_matcher(safety)
    rebuilt = from_record(record, lambda: Classifier(matcher, safety.thresholds), PhaseTimer(lambda: 0.0))
    assert list(rebuilt.tokens) == list(entry.tokens) and rebuilt.call_ids == entry.call_ids


def steer(session: Session, previous_response_id, input="Actually, do X instead", **extra) -> list[dict]:
    fx = handled(
        session,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.steer",
                    "previous_response_id": previous_response_id,
                    "input": input,
                    **extra,
                }
            )
        ),
    )
    return dumped(fx), fx


def test_check_52_53_steering_an_active_response_stops_it_and_starts_the_successor():
    s = new_session()
    fx = send(s, input="write", stream_id="main", tools=[TOOL], instructions="be brief")
    (turn,) = fx.start
    handled(s, InferenceChunk(turn.turn_id, [Prefilled(5, 0, 0, 1), TextDelta("Hel", 1)]))
    events, out = steer(s, turn.builder.response.id)
    types = [e["type"] for e in events]
    assert types[0] == "response.steer.accepted" and events[0]["steer"]["id"].startswith("steer_")
    assert events[0]["steer"]["previous_response_id"] == turn.builder.response.id
    incomplete = events[types.index("response.incomplete")]
    assert incomplete["response"]["incomplete_details"] == {"reason": "steered"}
    assert incomplete["response"]["output"][0]["content"][0]["text"] == "Hel"
    created = events[types.index("response.created")]
    assert types.index("response.created") > types.index("response.incomplete")
    assert created["response"]["previous_response_id"] == turn.builder.response.id
    assert created["response"]["instructions"] == "be brief" and created["stream_id"] == "main"
    assert out.cancel == [turn.turn_id]
    (succ,) = out.start
    assert succ.inputs[0]["content"][0]["text"] == "Actually, do X instead"
    seqs = [e["sequence_number"] for e in events[: types.index("response.created")]]
    assert seqs == sorted(seqs), "steer events use the target response's counter"


def test_check_54_steering_after_function_calls_is_pending_and_prepended_to_the_next_create():
    s = new_session()
    done = answer_call(s, send(s, input="go", tools=[TOOL], store=False))
    resp = terminal(done)
    events, _ = steer(s, resp["id"], input="also check tests")
    assert [e["type"] for e in events] == ["response.steer.accepted", "response.steer.pending"]
    pending = events[1]
    assert pending["reason"] == "waiting_for_required_input"
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": resp["output"][0]["call_id"], "name": "read_file"}
    ]
    assert pending["sequence_number"] == done.events[-1].sequence_number + 2
    nxt = send(
        s,
        previous_response_id=resp["id"],
        tools=[TOOL],
        store=False,
        input=[{"type": "function_call_output", "call_id": resp["output"][0]["call_id"], "output": "x"}],
    )
    (turn,) = nxt.start
    assert [i["type"] for i in turn.inputs] == ["message", "function_call_output"]
    assert turn.inputs[0]["content"][0]["text"] == "also check tests"


def test_steering_during_a_function_call_completes_the_call_then_one_pending_and_the_next_create_gets_the_input():
    """docs/protocol.md §2.3 (c), check 54: a steer never cuts a function call the client will
    be asked to run; the response completes, then one response.steer.pending lists the calls."""
    s = new_session()
    fx = send(s, input="go", tools=[TOOL], store=False, stream_id="main")
    (turn,) = fx.start
    rid = turn.builder.response.id
    first = handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1),
                FunctionCallDelta(0, "read_file", '{"pa', 2),
            ],
        ),
    )
    assert [e.type for e in first.events][-1] == "response.function_call_arguments.delta"
    events, steered = steer(s, rid, input="also check tests")
    assert [e["type"] for e in events] == ["response.steer.accepted"]
    assert not (steered.cancel or steered.start), "the call is not cut"
    rest = handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                FunctionCallDelta(0, "read_file", 'th":"a.py"}', 4),
                FunctionCallDelta(1, "read_file", '{"path":"b.py"}', 5),
                Done("tool_calls", 11, 11.0),
            ],
        ),
    )
    after = dumped(rest)
    assert [e["type"] for e in after][-3:] == [
        "response.output_item.done",
        "response.completed",
        "response.steer.pending",
    ]
    assert not rest.start, "no automatic successor: the calls wait for the client"
    done, pending = after[-2]["response"], after[-1]
    assert done["status"] == "completed" and [o["status"] for o in done["output"]] == ["completed"] * 2
    assert pending["reason"] == "waiting_for_required_input" and pending["stream_id"] == "main"
    assert pending["steer"] == events[0]["steer"]
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": o["call_id"], "name": "read_file"} for o in done["output"]
    ]
    all_events = dumped(fx) + dumped(first) + events + after
    assert [e["sequence_number"] for e in all_events] == list(range(len(all_events)))
    nxt = send(
        s,
        previous_response_id=rid,
        tools=[TOOL],
        store=False,
        stream_id="main",
        input=[
            {"type": "function_call_output", "call_id": o["call_id"], "output": "x"} for o in done["output"]
        ],
    )
    (turn2,) = nxt.start
    assert [i["type"] for i in turn2.inputs] == ["message", "function_call_output", "function_call_output"]
    assert turn2.inputs[0]["content"][0]["text"] == "also check tests"


def test_steer_held_during_a_call_that_ends_incomplete_goes_to_an_automatic_successor():
    s = new_session()
    (turn,) = send(s, input="go", tools=[TOOL], store=False, max_output_tokens=3).start
    handled(
        s, InferenceChunk(turn.turn_id, [Prefilled(9, 0, 0, 1), FunctionCallDelta(0, "read_file", '{"pa', 2)])
    )
    steer(s, turn.builder.response.id, input="summarise instead")
    out = handled(
        s,
        InferenceChunk(
            turn.turn_id, [FunctionCallDelta(0, "read_file", "th", 1), Done("max_output_tokens", 3, 3.0)]
        ),
    )
    types = [e["type"] for e in dumped(out)]
    assert types[-3:] == ["response.incomplete", "response.created", "response.in_progress"]
    assert "response.steer.pending" not in types
    (succ,) = out.start
    assert succ.builder.response.previous_response_id == turn.builder.response.id
    assert succ.inputs[0]["content"][0]["text"] == "summarise instead"


def test_steer_held_during_a_call_of_a_failed_response_is_returned_by_steer_failed():
    s = new_session()
    (turn,) = send(s, input="go", tools=[TOOL], store=False).start
    handled(
        s, InferenceChunk(turn.turn_id, [Prefilled(9, 0, 0, 1), FunctionCallDelta(0, "read_file", '{"pa', 2)])
    )
    (accepted,), _ = steer(s, turn.builder.response.id, input="and b.py")
    failed, steer_failed = dumped(handled(s, InferenceFailed(turn.turn_id, RuntimeError("boom"))))
    assert failed["type"] == "response.failed" and steer_failed["type"] == "response.steer.failed"
    assert steer_failed["error"]["code"] == "response_not_active"
    assert steer_failed["steer"] == {**accepted["steer"], "input": "and b.py"}


@pytest.mark.parametrize(
    "extra, input, code",
    [
        ({}, "x", "response_not_found"),
        ({"stream_id": "main"}, "x", "invalid_input"),
        ({}, [{"role": "assistant", "content": "x"}], "invalid_input"),
        ({}, [{"type": "function_call_output", "call_id": "c", "output": "x"}], "invalid_input"),
        ({}, [], "invalid_input"),
    ],
)
def test_check_55_56_steer_failures_return_the_original_input(extra, input, code):
    s = new_session()
    events, _ = steer(s, "resp_unknown", input=input, **extra)
    (failed,) = events
    assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == code
    assert failed["steer"] == {"input": input, "previous_response_id": "resp_unknown"}


def test_steering_a_completed_text_answer_fails_already_completed():
    s = new_session()
    resp = terminal(answer_text(s, send(s, input="hi", store=False)))
    (failed,), _ = steer(s, resp["id"])
    assert failed["error"]["code"] == "response_already_completed"


def test_append_mode_runs_a_whole_rollout_in_one_response():
    from actors.protocol import parse_items
    from inference.types import FunctionCallDelta

    s = Session(SessionConfig(), [MODEL], session_key="c", append_mode=True, clock=lambda: 1.0)
    fx = send(s, input="fix it", tools=[TOOL], store=False)
    (turn,) = fx.start
    first_prompt = len(turn.request.prompt_token_ids)
    paused = handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(first_prompt, 0, 0, 1),
                FunctionCallDelta(0, "read_file", '{"path":"a.py"}', 5),
                Done("tool_calls", 5, 5.0),
            ],
        ),
    )
    types = [e.type for e in paused.events]
    assert types[-1] == "response.output_item.done" and not any(
        t.startswith("response.completed") for t in types
    )
    call_id = paused.events[-1].item.call_id
    resumed = handled(
        s,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.append",
                    "response_id": turn.builder.response.id,
                    "input": [{"type": "function_call_output", "call_id": call_id, "output": "x=1"}],
                }
            )
        ),
    )
    assert resumed.events == [] and resumed.start == [turn], "no new response, same turn resumes"
    assert len(turn.request.prompt_token_ids) > first_prompt and turn.request.tool_results_in_context == 1
    done = handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(len(turn.request.prompt_token_ids), first_prompt, 0, 1),
                TextDelta("Fixed.", 2),
                Done("stop", 2, 2.0),
            ],
        ),
    )
    events = dumped(fx) + dumped(paused) + dumped(done)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [o["type"] for o in final["output"]] == ["function_call", "message"]
    assert events[-5]["output_index"] == 1, "the resumed output continues the same response"
    assert final["usage"]["output_tokens"] == 7 and final["usage"]["input_tokens"] > 2 * first_prompt - 1
    entry = s.cached(None)
    assert [i["type"] for i in entry.items] == ["message", "function_call", "function_call_output", "message"]
    assert list(entry.tokens) == render_items(parse_items(entry.items))


def test_response_append_is_unknown_on_standard_connections():
    s = new_session()
    (err,) = dumped(
        handled(s, ClientFrame(json.dumps({"type": "response.append", "response_id": "resp_x", "input": []})))
    )
    assert err["error"]["code"] == "unknown_event_type" and err["error"]["param"] == "type"


def test_input_over_the_token_limit_is_refused_before_inference():
    s = new_session(max_input_tokens=50)
    (err,) = dumped(send(s, input="word " * 100))
    assert err["status"] == 400 and err["error"]["code"] == "context_length_exceeded"


def test_cache_memory_per_connection_is_bounded_oldest_lanes_first():
    s = new_session(max_cached_tokens=60)
    ids = []
    for lane in ("a", "b", "c"):
        ids.append(
            terminal(answer_text(s, send(s, input="some words " * 6, stream_id=lane, store=False)))["id"]
        )
    cached = [lane for lane in ("a", "b", "c") if s.cached(lane) is not None]
    assert cached[-1] == "c" and "a" not in cached
    assert sum(len(s.cached(x).tokens) for x in cached) <= 60 or cached == ["c"]
    (err,) = dumped(send(s, input="x", stream_id="a", store=False, previous_response_id=ids[0]))
    assert err["error"]["code"] == "previous_response_not_found"


def test_packed_connections_share_the_hosts_cache_budget_least_recently_used_connection_first():
    """Two connections on one host with a host budget that holds one conversation: the
    connection that continued last keeps its context, the other's is evicted; a closed
    connection stops counting."""
    host = CacheBudget(max_tokens=60)
    one, two = (
        Session(SessionConfig(), [MODEL], session_key=k, clock=lambda: 1_700_000_000.0, cache=host)
        for k in ("conn-1", "conn-2")
    )
    first = terminal(answer_text(one, send(one, input="some words " * 15, store=False)))["id"]
    terminal(answer_text(two, send(two, input="other words " * 15, store=False)))
    assert host.total <= 60 and host.evictions == 1
    (err,) = dumped(send(one, input="x", store=False, previous_response_id=first))
    assert err["error"]["code"] == "previous_response_not_found"
    handled(two, Released())
    assert host.total == 0


def test_another_connections_eviction_is_an_effect_its_session_carries_out_when_handed_it():
    """The host's budget takes another connection's lane: the session that caused it returns
    an Eviction; the other session's lane is cleared only when it handles LaneEvicted, and a
    lane that moved on since keeps its newer response."""
    host = CacheBudget(max_tokens=60)
    one, two = (
        Session(SessionConfig(), [MODEL], session_key=k, clock=lambda: 1_700_000_000.0, cache=host)
        for k in ("conn-1", "conn-2")
    )
    first = terminal(answer_text(one, send(one, input="some words " * 15, store=False)))["id"]
    (turn,) = send(two, input="other words " * 15, store=False).start
    fx = two.handle(
        InferenceChunk(turn.turn_id, [Prefilled(10, 0, 0, 1), TextDelta("Hi", 1), Done("stop", 1, 1.0)])
    )
    (eviction,) = fx.evict
    assert (eviction.session, eviction.lane, eviction.response_id) == (one, None, first)
    assert one.cached(None) is not None, "nothing changed in place"
    assert host.total == len(two.cached(None).tokens), "but it no longer counts"
    assert one.handle(LaneEvicted(None, "resp_other")).events == [] and one.cached(None) is not None
    one.handle(LaneEvicted(eviction.lane, eviction.response_id))
    assert one.cached(None) is None


def test_a_response_whose_record_could_not_be_written_stops_counting_against_the_hosts_budget():
    host = CacheBudget(max_tokens=10_000)
    s = Session(SessionConfig(), [MODEL], session_key="conn-1", clock=lambda: 1_700_000_000.0, cache=host)
    done = answer_text(s, send(s, input="some words " * 15), written=False)
    (record,) = done.persist
    assert host.total == len(s.cached(None).tokens) > 0
    handled(s, Written(record.id, False))
    assert s.cached(None) is None
    assert host.total == 0, "an uncached conversation is not counted"
    (err,) = dumped(send(s, input="x", previous_response_id=record.id))
    assert err["error"]["code"] == "previous_response_not_found"


def test_a_response_whose_write_failed_leaves_its_lane_as_it_was_so_the_same_request_can_be_sent_again():
    """The store could not take a continuation's record or line (store_unavailable): the lane
    goes back to its parent — a store:false one, which only the lane holds — and the same
    request sent again continues from it."""
    s = new_session()
    parent = terminal(answer_text(s, send(s, input="first", store=False)))["id"]
    done = answer_text(s, send(s, input="second", previous_response_id=parent), written=False)
    (record,) = done.persist
    assert s.cached(None).response_id == record.id
    handled(s, Written(record.id, False))
    assert (entry := s.cached(None)) is not None and entry.response_id == parent
    again = answer_text(s, send(s, input="second", previous_response_id=parent))
    assert terminal(again)["status"] == "completed"
    assert terminal(again)["previous_response_id"] == parent


def test_instructions_and_tools_resent_every_turn_are_reused_and_a_change_is_rendered_and_validated():
    from actors.core.render import tool_specs
    from actors.protocol import FunctionTool
    from inference import chat_format

    def prefix(tools: list[dict], instructions: str) -> list[int]:
        specs = tool_specs([FunctionTool.model_validate(t) for t in tools])
        return chat_format.render_tools(specs) + chat_format.render_instructions(instructions)

    other = {**TOOL, "name": "list_dir"}
    s = new_session()
    prev = None
    steps = [
        ("Be brief.", [TOOL]),
        ("Be brief.", [TOOL]),
        ("Be thorough.", [TOOL]),
        ("Be thorough.", [TOOL, other]),
        ("Be brief.", [TOOL]),
    ]
    for instructions, tools in steps:
        body = {"instructions": instructions, "tools": tools, "store": False, "input": "go on"}
        if prev is not None:
            body["previous_response_id"] = prev
        fx = send(s, **body)
        (turn,) = fx.start
        want = prefix(tools, instructions)
        assert list(turn.request.prompt_token_ids[: len(want)]) == want
        assert [t.name for t in turn.request.tools] == [t["name"] for t in tools]
        prev = terminal(answer_text(s, fx))["id"]
    # A changed tool list is validated again: a duplicate name is a typed error, and the
    # session keeps working with the previous definitions.
    (err,) = dumped(send(s, previous_response_id=prev, store=False, tools=[TOOL, TOOL], input="again"))
    assert err["type"] == "error" and err["error"]["param"] == "tools[1].name"
    fx = send(s, store=False, tools=[TOOL], instructions="Be brief.", input="fresh")
    assert list(fx.start[0].request.prompt_token_ids[: len(prefix([TOOL], "Be brief."))]) == prefix(
        [TOOL], "Be brief."
    )


def test_event_snapshots_keep_their_moment_while_sharing_the_echoed_tools():
    s = new_session()
    fx = answer_call(s, send(s, input="read it", tools=[TOOL], instructions="Be brief."))
    created, in_progress, completed = fx.events[0], fx.events[1], fx.events[-1]
    assert created.response.output == [] and in_progress.response.output == []
    assert created.response.status == "in_progress" and completed.response.status == "completed"
    assert len(completed.response.output) == 1
    assert created.response.tools == completed.response.tools == [{**TOOL, "strict": True}]
    assert created.response.instructions == "Be brief."


# --- a large input is tokenised by the driver, off the event loop (render_offload_chars) -------


def test_a_large_input_is_rendered_by_the_driver_and_then_starts_as_an_inline_one_would():
    body = dict(input="a long tool log line\n" * 20, tools=[TOOL], instructions="Be brief.")
    inline = send(new_session(), **body)
    s = new_session(render_offload_chars=100)
    fx = send(s, **body)
    assert not fx.events and not fx.start and len(fx.render) == 1, "nothing starts before the tokens"
    assert not s.idle and s.inflight == 1
    (job,) = fx.render
    fx = handled(s, Rendered(job.render_id, render_marked(job.items)))
    (turn,) = fx.start
    assert turn.request.prompt_token_ids == inline.start[0].request.prompt_token_ids
    assert turn.timer.ms["render"] > 0
    assert_event_types(dumped(answer_text(s, fx)), TEXT_ANSWER)
    assert not send(s, input="short").render, "a small input is rendered inline"


def test_a_failed_render_is_server_error_and_the_lane_stays_usable():
    s = new_session(render_offload_chars=10)
    (job,) = send(s, input="x" * 50).render
    (error,) = dumped(handled(s, Rendered(job.render_id, None)))
    assert error["type"] == "error" and error["error"]["code"] == "server_error"
    assert s.idle
    (job,) = send(s, input="y" * 50).render
    assert handled(s, Rendered(job.render_id, render_marked(job.items))).start


def test_tokens_arriving_after_a_disconnect_are_dropped():
    s = new_session(render_offload_chars=10)
    (job,) = send(s, input="x" * 50).render
    handled(s, Disconnected())
    assert s.idle
    fx = handled(s, Rendered(job.render_id, render_marked(job.items)))
    assert not (fx.events or fx.start)


def test_a_create_returns_its_model_call_as_an_effect_and_never_calls_its_driver():
    """The call to start comes out in the effects, with the turn whose response carries
    the call's id; the session has no hook a driver could set to be called back."""
    session = new_session()
    fx = send(session, input="hello")
    (turn,) = fx.start
    created = fx.events[0].response
    assert created.id == turn.request.request_id and created.model == turn.request.model
    assert created.parallel_tool_calls is turn.request.parallel_tool_calls
    assert not hasattr(session, "start_call")


def test_a_created_response_is_built_only_once_its_driver_says_the_call_has_left():
    """The create's effects hold the call and no event; the response object and its first
    events (which read the clock) are built when the driver hands in ``CallsStarted``."""
    reads: list[str] = []
    session = Session(
        SessionConfig(), [MODEL], session_key="conn-1", clock=lambda: reads.append("clock") or 1_700_000_000.0
    )
    fx = session.handle(
        ClientFrame(json.dumps({"type": "response.create", "model": MODEL, "input": "hello"}))
    )
    (turn,) = fx.start
    assert turn.request.prompt_token_ids and fx.events == [] and fx.opening == (turn.turn_id,)
    assert "clock" not in reads and not turn.opened
    opened = session.handle(CallsStarted(fx.opening))
    assert [e.type for e in opened.events] == [
        "response.created",
        "response.in_progress",
    ] and "clock" in reads
    assert opened.events[0].response.id == turn.request.request_id
    assert session.handle(CallsStarted(fx.opening)).events == [], "built once"
    assert turn.open() is turn.open()


def test_effects_add_up_in_order():
    session = new_session()
    first = send(session, input="one", stream_id="a")
    combined = Effects(events=[error_event(InvalidRequest("before"), stream_id="x")])
    combined += send(session, input="two", stream_id="b")
    combined.events.append(error_event(InvalidRequest("after"), stream_id="y"))
    assert [(e.type, e.stream_id) for e in combined.events] == [
        ("error", "x"),
        ("response.created", "b"),
        ("response.in_progress", "b"),
        ("error", "y"),
    ]
    assert [e.type for e in first.events] == ["response.created", "response.in_progress"]
    assert [t.lane for t in combined.start] == ["b"]


def test_a_drain_is_an_event_into_the_session_later_creates_are_refused():
    session = new_session()
    running = send(session, input="before")
    assert handled(session, DrainStarted()).events == [] and session.draining
    (err,) = dumped(send(session, input="after", stream_id="other"))
    assert err["error"]["code"] == "server_shutting_down"
    answer_text(session, running)
    assert session.idle
