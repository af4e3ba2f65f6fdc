"""Held gauges: a value set on change alone is set again by each refresh, so Ray's metrics
agent keeps exporting it while it holds (it drops a gauge series not set again within two
export intervals).  The phase histogram: every response's ``api_overhead``, the other phases
of one response in N."""

from __future__ import annotations

from actors.host.host_metrics import HeldGauge, PhaseMetrics, refresh_s


class Recorded:
    """A gauge that keeps what was set on it."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


def test_a_held_gauge_sets_its_first_value_at_once_and_its_last_value_at_each_refresh():
    gauge = Recorded()
    held = HeldGauge(gauge, 0)
    assert gauge.values == [0]
    held.refresh()
    held.set(3)
    held.refresh()
    held.refresh()
    assert gauge.values == [0, 0, 3, 3, 3]
    assert held.value == 3


def test_held_gauges_are_set_again_twice_each_of_rays_export_intervals():
    assert refresh_s({}) == 5.0  # Ray's default: every 10 s
    assert refresh_s({"RAY_metrics_report_interval_ms": "2000"}) == 1.0
    assert refresh_s({"RAY_metrics_report_interval_ms": "500"}) == 0.5  # Ray exports once a second at most


class Histogram:
    """A histogram that keeps what was observed on it: (phase, seconds)."""

    def __init__(self) -> None:
        self.values: list[tuple[str, float]] = []

    def observe(self, value: float, tags: dict[str, str]) -> None:
        assert tags["transport"] == "ws"
        self.values.append((tags["phase"], value))


REPORT = {"parse_validate": 0.2, "render": 0.15, "backend": 2.0, "api_overhead": 4.0, "loop_lag": 0.0}


def test_every_response_has_its_api_overhead_observed_and_one_in_n_its_other_phases():
    hist = Histogram()
    phases = PhaseMetrics(every=3, histogram=hist)
    for _ in range(7):
        phases.observe("ws", REPORT)
    observed = [phase for phase, _ in hist.values]
    assert observed.count("api_overhead") == 7
    assert all(observed.count(phase) == 3 for phase in REPORT if phase != "api_overhead")  # responses 1, 4, 7
    assert hist.values[: len(REPORT)] == [
        (phase, ms / 1000) for phase, ms in REPORT.items()
    ]  # the first in full


def test_every_1_observes_every_phase_of_every_response():
    hist = Histogram()
    phases = PhaseMetrics(every=1, histogram=hist)
    for _ in range(4):
        phases.observe("ws", REPORT)
    assert len(hist.values) == 4 * len(REPORT)
