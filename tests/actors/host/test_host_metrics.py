"""Held gauges: a value set on change alone is set again by each refresh, so Ray's metrics
agent keeps exporting it while it holds (it drops a gauge series not set again within two
export intervals)."""

from __future__ import annotations

from actors.host.host_metrics import HeldGauge, refresh_s


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
