"""A session's resumable state (actors/core/resumable.py): what a new holder rebuilds from
the items kept in the cluster store continues the chain exactly as the old holder would."""

from __future__ import annotations

import json

from actors.core.inputs import ClientFrame, InferenceChunk, StateRestored
from actors.core.session import Effects
from inference.types import Done, Prefilled, TextDelta
from tests.actors.test_session import (
    TOOL,
    answer_call,
    answer_text,
    dumped,
    new_session,
    send,
    stored,
    terminal,
)
from tests.support.session_driver import handled


def test_a_restored_session_continues_store_false_chains_on_every_lane_with_the_same_prompt():
    old = new_session()
    first = terminal(answer_text(old, send(old, input="hello", store=False)))
    side = terminal(answer_text(old, send(old, input="aside", store=False, stream_id="b"), "Other"))
    raw = old.snapshot()
    assert b"Hi there" in raw and json.loads(raw)["v"] == 1

    new = new_session()
    handled(new, StateRestored(raw))
    for session in (old, new):  # the same next turn on the old holder and the new one
        fx = send(session, input="more", store=False, previous_response_id=first["id"])
        (turn,) = fx.start
        session.prompt = list(turn.request.prompt_token_ids)  # type: ignore[attr-defined]
        fx2 = send(session, input="more b", store=False, previous_response_id=side["id"], stream_id="b")
        assert fx2.start, dumped(fx2)
    assert new.prompt == old.prompt  # type: ignore[attr-defined]


def test_a_response_unknown_to_the_snapshot_is_not_found_after_a_restore():
    old = new_session()
    answer_text(old, send(old, input="hello", store=False))
    new = new_session()
    handled(new, StateRestored(old.snapshot()))
    err = dumped(send(new, input="x", store=False, previous_response_id="resp_unknown"))[-1]
    assert err["type"] == "error" and err["error"]["code"] == "previous_response_not_found"


def test_steer_input_waiting_on_function_calls_survives_a_restore():
    old = new_session()
    stopped = terminal(answer_call(old, send(old, input="read it", store=False, tools=[TOOL])))
    steer = {"type": "response.steer", "previous_response_id": stopped["id"], "input": "use b.py"}
    kinds = [e["type"] for e in dumped(handled(old, ClientFrame(json.dumps(steer))))]
    assert kinds == ["response.steer.accepted", "response.steer.pending"]
    state = json.loads(old.snapshot())
    assert state["steers"] and state["steers"][0]["items"][0]["content"] == "use b.py"

    new = new_session()
    handled(new, StateRestored(old.snapshot()))
    call_id = stopped["output"][0]["call_id"]
    fx = send(
        new,
        store=False,
        tools=[TOOL],
        previous_response_id=stopped["id"],
        input=[{"type": "function_call_output", "call_id": call_id, "output": "x"}],
    )
    (turn,) = fx.start
    assert "use b.py" in json.dumps(turn.inputs), turn.inputs  # the steer input went first


def test_a_restored_session_asks_for_the_replica_that_served_its_conversation():
    """The replica that served a lane's latest response is kept, and the next call names it
    (``replica_hint``), so a session resumed in another process finds its prefix cache."""
    old = new_session()
    fx = send(old, input="hello", store=False)
    (turn,) = fx.start
    assert turn.request.replica_hint is None  # a new conversation: routed by its prefix
    out = Effects(events=list(fx.events))
    out += handled(
        old,
        InferenceChunk(turn.turn_id, [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1, replica="r-7")]),
    )
    out += handled(old, InferenceChunk(turn.turn_id, [TextDelta("Hi", 1), Done("stop", 1, 1.0)]))
    first = terminal(stored(old, out))
    assert json.loads(old.snapshot())["lanes"][0]["replica"] == "r-7"

    new = new_session()
    handled(new, StateRestored(old.snapshot()))
    for session in (old, new):
        (turn,) = send(session, input="more", store=False, previous_response_id=first["id"]).start
        assert turn.request.replica_hint == "r-7"
