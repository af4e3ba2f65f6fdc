"""bench admission: where in a ramp the slow connects were."""

from __future__ import annotations

from bench.kinds import admission


def test_per_second_bins_connects_by_when_they_started():
    started = [10.0, 10.4, 11.2, 12.9]
    took = [0.002, 0.004, 0.5, 0.003]
    assert admission.per_second(started, took) == [[0, 2, 3.0, 4.0], [1, 1, 500.0, 500.0], [2, 1, 3.0, 3.0]]
    assert admission.per_second([], []) == []
