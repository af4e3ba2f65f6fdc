"""PhaseTimer: api_overhead is the response's time on the server less the model's own time."""

from __future__ import annotations

from actors.timings import PhaseTimer


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
