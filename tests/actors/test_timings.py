"""PhaseTimer: api_overhead is the response's time on the server less the model's own time."""

from __future__ import annotations

import json

from actors.core.timings import METADATA_KEY, PhaseTimer, Report


def test_the_model_calls_own_cost_counts_as_overhead_not_as_the_model():
    now = [0.0]
    timer = PhaseTimer(lambda: now[0])
    with timer.phase("render"):
        now[0] += 0.002
    timer.wait_inference()
    now[0] += 0.013  # 10 ms of emulated model time, 3 ms getting there and back
    timer.inference_done()
    now[0] += 0.001  # building the terminal event
    report = timer.report(queue_ms=1.0, prefill_ms=4.0, decode_ms=5.0)
    assert report["api_overhead"] == 6.0  # 16 ms on the server - 10 ms of model
    assert report["backend"] == 3.0 and report["render"] == 2.0
    assert report["other"] == 1.0


def test_a_model_faster_than_its_reported_time_leaves_no_negative_backend():
    now = [0.0]
    timer = PhaseTimer(lambda: now[0])
    timer.wait_inference()
    now[0] += 0.008
    timer.inference_done()
    report = timer.report(queue_ms=0.0, prefill_ms=5.0, decode_ms=5.0)
    assert report["backend"] == 0.0 and report["api_overhead"] == 0.0 and report["other"] == 0.0


def test_a_timer_started_when_the_frame_arrived_counts_the_time_before_it_was_read():
    now = [10.0]
    timer = PhaseTimer(lambda: now[0], started=9.998)  # its first bytes came 2 ms ago
    now[0] += 0.005
    assert timer.report(queue_ms=0.0, prefill_ms=1.0, decode_ms=2.0)["api_overhead"] == 4.0


def test_a_report_is_taken_again_as_its_terminal_event_is_encoded_unless_final():
    now = [0.0]
    timer = PhaseTimer(lambda: now[0])
    now[0] += 0.010
    metadata: dict[str, str] = {}
    report = Report.at_finish("resp_1", timer, (1.0, 2.0, 3.0), final=False)
    report.into = metadata
    assert report.ms["api_overhead"] == 4.0
    now[0] += 0.002  # the terminal event is built, queued, and the frames before it written
    assert report.restamp()["api_overhead"] == 6.0
    assert json.loads(metadata[METADATA_KEY])["api_overhead"] == 6.0
    now[0] += 0.002
    assert report.restamp()["api_overhead"] == 6.0, "taken once: the frame carries one set of figures"

    stored = Report.at_finish("resp_2", PhaseTimer(lambda: now[0]), (0.0, 0.0, 0.0), final=True)
    now[0] += 0.003
    assert stored.restamp()["api_overhead"] == 0.0, "a stored response keeps what its record holds"


def test_the_time_a_request_waited_behind_its_lane_is_not_overhead_the_time_before_is():
    now = [0.0]
    timer = PhaseTimer(lambda: now[0], started=-0.001)  # its frame arrived 1 ms before it was read
    now[0] += 0.002  # parsed and admitted
    timer.queued()
    now[0] += 0.050  # behind the lane's running response
    timer.restart()
    now[0] += 0.001
    assert timer.report(queue_ms=0.0, prefill_ms=0.0, decode_ms=0.0)["api_overhead"] == 4.0


def test_a_finished_responses_figures_taken_again_equal_a_whole_report_taken_then():
    now = [0.0]
    lags = [0.0]
    timer = PhaseTimer(lambda: now[0], lag=lambda since: lags[0])
    with timer.phase("parse_validate"):
        now[0] += 0.0004
    with timer.phase("render"):
        now[0] += 0.0011
    timer.wait_inference()
    now[0] += 0.0123
    timer.inference_done()
    with timer.phase("post"):
        now[0] += 0.0002
    first = timer.report(queue_ms=0.5, prefill_ms=8.0, decode_ms=2.0)
    now[0] += 0.0017  # the terminal event built and queued, the frames before it written
    lags[0] = 0.003
    again = timer.again(first)
    assert again == timer.report(queue_ms=0.5, prefill_ms=8.0, decode_ms=2.0)
    assert again["api_overhead"] > first["api_overhead"] and again["loop_lag"] == 3.0
    assert first["loop_lag"] == 0.0, "the report taken at the finish is not changed"
