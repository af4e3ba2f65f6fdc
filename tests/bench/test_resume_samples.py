"""``bench resume`` on the load runner: its clients one ``resume`` session each, and its
samples taken from the runner's records (a resume timed from its reconnect, the node each
connection went to)."""

from __future__ import annotations

import pytest

from bench.kinds.resume import Plan, client_runs, load_spec, summary
from bench.runner import ConnectionRecord, LoadResult, TurnRecord

pytestmark = pytest.mark.unit


def test_the_kind_times_a_resume_from_its_reconnect_and_says_when_it_moved_node():
    def turn(kind: str, conn: int, sent: float) -> TurnRecord:
        return TurnRecord(0, kind, sent, 10.0, None, True, connection=conn, cached_tokens=5, input_tokens=50,
                          first_event_ms=2.0, connect_ms=4.0 if kind == "resume" else None)  # fmt: skip

    records = [turn("first", 0, 1.0), turn("steady", 0, 2.0), turn("resume", 1, 3.0), turn("resume", 2, 4.0)]
    conns = [ConnectionRecord(0, i, 1.0, 100 + i, server=s) for i, s in enumerate(["a", "a", "b"])]
    result = LoadResult(records, [], connections=conns, errors={1: ["RuntimeError: turn failed"]})
    runs = client_runs(result, 2)
    steady, same, moved = runs[0].samples
    assert (steady.kind, steady.first_ms, steady.total_ms, steady.node) == ("steady", 2.0, 10.0, "a")
    assert (same.first_ms, same.total_ms, same.handshake_ms, same.moved) == (6.0, 14.0, 4.0, False)
    assert (moved.node, moved.moved) == ("b", True) and runs[1].errors == ["RuntimeError: turn failed"]
    s = summary(runs)
    assert s["resumes"] == 2 and s["resumes_moved_node"] == 1 and s["errors"] == ["RuntimeError: turn failed"]


def test_the_kinds_clients_are_one_resume_session_each():
    spec = load_spec(
        "ws://h/v1/responses", Plan(clients=3, resumes=4, steady=1, prefix_tokens=60, text_tokens=7)
    )
    assert (spec.workload, spec.loops, spec.rollouts_per_loop) == ("resume", 3, 1)
    assert (spec.resume.resumes, spec.resume.steady, spec.resume.text_tokens) == (4, 1, 7)
    assert "client {loop} task" in spec.resume.first_input
