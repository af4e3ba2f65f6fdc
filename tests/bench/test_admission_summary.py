"""bench admission: where in a ramp the slow connects were."""

from __future__ import annotations

from bench.kinds import admission


def test_per_second_bins_connects_by_when_they_started():
    started = [10.0, 10.4, 11.2, 12.9]
    took = [0.002, 0.004, 0.5, 0.003]
    assert admission.per_second(started, took) == [[0, 2, 3.0, 4.0], [1, 1, 500.0, 500.0], [2, 1, 3.0, 3.0]]
    assert admission.per_second([], []) == []


def test_a_failed_turn_is_counted_by_who_closed_the_socket_and_why():
    from websockets.exceptions import ConnectionClosedError
    from websockets.frames import Close

    by_server = ConnectionClosedError(Close(1011, "session ended by a server fault"), None)
    assert admission.failure_kind(by_server) == "closed by server: 1011 session ended by a server fault"
    by_client = ConnectionClosedError(None, Close(1011, "keepalive ping timeout"))
    assert admission.failure_kind(by_client) == "closed by client: 1011 keepalive ping timeout"
    assert admission.failure_kind(ConnectionClosedError(None, None)) == "closed without a close frame"
    assert admission.failure_kind(TimeoutError()) == "TimeoutError"


def test_the_turns_of_several_client_processes_merge_into_one_result():
    a = {"turns_completed": 2, "turns_wanted": 2, "failures": {}, "wall_s": 1.0, "all_ms": [1.0, 3.0]}
    b = {"turns_completed": 1, "turns_wanted": 2, "failures": {"x": 1}, "wall_s": 2.0, "all_ms": [2.0, 9.0]}
    m = admission.merge_turns([a, b])
    assert (m["turns_completed"], m["turns_wanted"], m["failures"], m["wall_s"]) == (3, 4, {"x": 1}, 2.0)
    assert m["turn_ms"]["p50"] == 2.5 and m["turns_per_s"] == 1.5
