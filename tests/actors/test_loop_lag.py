"""LoopLag: a response is charged the worst event-loop stall within its own time on the
server, and only the part of a stall after it started."""

from __future__ import annotations

import pytest

from actors.core.loop_lag import LoopLag
from actors.core.timings import PhaseTimer


def test_the_worst_stall_after_the_start_is_reported():
    lag = LoopLag(bucket_s=0.02, buckets=100)
    lag.record(1.00, 0.004)
    lag.record(1.30, 0.150)  # the loop was stuck from 1.15 to 1.30
    lag.record(1.50, 0.010)
    assert lag.worst_since(0.5) == pytest.approx(0.150)
    assert lag.worst_since(1.31) == pytest.approx(0.010)  # the stall before its start is not its own
    assert lag.worst_since(1.51) == 0.0


def test_a_response_that_started_during_a_stall_is_charged_the_part_after_its_start():
    lag = LoopLag(bucket_s=0.02, buckets=100)
    lag.record(2.00, 0.500)  # stuck from 1.50 to 2.00
    assert lag.worst_since(1.90) == pytest.approx(0.100)
    assert lag.worst_since(1.40) == pytest.approx(0.500)


def test_a_probe_on_time_records_nothing():
    lag = LoopLag()
    lag.record(3.0, 0.0)
    lag.record(3.1, -0.001)  # the loop's clock runs a callback a hair early
    assert lag.worst_since(0.0) == 0.0


def test_the_ring_forgets_what_is_older_than_its_buckets():
    lag = LoopLag(bucket_s=0.1, buckets=10)  # one second kept
    lag.record(0.05, 0.04)
    lag.record(5.05, 0.02)  # the slot the first used is reused by a later bucket
    lag.record(0.95, 0.03)  # out of order is fine: each slot knows its bucket
    assert lag.worst_since(0.0) == pytest.approx(0.02)  # older than the ring: not counted
    assert lag.worst_since(5.0) == pytest.approx(0.02)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        LoopLag(bucket_s=0)
    with pytest.raises(ValueError):
        LoopLag(buckets=0)


def test_the_timer_reports_the_stall_since_its_start_in_ms_outside_the_phase_sums():
    now = [10.0]
    seen: list[float] = []

    def worst_since(t: float) -> float:
        seen.append(t)
        return 0.0125

    timer = PhaseTimer(lambda: now[0], started=9.998, lag=worst_since)
    now[0] += 0.005
    report = timer.report(queue_ms=0.0, prefill_ms=1.0, decode_ms=2.0)
    assert report["loop_lag"] == 12.5 and seen == [9.998]
    assert report["api_overhead"] == 4.0 and report["other"] == 4.0  # the lag is not a phase
    assert "loop_lag" not in PhaseTimer(lambda: now[0]).report(0.0, 0.0, 0.0)
