"""bench capacity: the summary of a level (its loops: bench/runner, tests/bench/test_runner.py)."""

from __future__ import annotations

from bench.kinds import capacity


def record(loop, kind, sent, total_ms, model_ms=100.0, ok=True):
    return {"loop": loop, "kind": kind, "sent": sent, "total_ms": total_ms, "model_ms": model_ms, "ok": ok}


def test_window_cpu_takes_the_samples_inside_the_window():
    samples = [(0.0, {"ray": 0.0}), (1.0, {"ray": 1.0}), (2.0, {"ray": 3.0}), (3.0, {"ray": 6.0})]
    assert capacity.window_cpu(samples, 0.5, 2.5) == ({"ray": 2.0}, 1.0, 2.0)
    assert capacity.window_cpu(samples, 2.5, 2.9) == ({}, 2.5, 2.5)


def test_the_summary_keeps_first_turns_apart_and_counts_served_loops():
    records = [
        record(0, "first", 10.0, 1100.0),  # released at 10, answered at 11.1: the storm ends
        record(1, "first", 10.0, 600.0),
        record(0, "steady", 11.5, 110.0),
        record(1, "steady", 12.0, 120.0),
        record(0, "rollout_first", 13.0, 300.0),
    ]
    samples = [
        (float(t), {"gateway": t * 0.01, "session_host": t * 0.1, "inference": 0.0, "ray": 0.0})
        for t in range(10, 16)
    ]
    s = capacity.summarise(2, records, {}, samples, {"ray": 1.0}, release_at=10.0, end_at=15.0)
    assert s["first_turns_ms"]["completed"] == 2 and s["first_turns_ms"]["p50"] == 750.0
    assert s["steady_ms"]["turns"] == 2 and s["steady_ms"]["p50"] == 15.0
    assert s["rollout_first_ms"]["turns"] == 1
    assert s["every_loop_served"] and s["loops_served"] == 2
    assert s["turns_per_s"] == round(3 / (15.0 - 11.1), 2)
    assert s["cpu_window"] == {"s": 3.0, "turns": 2}  # the samples at 12 and 15; answered at 12.12, 13.3
    assert s["cpu_ms_per_turn"]["session_host"] == 150.0 and s["cpu_ms_per_turn"]["api_tier"] == 165.0
    assert s["cpu_ms_per_turn"]["ray_background"] == 1.5  # 1 ms/s over 3 s, across 2 turns


def test_a_loop_with_an_error_is_not_served():
    records = [record(0, "first", 0.0, 10.0), record(1, "first", 0.0, 10.0, ok=False)]
    s = capacity.summarise(2, records, {1: ["boom"]}, [], {}, release_at=0.0, end_at=5.0)
    assert not s["every_loop_served"] and s["loops_with_errors"] == 1 and "cpu_ms_per_turn" not in s


def test_the_tail_says_which_server_phase_the_slowest_turns_spent_their_time_in():
    fast = {"render": 1.0, "api_overhead": 5.0, "queue": 0.0, "prefill": 50.0, "decode": 50.0}
    slow = {"render": 400.0, "api_overhead": 420.0, "queue": 0.0, "prefill": 50.0, "decode": 50.0}
    records = [{**record(i, "steady", 0.0, 110.0), "server": fast} for i in range(99)] + [
        {**record(99, "steady", 0.0, 530.0), "server": slow}
    ]
    t = capacity.tail(records, "steady")
    assert t["turns"] == 1 and 10.0 < t["from_ms"] <= 430.0
    assert t["render"] == 400.0 and t["api_overhead"] == 420.0 and t["outside"] == 10.0


def test_the_clients_loop_lag_is_summarised_by_percentile():
    assert capacity.lag([0.1] * 999 + [50.0]) == {"ticks": 1000, "p50": 0.1, "p99": 0.1, "max": 50.0}


def test_run_queue_waits_are_reported_per_turn_apart_from_the_cpu():
    records = [
        record(0, "first", 10.0, 100.0),
        record(0, "steady", 11.0, 200.0),
        record(0, "steady", 12.0, 200.0),
    ]
    samples = [
        (
            float(t),
            {
                "gateway": 0.0,
                "session_host": t * 0.1,
                "inference": 0.0,
                "ray": 0.0,
                "wait:session_host": t * 0.01,
            },
        )
        for t in range(10, 16)
    ]
    s = capacity.summarise(1, records, {}, samples, {}, release_at=10.0, end_at=15.0)
    assert s["cpu_window"] == {"s": 4.0, "turns": 2}
    assert s["runqueue_wait_ms_per_turn"]["session_host"] == 20.0  # 40 ms over 2 turns
    assert s["cpu_ms_per_turn"]["all"] == 200.0 and "wait:session_host" not in s["cpu_ms_per_turn"]
