"""The soak's invariant checker accepts the protocol page's event orders and flags each way a stream
can go wrong (docs/protocol.md §3.1–§3.3, §4): it provably can fail."""

from __future__ import annotations

import copy

import pytest

from bench.invariants import RunCheck


def _response(rid: str, status: str, output: list, prev: str | None = None) -> dict:
    usage = None if status == "in_progress" else {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}
    return {
        "id": rid,
        "object": "response",
        "status": status,
        "output": output,
        "usage": usage,
        "previous_response_id": prev,
    }


def text_answer(
    rid: str = "resp_1",
    mid: str = "msg_1",
    prev: str | None = None,
    deltas: tuple[str, ...] = ("Hi", " there"),
) -> list[dict]:
    """docs/protocol.md §3.2, exactly."""
    text = "".join(deltas)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    done_item = {"id": mid, "type": "message", "status": "completed", "role": "assistant", "content": [part]}
    evs = [
        {"type": "response.created", "response": _response(rid, "in_progress", [], prev)},
        {"type": "response.in_progress", "response": _response(rid, "in_progress", [], prev)},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {
                "id": mid,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            "item_id": mid,
            "output_index": 0,
            "content_index": 0,
            "part": {**part, "text": ""},
        },
        *(
            {
                "type": "response.output_text.delta",
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "delta": d,
                "logprobs": [],
            }
            for d in deltas
        ),
        {
            "type": "response.output_text.done",
            "item_id": mid,
            "output_index": 0,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": mid,
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": _response(rid, "completed", [done_item], prev)},
    ]
    return [{**e, "sequence_number": i} for i, e in enumerate(evs)]


def call_answer(
    rid: str = "resp_2", fid: str = "fc_1", call_id: str = "call_1", prev: str | None = None
) -> list[dict]:
    """docs/protocol.md §3.3, exactly."""
    item = {
        "id": fid,
        "type": "function_call",
        "status": "in_progress",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": "",
    }
    done_item = {**item, "status": "completed", "arguments": '{"city":"Paris"}'}
    evs = [
        {"type": "response.created", "response": _response(rid, "in_progress", [], prev)},
        {"type": "response.in_progress", "response": _response(rid, "in_progress", [], prev)},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fid,
            "output_index": 0,
            "delta": '{"city":',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fid,
            "output_index": 0,
            "delta": '"Paris"}',
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": fid,
            "output_index": 0,
            "arguments": '{"city":"Paris"}',
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": _response(rid, "completed", [done_item], prev)},
    ]
    return [{**e, "sequence_number": i} for i, e in enumerate(evs)]


def run(*turns: tuple[str | None, list[dict]], close: bool = True, run: RunCheck | None = None) -> RunCheck:
    """One connection: for each (previous_response_id sent, events received) a create, then its events."""
    check = run or RunCheck()
    conn = check.connection("c0")
    for prev, events in turns:
        conn.create_sent(prev)
        for ev in events:
            conn.feed(ev)
    if close:
        conn.close()
    return check


def test_a_chain_of_spec_shaped_responses_passes():
    check = run(
        (None, call_answer("resp_1")),
        ("resp_1", call_answer("resp_2", "fc_2", "call_2", prev="resp_1")),
        ("resp_2", text_answer("resp_3", prev="resp_2")),
    )
    assert check.ok, check.summary()
    assert check.counts["creates"] == check.counts["created"] == check.counts["completed"] == 3


def _mutated(events: list[dict], edit) -> list[dict]:
    events = copy.deepcopy(events)
    edit(events)
    return events


def _renumber(events: list[dict]) -> list[dict]:
    return [{**e, "sequence_number": i} for i, e in enumerate(events)]


def _renumbered(edit):
    def apply(e: list[dict]) -> None:
        edit(e)
        e[:] = _renumber(e)

    return apply


def _swap(e: list[dict], i: int, j: int) -> None:
    e[i], e[j] = e[j], e[i]


def _fail(e: list[dict]) -> None:
    e[-1]["type"] = "response.failed"
    e[-1]["response"]["status"] = "failed"


# name -> (edit of a valid §3.2 stream, the violation kind it must raise)
VIOLATIONS = {
    "sequence starts at 1": (
        lambda e: [x.update(sequence_number=x["sequence_number"] + 1) for x in e],
        "sequence",
    ),
    "sequence gap": (lambda e: e[4].update(sequence_number=9), "sequence"),
    "duplicate event": (lambda e: e.insert(4, dict(e[4])), "sequence"),
    "two response.created": (_renumbered(lambda e: e.insert(1, dict(e[0]))), "order"),
    "no response.in_progress": (_renumbered(lambda e: e.pop(1)), "order"),
    "part before item": (_renumbered(lambda e: _swap(e, 2, 3)), "order"),
    "second terminal": (lambda e: e.append({**e[-1], "sequence_number": len(e)}), "stray_event"),
    "deltas do not add up": (lambda e: e[4].update(delta="Ho"), "consistency"),
    "delta names another item": (lambda e: e[4].update(item_id="msg_other"), "consistency"),
    "terminal lists other items": (lambda e: e[-1]["response"].update(output=[]), "consistency"),
    "terminal of another response": (lambda e: e[-1]["response"].update(id="resp_x"), "consistency"),
    "usage does not add up": (lambda e: e[-1]["response"]["usage"].update(total_tokens=99), "consistency"),
    "stream_id on the default lane": (lambda e: e[3].update(stream_id="main"), "stream_id"),
    "response failed": (_fail, "not_completed"),
}


@pytest.mark.parametrize("name", list(VIOLATIONS))
def test_each_broken_stream_is_flagged(name: str):
    edit, kind = VIOLATIONS[name]
    check = run((None, _mutated(text_answer(), edit)))
    assert not check.ok
    assert check.violations[kind] >= 1, check.summary()


def test_a_create_without_its_response_is_lost():
    check = run((None, text_answer()[:-1]))  # no terminal event
    assert check.violations["lost"] == 1
    check = run((None, []))  # nothing at all
    assert check.violations["lost"] == 1


def test_events_with_no_create_outstanding_are_stray():
    check = RunCheck()
    conn = check.connection("c0")
    conn.feed(text_answer()[0])
    assert check.violations["stray_event"] == 1


def test_ids_must_be_unique_across_the_whole_run():
    check = run((None, text_answer("resp_1", "msg_1")))
    run((None, text_answer("resp_1", "msg_2")), run=check)  # same response id, another connection
    run((None, text_answer("resp_9", "msg_1")), run=check)  # same item id
    run(
        (None, call_answer("resp_7", "fc_7", "call_1")),
        (None, call_answer("resp_8", "fc_8", "call_1")),
        run=check,
    )
    assert check.violations["duplicate_id"] == 3


def test_checks_of_one_run_by_several_client_processes_merge_and_keep_ids_unique_across_them():
    one = run((None, text_answer("resp_1", "msg_1")))
    other = run(
        (None, text_answer("resp_1", "msg_2")),
        (None, _mutated(text_answer("resp_3", "msg_3"), lambda e: e[4].update(sequence_number=9))),
    )
    one.merge(other)
    assert one.counts["creates"] == 3 and one.counts["connections"] == 2
    assert one.violations["duplicate_id"] == 1 and one.violations["sequence"] >= 1
    assert {e.kind for e in one.examples} == {"duplicate_id", "sequence"}


def test_the_chain_must_hold_previous_response_id_echoed_and_no_error():
    check = run((None, call_answer("resp_1")), ("resp_1", text_answer("resp_2", prev=None)))
    assert check.violations["chain"] == 1
    error = {
        "type": "error",
        "status": 400,
        "error": {"type": "invalid_request_error", "code": "previous_response_not_found"},
    }
    check = run((None, call_answer("resp_1")), ("resp_1", [error]))
    assert check.violations["error_event"] == 1 and check.violations["lost"] == 0


def test_summary_lists_counts_and_examples():
    s = run((None, _mutated(text_answer(), lambda e: e[4].update(sequence_number=9)))).summary()
    assert s["ok"] is False and s["violations"]["sequence"] >= 1
    assert s["examples"][0]["kind"] == "sequence" and s["examples"][0]["conn"] == "c0"
