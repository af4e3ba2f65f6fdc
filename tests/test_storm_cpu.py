"""investigations.storm_cpu's arithmetic: a role's CPU over the storm window per first create."""

from __future__ import annotations

from investigations.storm_cpu import cpu_between, per_first_create


def test_cpu_over_a_window_is_taken_from_the_samples_nearest_after_its_ends() -> None:
    series = [(0.0, 1.0), (1.0, 1.5), (2.0, 2.5), (3.0, 2.5)]
    assert cpu_between(series, 0.5, 2.0) == 1.0  # 2.5 at 2.0 less 1.5 at 1.0
    assert cpu_between(series, 1.0, 3.0) == 1.0
    assert cpu_between(series, -1.0, 2.0) is None  # not covered: the process started later
    assert cpu_between(series, 1.0, 4.0) is None


def test_each_roles_cpu_per_first_create_sums_its_processes() -> None:
    samples = {
        1: [(0.0, 0.0), (1.0, 0.512)],
        2: [(0.0, 1.0), (1.0, 1.256)],
        3: [(0.0, 0.0), (1.0, 0.256)],
        4: [(0.5, 0.0), (1.0, 9.0)],  # started inside the window: left out
    }
    roles = {1: "session_host", 2: "session_host", 3: "inference", 4: "other"}
    assert per_first_create(samples, roles, 0.0, 1.0, 256) == {"inference": 1.0, "session_host": 3.0}
