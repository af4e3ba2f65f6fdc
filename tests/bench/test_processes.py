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


def test_the_sampler_samples_its_groups_until_stopped_and_once_more():
    sampler = processes.CpuSampler({os.getpid(): "host"}, 0.01, waits=True)
    with sampler:
        deadline = 1e6
        while len(sampler.samples) < 2 and deadline:  # a bounded wait for the thread's samples
            deadline -= 1
            sum(range(1000))
    assert len(sampler.samples) >= 3  # the thread's, and one at the stop
    times = [t for t, _ in sampler.samples]
    assert times == sorted(times)
    last = sampler.samples[-1][1]
    assert last["host"] > 0 and "wait:host" in last and last["ray"] == 0


def test_the_sampler_reports_each_group_s_cores_between_two_times():
    sampler = processes.CpuSampler({1: "host", 2: "host", 3: "replica"}, 1.0)
    sampler.samples = [
        (10.0, {"host": 1.0, "replica": 0.0}),
        (11.0, {"host": 1.5, "replica": 0.25}),
        (12.0, {"host": 2.0, "replica": 1.0}),
        (13.0, {"host": 9.0, "replica": 9.0}),
    ]
    assert sampler.cores(10.0, 12.0) == {"host": 0.5, "replica": 0.5}
    assert sampler.cores(10.5, 12.5) == {"host": 0.5, "replica": 0.75}
    assert sampler.cores(11.5, 12.5) == {"host": 0.0, "replica": 0.0}  # one sample: no window
