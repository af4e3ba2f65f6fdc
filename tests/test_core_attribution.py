"""investigations.core_sampler's reading of the scheduler's counters and
investigations.core_attribution's arithmetic: slow turns merged into bursts, a window's run
and wait by process group, each process's group."""

from __future__ import annotations

import os

from investigations.core_attribution import bursts, by_group, descendants, group_of, window
from investigations.core_sampler import Sampler


def test_slow_turns_overlapping_or_close_are_one_burst() -> None:
    turns = [[10.0, 30.0, 12.0], [10.02, 40.0, 15.0], [10.1, 30.0, 11.0], [12.0, 20.0, 13.0]]
    out = bursts(turns, gap_ms=50.0)
    assert [(b["turns"], b["worst_ms"]) for b in out] == [(3, 15.0), (1, 13.0)]
    assert out[0]["start"] == 10.0 and abs(out[0]["end"] - 10.13) < 1e-9
    assert len(bursts(turns, gap_ms=0.0)) == 3  # the third starts 40 ms after the second ended


def test_a_windows_run_and_wait_are_the_counters_last_read_at_its_ends() -> None:
    trace = {
        "t": [0.0, 1.0, 2.0, 3.0],
        "run_ns": [[0, 0], [1_000_000, 0], [3_000_000, 5_000_000], [4_000_000, 5_000_000]],
        "wait_ns": [[0, 0], [0, 2_000_000], [0, 2_000_000], [0, 9_000_000]],
    }
    run, wait = window(trace, 1.5, 3.0)  # from the sample at 1.0 to the one at 3.0
    assert run == [3.0, 5.0] and wait == [0.0, 7.0]
    assert by_group(run, ["host", "host"]) == {"host": 8.0}


def test_a_process_is_grouped_by_whose_run_it_is_and_its_title() -> None:
    meta = {
        "10": {"ppid": 1, "title": "responses-ws", "cwd": "/work/wt/host"},
        "11": {"ppid": 10, "title": "raylet", "cwd": "/tmp"},
        "12": {"ppid": 11, "title": "ray::SessionHost", "cwd": "/tmp"},
        "13": {"ppid": 1, "title": "ray::SessionHost", "cwd": "/work/wt/tests"},
    }
    own = descendants(meta, 10)
    assert own == {11, 12}
    groups = {p: group_of(int(p), m, own, bench_pid=10, sampler_pid=99) for p, m in meta.items()}
    assert groups == {
        "10": "bench",
        "11": "raylet",
        "12": "session_host",
        "13": "other:ray::SessionHost@tests",
    }


def test_the_sampler_sees_its_own_process_run() -> None:
    s = Sampler()
    s.full_scan()
    me = s.pid_index[os.getpid()]
    before = s.run[me]
    x = 0
    for i in range(200_000):  # some CPU of this process's own
        x += i
    s.full_scan()
    assert s.run[me] > before
    assert all(key[0] in s.pid_index for key in s.hot)
