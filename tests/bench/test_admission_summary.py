"""bench admission's figures from the load runner's results: the connects a phase opened (where
in a ramp the slow ones were), the creates sent on open and the turns on the held connections."""

from __future__ import annotations

import pytest

from bench import admission_report as report
from bench.kinds import admission
from bench.runner import LoadResult, TurnRecord

pytestmark = pytest.mark.unit


def test_per_second_bins_connects_by_when_they_started():
    started = [10.0, 10.4, 11.2, 12.9]
    took_ms = [2.0, 4.0, 500.0, 3.0]
    assert report.per_second(started, took_ms) == [[0, 2, 3.0, 4.0], [1, 1, 500.0, 500.0], [2, 1, 3.0, 3.0]]
    assert report.per_second([], []) == []


def turn(loop: int, kind: str, total_ms: float, ok: bool = True, code: str | None = None) -> TurnRecord:
    return TurnRecord(loop, kind, 100.0 + loop, total_ms, 1.0, ok, None, "http://t", 1.0, code)


def test_a_phases_connects_and_the_creates_sent_on_open():
    result = LoadResult(
        [
            turn(0, "first", 30.0),
            turn(1, "first", 50.0),
            turn(2, "first", 9.0, ok=False, code="ConnectionClosedError"),
        ],
        [],
        connects=[(10.0, 2.0), (10.5, 4.0), (11.2, 600.0)],
        connect_failures={"connect:http_503": 2},
    )
    out = report.connects(result)
    assert out["opened"] == 3 and out["failures"] == {"connect:http_503": 2}
    assert out["connect_ms"]["p50"] == 4.0 and out["connect_ms"]["max"] == 600.0
    assert out["per_second"] == [[0, 2, 3.0, 4.0], [1, 1, 600.0, 600.0]]
    opened = out["create_on_open"]
    assert opened["completed"] == 2 and opened["failures"] == {"ConnectionClosedError": 1}
    assert opened["turn_ms"]["p50"] == 40.0 and opened["turn_ms"]["max"] == 50.0
    assert "create_on_open" not in report.connects(LoadResult([], [], connects=[(1.0, 1.0)]))


def test_the_turns_on_the_held_connections_count_only_theirs():
    records = [
        turn(0, "first", 5.0),
        turn(0, "held", 10.0),
        turn(1, "held", 30.0),
        turn(2, "held", 1.0, ok=False, code="x"),
    ]
    held = report.held_turns(records, wanted=3, wall_s=2.0)
    assert (held["turns_completed"], held["turns_wanted"], held["failures"]) == (2, 3, {"x": 1})
    assert held["turns_per_s"] == 1.0 and held["turn_ms"]["p50"] == 20.0


def test_its_connections_arrive_on_the_runner_none_retried():
    spec = admission.arrivals("http://s", 2000, rate=200.0, open_timeout=30.0, create_turns=1)
    assert spec.arrivals and spec.ramp_s == 10.0 and spec.connect_attempts == 1 and spec.hold
    assert spec.rollouts_per_loop == 1 and spec.custom_workload is admission.SHORT
    burst = admission.arrivals("http://s", 10, rate=None, open_timeout=10.0)
    assert burst.ramp_s == 0.0 and burst.rollouts_per_loop == 0 and burst.open_timeout_s == 10.0
