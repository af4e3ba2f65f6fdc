"""The wrapper of Serve's custom autoscaling metrics and policies (inference/serve_autoscaling.py):
pinned to the Ray series it was read against, its policy's arithmetic, and the config it builds
as Serve itself parses it.  tests/integration/test_serve_autoscaling.py runs it on real Serve."""

from __future__ import annotations

import asyncio

import pytest
import ray
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from inference.emulator.profiles import AutoscalingConfig as Bounds
from inference.serve_autoscaling import (
    CONNECTIONS,
    PINNED_RAY,
    SEQUENCES,
    LoadPolicy,
    RayVersionError,
    ReportsLoad,
    autoscaling_config,
    check_ray_version,
    desired_replicas,
)


def test_the_installed_ray_is_the_pinned_series():
    """Fails when Ray moves: read Serve's custom-metrics code again (replica.py's
    record_autoscaling_stats, autoscaling_state.py's aggregated_metrics), then move the pin."""
    assert ray.__version__.startswith(PINNED_RAY), ray.__version__
    check_ray_version()


def test_another_ray_is_refused_in_one_line():
    with pytest.raises(RayVersionError, match=r"wrapped for Ray 2\.60\.x .* Ray 2\.61\.0 is installed"):
        check_ray_version("2.61.0")


@pytest.mark.parametrize(
    ("values", "target", "current", "want"),
    [
        ({}, 10, 3, 3),  # no report yet: the count stands
        ({"a": 0.0}, 10, 1, 0),  # Serve's min_replicas bounds it
        ({"a": 10.0}, 10, 1, 1),
        ({"a": 10.5}, 10, 1, 2),
        ({"a": 7.0, "b": 8.0}, 5, 2, 3),
        ({"a": 3.0, "b": 0.0, "c": 0.0}, 4, 3, 1),
        ({"a": -2.0, "b": 4.0}, 4, 2, 1),  # a negative report counts as none
    ],
)
def test_desired_replicas_brings_the_load_to_its_target_each(values, target, current, want):
    assert desired_replicas(values, target, current) == want


def context(metrics: dict[str, dict[str, float]], current: int) -> AutoscalingContext:
    return AutoscalingContext(
        deployment_id=None,  # type: ignore[arg-type]  # the policy reads metrics and counts only
        deployment_name="Gateway",
        app_name="responses-ws",
        current_num_replicas=current,
        target_num_replicas=current,
        running_replicas=[],
        total_num_requests=0.0,
        total_queued_requests=0.0,
        aggregated_metrics=lambda: metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=10,
        policy_state={"kept": 1},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=0.0,
        config=None,
    )


def test_the_policy_reads_its_metric_and_keeps_serves_state():
    policy = LoadPolicy(metric=CONNECTIONS, target_per_replica=2)
    want, state = policy(context({CONNECTIONS: {"r1": 3.0, "r2": 2.0}, SEQUENCES: {"r1": 100.0}}, 2))
    assert want == 3
    assert state == {"kept": 1, "metric": CONNECTIONS, "total": 5.0, "desired": 3}
    assert policy(context({SEQUENCES: {"r1": 100.0}}, 2))[0] == 2  # its metric not reported yet


def test_a_target_must_be_positive():
    with pytest.raises(ValueError, match="target_per_replica"):
        LoadPolicy(metric=CONNECTIONS, target_per_replica=0)


def test_the_config_is_one_serve_parses_into_this_policy():
    cfg = autoscaling_config(
        metric=SEQUENCES,
        target_per_replica=32,
        bounds=Bounds(
            min_replicas=1,
            max_replicas=4,
            upscale_delay_s=2,
            downscale_delay_s=30,
            metrics_interval_s=1,
            look_back_period_s=5,
        ),
    )
    parsed = AutoscalingConfig(**cfg)
    assert (parsed.min_replicas, parsed.max_replicas, parsed.metrics_interval_s) == (1, 4, 1)
    assert parsed.policy.policy_function == "inference.serve_autoscaling:LoadPolicy"
    cls = parsed.policy.get_policy()
    policy = cls(**parsed.policy.policy_kwargs)
    assert (policy.metric, policy.target) == (SEQUENCES, 32.0)


class Node(ReportsLoad):
    def __init__(self, n: int) -> None:
        self.n = n

    def load(self) -> dict[str, float]:
        return {CONNECTIONS: self.n}


def test_a_replica_reports_its_load_as_numbers():
    assert asyncio.run(Node(7).record_autoscaling_stats()) == {CONNECTIONS: 7.0}
