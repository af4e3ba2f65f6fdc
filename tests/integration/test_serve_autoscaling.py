"""Serve's custom-metrics autoscaling through the project's wrapper (inference/serve_autoscaling.py)
on real Serve: replicas report a load through ``record_autoscaling_stats``, the policy scales the
deployment to bring it to its target per replica, and back when the load goes."""

from __future__ import annotations

import time
from pathlib import Path

from ray import serve

from inference.emulator.profiles import AutoscalingConfig as Bounds
from inference.serve_autoscaling import CONNECTIONS, ReportsLoad, autoscaling_config
from tests.support.server import stop_app

APP = "rws-autoscale-probe"


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Probe(ReportsLoad):
    """Each replica reports the number in a file as its connections."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, float]:
        return {CONNECTIONS: float(self.path.read_text() or 0)}

    async def __call__(self) -> str:
        return "ok"


def running(app: str) -> int:
    status = serve.status().applications[app].deployments["Probe"]
    return status.replica_states.get("RUNNING", 0)


def wait_for(predicate, timeout_s: float, what: str) -> float:
    """Seconds until ``predicate()`` holds (Serve's controller decides every few tenths)."""
    from tests.support.waiting import wait_until

    start = time.monotonic()
    wait_until(predicate, timeout_s, what, every_s=0.25)
    return time.monotonic() - start


def test_replicas_follow_the_load_they_report(ray_cluster, tmp_path):
    load = tmp_path / "load"
    load.write_text("1")
    config = autoscaling_config(
        metric=CONNECTIONS,
        target_per_replica=2,
        bounds=Bounds(
            min_replicas=1,
            max_replicas=3,
            upscale_delay_s=0,
            downscale_delay_s=0,
            metrics_interval_s=0.5,
            look_back_period_s=1,
        ),
    )
    serve.run(Probe.options(autoscaling_config=config).bind(str(load)), name=APP, route_prefix=None)
    try:
        assert running(APP) == 1
        load.write_text("5")  # 5 over a target of 2 a replica: 3 replicas (then 15: capped at 3)
        up = wait_for(lambda: running(APP) == 3, 60, "no scale-up to 3 replicas on a reported load of 5")
        load.write_text("0")
        down = wait_for(lambda: running(APP) == 1, 60, "no scale-down to min_replicas when the load went")
        print(f"1 -> 3 replicas in {up:.1f}s, back to 1 in {down:.1f}s")
    finally:
        stop_app(APP)  # nothing after this test needs it gone: no wait for its replicas
