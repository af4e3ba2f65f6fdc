"""Serve's custom-metrics autoscaling (Ray 2.60).

Serve counts the requests that pass through its handles and proxies; neither tier's load does:
WebSocket connections reach the gateway's own listener, and a connection's model calls after
its first go over the direct channel to its pinned inference replica.  So each replica reports
its own load, and a policy turns the reports into a replica count:

- a deployment class defines ``record_autoscaling_stats`` (Serve calls it every
  ``metrics_interval_s``, on the replica) returning ``{metric name: number}`` — here through
  :class:`ReportsLoad`, whose subclasses say what their load is (:meth:`ReportsLoad.load`);
- ``autoscaling_config.policy`` names :class:`LoadPolicy` (``policy_function``, with
  ``policy_kwargs``: which metric and its target per replica); Serve runs it in its controller
  with the metrics each running replica reported, averaged over ``look_back_period_s``
  (``AutoscalingContext.aggregated_metrics``), and applies the delays, the bounds and the
  scaling factors of the config around it.

The pure core is :func:`desired_replicas`.  Serve's custom metrics are new in the 2.5x
series (``record_autoscaling_stats`` is looked up by name, the context's fields are
documented but young): :func:`check_ray_version` refuses another Ray than :data:`PINNED_RAY`,
and tests/inference/test_serve_autoscaling.py fails when the installed Ray moves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import ray
from ray.serve.config import AutoscalingContext

PINNED_RAY = "2.60."  # the series whose Serve this module was read against

# The metrics the replicas report (names are Serve's keys in ``aggregated_metrics``).
CONNECTIONS = "responses_ws_connections"  # a gateway: open WebSockets + HTTP requests in flight
HTTP_IN_FLIGHT = "responses_ws_http_in_flight"  # a gateway: HTTP-mode responses in flight
SEQUENCES = "responses_ws_sequences"  # an inference replica: running + waiting sequences


class RayVersionError(RuntimeError):
    pass


def check_ray_version(version: str | None = None) -> None:
    """Refuse a Ray whose Serve this module was not read against (one clear line)."""
    version = ray.__version__ if version is None else version
    if not version.startswith(PINNED_RAY):
        raise RayVersionError(
            f"Serve's custom autoscaling metrics are wrapped for Ray {PINNED_RAY}x "
            f"(inference/serve_autoscaling.py); Ray {version} is installed"
        )


def desired_replicas(values: Mapping[Any, float], target_per_replica: float, current: int) -> int:
    """The replicas that bring the reported load to ``target_per_replica`` each: the sum of
    every running replica's value over the target, rounded up.  With no report yet (replicas
    just started), the current count stands.  Serve applies the bounds and delays after."""
    if not values:
        return current
    total = sum(max(0.0, float(v)) for v in values.values())
    return math.ceil(total / target_per_replica - 1e-9)


class LoadPolicy:
    """Serve's policy (``policy_function`` names this class, ``policy_kwargs`` its
    arguments): scale ``metric`` to ``target_per_replica`` per replica.  The returned state
    says what it saw (Serve keeps it between decisions and logs it)."""

    def __init__(self, metric: str, target_per_replica: float) -> None:
        if target_per_replica <= 0:
            raise ValueError(f"target_per_replica must be > 0, not {target_per_replica}")
        self.metric = metric
        self.target = float(target_per_replica)

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        values = (ctx.aggregated_metrics or {}).get(self.metric, {})
        want = desired_replicas(values, self.target, ctx.current_num_replicas)
        total = sum(values.values()) if values else None
        state = dict(ctx.policy_state)
        state.update({"metric": self.metric, "total": total, "desired": want})
        return want, state


class Bounds(Protocol):
    """A tier's autoscaling settings (the gateway's and the inference tier's config models)."""

    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def upscale_delay_s(self) -> float: ...
    @property
    def downscale_delay_s(self) -> float: ...
    @property
    def metrics_interval_s(self) -> float: ...
    @property
    def look_back_period_s(self) -> float: ...


def autoscaling_config(*, metric: str, target_per_replica: float, bounds: Bounds) -> dict[str, Any]:
    """A deployment's ``autoscaling_config`` that scales on ``metric`` with :class:`LoadPolicy`,
    within ``bounds``."""
    check_ray_version()
    return {
        "min_replicas": bounds.min_replicas,
        "max_replicas": bounds.max_replicas,
        "upscale_delay_s": bounds.upscale_delay_s,
        "downscale_delay_s": bounds.downscale_delay_s,
        "metrics_interval_s": bounds.metrics_interval_s,
        "look_back_period_s": bounds.look_back_period_s,
        "policy": {
            "policy_function": f"{__name__}:{LoadPolicy.__name__}",
            "policy_kwargs": {"metric": metric, "target_per_replica": float(target_per_replica)},
        },
    }


class ReportsLoad:
    """Mixed into a deployment class: Serve calls ``record_autoscaling_stats`` on the replica
    every ``metrics_interval_s`` (only when the deployment autoscales); the class says what its
    load is in :meth:`load`."""

    def load(self) -> dict[str, float]:
        raise NotImplementedError

    async def record_autoscaling_stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.load().items()}


__all__ = [
    "CONNECTIONS",
    "HTTP_IN_FLIGHT",
    "PINNED_RAY",
    "SEQUENCES",
    "LoadPolicy",
    "RayVersionError",
    "ReportsLoad",
    "autoscaling_config",
    "check_ray_version",
    "desired_replicas",
]
