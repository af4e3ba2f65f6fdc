"""``item_reference`` input items (docs/protocol.md §2.2) resolved by the session core to
the items they name — from the conversations the connection holds, else from the store —
so the model sees the item itself; an unknown id is a typed 400."""

from __future__ import annotations

import json

from actors.core.inputs import ClientFrame, HistoryLoaded, ItemsLoaded
from actors.core.session import Effects, Session
from store import StoredResponse
from store.base import item_in
from tests.actors.test_session import MODEL, TOOL, answer_call, answer_text, dumped, new_session, terminal
from tests.support.session_driver import handled


def send(session: Session, stored: list[StoredResponse] = (), **body) -> Effects:
    """A create frame; the store's part of its loads answered from ``stored`` (the owner's)."""
    fx = handled(session, ClientFrame(json.dumps({"type": "response.create", "model": MODEL, **body})))
    while fx.load:
        load = fx.load.pop(0)
        mine = [r for r in stored if r.owner == load.owner]
        if load.item_ids:
            found = {i: item for i in load.item_ids for r in mine if (item := item_in(r, i)) is not None}
            fx += handled(session, ItemsLoaded(load.load_id, found))
        else:
            record = next((r for r in mine if r.id == load.response_id), None)
            fx += handled(session, HistoryLoaded(load.load_id, record))
    return fx


def prompt(fx: Effects) -> list[int]:
    (turn,) = fx.start
    return list(turn.request.prompt_token_ids)


def test_a_reference_to_an_item_this_connection_holds_is_the_item_itself():
    s = new_session()
    first = terminal(answer_text(s, send(s, input="Hello", store=False), "An earlier answer"))
    message = first["output"][0]
    inline = {"type": "message", "role": "assistant", "content": "An earlier answer"}
    question = {"role": "user", "content": "And then?"}
    by_ref = send(s, store=False, input=[{"type": "item_reference", "id": message["id"]}, question])
    (turn,) = by_ref.start
    assert [i["type"] for i in turn.inputs] == ["message", "message"]
    assert (
        turn.inputs[0]["id"] == message["id"] and turn.inputs[0]["content"][0]["text"] == "An earlier answer"
    )
    answer_text(s, by_ref)
    other = new_session()  # the same conversation sent whole: the same prompt
    assert prompt(by_ref) == prompt(send(other, store=False, input=[inline, question]))


def test_a_reference_without_type_and_to_a_tool_call_resolve_and_pair():
    """``{"id"}`` alone is a reference too; a referenced function call issues its call id, so
    its output pairs with it."""
    s = new_session()
    first = terminal(answer_call(s, send(s, input="read it", tools=[TOOL], store=False)))
    call = first["output"][0]
    fx = send(
        s,
        store=False,
        tools=[TOOL],
        stream_id="other",  # another lane: found in the connection's cache all the same
        input=[
            {"role": "user", "content": "read it"},
            {"id": call["id"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "data"},
        ],
    )
    (turn,) = fx.start
    assert [i["type"] for i in turn.inputs] == ["message", "function_call", "function_call_output"]
    assert turn.request.tool_results_in_context == 1


def test_a_reference_to_a_stored_item_is_loaded_from_the_store_as_over_http():
    s = new_session()
    (record,) = answer_text(s, send(s, input="Hello"), "Stored answer").persist
    message_id = record.response["output"][0]["id"]
    fresh = new_session()  # another socket or an HTTP request: nothing cached
    fx = send(
        fresh,
        [record],
        input=[{"type": "item_reference", "id": message_id}, {"role": "user", "content": "Next?"}],
    )
    (turn,) = fx.start
    assert turn.inputs[0]["content"][0]["text"] == "Stored answer"
    assert fx.events[0].type == "response.created"


def test_an_unknown_reference_is_a_typed_400_and_the_connection_goes_on():
    s = new_session()
    (record,) = answer_text(s, send(s, input="Hello")).persist
    message_id = record.response["output"][0]["id"]
    for stored in ([], [record]):
        other = Session(s.config, [MODEL], session_key="c2", owner="someone-else", clock=lambda: 0.0)
        refs = [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_nope"}]
        for session, items in ((s, refs), (other, [{"type": "item_reference", "id": message_id}])):
            (error,) = dumped(send(session, stored, input=items))
            assert error["type"] == "error" and error["status"] == 400
            assert error["error"]["type"] == "invalid_request_error"
            assert (
                error["error"]["code"] == "item_not_found"
                and error["error"]["param"] == f"input[{len(items) - 1}]"
            )
    assert send(s, input="still here").events[0].type == "response.created"
