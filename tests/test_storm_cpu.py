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


def test_a_recordings_window_is_counted_back_from_its_end_and_its_idle_samples_left_out() -> None:
    from investigations.storm_profile import summary, window_samples

    frames = [
        {"name": "Thread.run", "file": "/x/threading.py"},
        {"name": "Session.handle", "file": "/x/session.py"},
        {"name": "parse", "file": "/x/requests.py"},
        {"name": "flush", "file": "/x/websocket.py"},
    ]
    # 10 samples a second, the last at t=10: samples 0-9 were taken at t=9.1..10.0
    busy_thread = {"name": "loop", "samples": [[0]] * 4 + [[0, 1, 2], [0, 1, 2], [0, 1], [0, 3]] + [[0]] * 2}
    quiet_thread = {"name": "other", "samples": [[0]] * 10}
    assert window_samples(busy_thread, 10.0, 10, 9.4, 9.8) == busy_thread["samples"][3:8]
    recording = {"shared": {"frames": frames}, "profiles": [quiet_thread, busy_thread]}
    got = summary(recording, 10.0, 10, 9.4, 9.8)
    assert (got["thread"], got["samples"], got["busy"]) == ("loop", 5, 4)
    assert got["inclusive"]["Session.handle (session.py)"] == 75.0
    assert got["own"] == {
        "parse (requests.py)": 50.0,
        "Session.handle (session.py)": 25.0,
        "flush (websocket.py)": 25.0,
    }
    assert summary(recording, 10.0, 10, 9.0, 9.3)["busy"] == 0  # only idle samples then
