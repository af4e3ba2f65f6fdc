"""A connection's request table: stages, the moves between them, what counts in flight and
which lanes are busy."""

from __future__ import annotations

import pytest

from actors.core.request_queue import InvalidTransition, Requests, Stage
from actors.core.timings import PhaseTimer
from actors.protocol import ResponseCreate


def add(requests: Requests, lane: str | None, *, first: bool = False):
    return requests.add(
        lane,
        ResponseCreate(model="emu-fast", input="x", stream_id=lane),
        PhaseTimer(lambda: 0.0),
        first=first,
    )


def test_stages_follow_the_lifecycle_and_any_other_move_is_refused():
    requests = Requests()
    r = add(requests, "a")
    for stage in (Stage.LOADING, Stage.RENDERING, Stage.RUNNING, Stage.FINISHING):
        requests.move(r, stage)
        assert r.stage is stage
    for stage in Stage:
        with pytest.raises(InvalidTransition):
            requests.move(r, stage)
    s = add(requests, "b")
    requests.move(s, Stage.RUNNING)  # neither a load nor a render needed
    with pytest.raises(InvalidTransition):
        requests.move(s, Stage.LOADING)


def test_every_stage_but_queued_is_in_flight_and_a_finishing_request_frees_its_lane():
    requests = Requests()
    a, b, c = add(requests, "a"), add(requests, "a"), add(requests, "b")
    assert requests.in_flight == 0 and requests.next_to_start(16) is a
    requests.move(a, Stage.RUNNING)
    assert requests.in_flight == 1 and requests.next_to_start(16) is c, "lane a is busy"
    assert requests.next_to_start(1) is None, "no slot free"
    requests.move(a, Stage.FINISHING)
    assert requests.in_flight == 1 and requests.next_to_start(16) is b
    assert requests.next_to_start(1) is None, "a finishing request still holds its slot"
    requests.drop(a)
    assert requests.in_flight == 0 and len(requests) == 2


def test_a_successor_is_queued_first_and_lookups_see_only_the_stage_asked_for():
    requests = Requests()
    a = add(requests, "a")
    successor = add(requests, "a", first=True)
    assert requests.next_to_start(16) is successor
    requests.move(successor, Stage.LOADING)
    assert requests.at(successor.id, Stage.LOADING) is successor
    assert requests.at(successor.id, Stage.RUNNING) is None and requests.at(a.id, Stage.LOADING) is None
    requests.drop(a)
    requests.clear()
    assert len(requests) == 0 and requests.next_to_start(16) is None
