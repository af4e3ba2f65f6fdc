"""The prefix-locality experiment's sessions from the load runner's records
(bench/multinode/locality.py): each session's completed turns with the replica the store
named and the node its connection went to, and a replica-set change from the turns each
session completed across it."""

from __future__ import annotations

import pytest

from bench.multinode import locality
from bench.runner import ConnectionRecord, LoadResult, TurnRecord

pytestmark = pytest.mark.unit

PLAN = locality.Plan(sessions=2)


def turn(loop: int, sent: float, connection: int, replica: str | None, ok: bool = True) -> TurnRecord:
    return TurnRecord(
        loop, "steady", sent, 5.0, None, ok, connection=connection, note=replica, input_tokens=1300,
        cached_tokens=1280,
    )  # fmt: skip


def test_a_sessions_turns_are_its_completed_ones_in_order_on_the_node_of_their_connection():
    records = [
        turn(0, 3.0, 1, "r2"),
        turn(0, 1.0, 0, "r1"),
        turn(0, 2.0, 0, "r1"),
        turn(1, 1.0, 0, "r3"),
        turn(1, 2.0, 0, None, ok=False),  # failed: not a turn of the session
    ]
    connections = [
        ConnectionRecord(0, 0, 0.5, 40001, server="session1", target="ws://lb/v1/responses"),
        ConnectionRecord(0, 1, 2.5, 40002, target="ws://10.0.0.3/v1/responses"),  # direct: no balancer answer
        ConnectionRecord(1, 0, 0.5, 40003, target="ws://lb/v1/responses"),  # the balancer never said
    ]
    result = LoadResult(records, [], connections=connections)
    s0, s1 = locality.sessions(result, PLAN, {"ws://10.0.0.3/v1/responses": "session2"})
    assert [t.replica for t in s0.turns] == ["r1", "r1", "r2"] and s0.turns[0].at == 1.005
    assert s0.nodes == ["session1", "session1", "session2"]
    assert [(t.replica, t.input_tokens, t.cached_tokens) for t in s1.turns] == [("r3", 1300, 1280)]
    assert s1.nodes == [None]


def test_a_change_is_judged_on_the_turns_each_session_completed_across_it():
    a, b = locality.Session(), locality.Session()
    for replica in ("r1", "r1", "r1", "r2", "r2"):
        a.turns.append(locality.Turn(replica, 1300, 0))
    for replica in ("r3", "r3", "r3", "r3", "r3"):
        b.turns.append(locality.Turn(replica, 1300, 0))
    full = [{"replica": r, "node": "n"} for r in ("r1", "r2", "r3")]
    span = locality.Span("scale-down", full, full[1:], {0: 3, 1: 2}, {0: 5, 1: 5}, 7.5)
    c = locality.changed(span, [a, b])
    assert (c.moves.moved, c.moves.forced, c.moves.sessions) == ({"0"}, {"0"}, 2)
    assert c.turns_during == 5 and c.seconds_to_settle == 7.5 and c.replicas_after == full[1:]


def test_a_sessions_first_input_is_its_own_past_the_cached_minimum():
    text = locality.first_input(PLAN)
    assert text.startswith("session {loop} opens its task: ") and len(text) // 5 > 1024
    shared = locality.first_input(locality.Plan(shared_instructions=True))
    assert shared.startswith(locality.INSTRUCTIONS) and len(shared) <= len(text) + 5


def test_the_pressure_is_the_runners_stateless_requests_and_counts_every_run():
    p = locality.Pressure("http://lb", 4, 4000)
    assert (p.spec.transport, p.spec.workload, p.spec.loops) == ("http-full", "chains", 4)
    assert (p.spec.chains.reasoning_tokens, p.spec.chains.text_tokens) == (4000, (1, 1))
    p.runs = [
        LoadResult([turn(0, 1.0, 0, None), turn(1, 1.0, 0, None, ok=False)], [], errors={1: ["connect: x"]}),
        LoadResult([turn(0, 9.0, 0, None)], []),
    ]
    p.runs[0].records[1].error_code = "http_error:ReadTimeout"
    assert p.sent == 2 and p.errors == ["http_error:ReadTimeout", "connect: x"]
    p.stop()  # not running: nothing to end
    assert len(p.runs) == 2
