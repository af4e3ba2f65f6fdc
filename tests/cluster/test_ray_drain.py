"""serve/ray_drain.py on a real Ray: a head and a worker node, the worker drained with a
deadline; the wrapper reports it draining, with that deadline, to the driver and to an
actor on the drained node (as a gateway replica there polls it).  The cluster runs in a
child process (tests/support/ray_drain_probe.py); its process group is killed if it
overruns."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from serve import ray_drain

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 40.0


def run_probe(module: str = "tests.support.ray_drain_probe", *args: str) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:  # what the probe's Ray left in its group (it exits without stopping it)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_drained_worker_is_reported_draining_with_its_deadline_to_the_driver_and_on_the_node():
    result = run_probe("tests.support.ray_drain_probe", str(DEADLINE_S))
    print(f"\nray_drain probe: {json.dumps(result, indent=1)}")
    worker = result["worker"]
    assert result["before"] == {
        "node_id": worker,
        "deadline": None,
        "draining": False,
        "replica_stopping": False,
    }
    assert result["draining_before"] == []
    # An idle-termination drain of a busy node is refused, and said so.
    assert result["idle_termination_rejected"] is not None and worker in result["idle_termination_rejected"]
    # The drain with a deadline: only the worker, with the deadline asked for (Ray keeps
    # milliseconds; the request left within a second of the probe's clock reading).
    assert list(result["draining_after"]) == [worker]
    assert abs(result["draining_after"][worker] - result["requested_deadline"]) < 1.0
    after = result["after"]
    assert after["node_id"] == worker and after["draining"] is True
    assert after["deadline"] == result["draining_after"][worker]
    assert after["replica_stopping"] is False  # an actor, not a Serve replica


def test_another_ray_series_is_refused_with_what_to_recheck():
    ray_drain.check_ray_version(ray_drain.RAY_SERIES + "0")
    with pytest.raises(ray_drain.UnsupportedRay, match="re-check"):
        ray_drain.check_ray_version("2.61.0")


def test_a_redeploy_drains_the_old_gateway_at_once_with_serves_draining_period_at_its_default():
    """Without ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` (Ray's default: Serve calls a
    stopping ingress replica's destructor 30 s after it began to stop it) the old gateway's
    socket still closes 1012 within seconds of the new replica being ready: the drain watch
    saw Serve's stop."""
    result = run_probe("tests.support.serve_stop_probe")
    print(f"\nserve stop probe: {result}")
    assert result["env"] is None  # Ray's default was in force
    assert result["close_code"] == 1012
    assert result["closed_after_new_replica_ready_s"] < 10.0  # not the 30 s draining period
