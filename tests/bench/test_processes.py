"""bench.processes: a server process's role from its command line, CPU deltas by role."""

from __future__ import annotations

import os

from bench import processes


def test_roles_by_ray_process_title():
    assert processes.role_of("ray::ServeReplica:responses:Gateway") == "gateway"
    assert processes.role_of("ray::SessionHost.ready") == "session_host"
    assert processes.role_of("ray::ServeReplica:responses:InferenceDeployment") == "inference"
    for other in ("/x/ray/core/src/ray/raylet/raylet --flags", "ray::ServeController", "ray::IDLE"):
        assert processes.role_of(other) == "ray"


def test_role_delta_is_in_ms_per_role():
    before = {"gateway": 1.0, "ray": 2.0}
    after = {"gateway": 1.5, "ray": 2.25}
    assert processes.role_delta(after, before) == {"gateway": 500.0, "ray": 250.0}


def test_cpu_by_role_counts_every_role_and_a_live_process():
    out = processes.cpu_by_role({os.getpid(): "gateway"})
    assert set(out) == set(processes.ROLES) and out["gateway"] > 0 and out["ray"] == 0


def test_precise_cpu_counts_this_process_threads():
    import time

    before = processes.cpu_precise_s(os.getpid())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.02:
        pass
    assert processes.cpu_precise_s(os.getpid()) > before
