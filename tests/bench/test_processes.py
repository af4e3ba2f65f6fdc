"""bench.processes: a server process's role from its command line, CPU deltas by role."""

from __future__ import annotations

import os
import subprocess
import sys

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
    now: dict[int, tuple[float, float]] = {}
    times = iter([10.0, 11.0, 12.0, 13.0])
    sampler = processes.CpuSampler(
        {1: "host", 2: "host", 3: "replica"}, 1.0, read=now.get, clock=lambda: next(times)
    )
    for host1, host2, replica in ((0.5, 0.5, 0.0), (1.0, 0.5, 0.25), (1.0, 1.0, 1.0), (5.0, 4.0, 9.0)):
        now.update({1: (host1, 0.0), 2: (host2, 0.0), 3: (replica, 0.0)})
        sampler.sample()
    assert sampler.cores(10.0, 12.0) == {"host": 0.5, "replica": 0.5}
    assert sampler.cores(10.5, 12.5) == {"host": 0.5, "replica": 0.75}
    assert sampler.cores(11.5, 12.5) == {"host": 0.0, "replica": 0.0}  # one sample: no window


def test_a_process_gone_counts_nothing_from_then_on():
    now = {1: (2.0, 0.5), 2: (1.0, 0.25)}
    sampler = processes.CpuSampler({1: "host", 2: "replica"}, 1.0, waits=True, read=now.get)
    sampler.sample()
    del now[2]
    sampler.sample()
    first, second = (s for _, s in sampler.samples)
    assert (first["host"], first["replica"], first["wait:replica"]) == (2.0, 1.0, 0.25)
    assert (second["host"], second["replica"], second["wait:replica"]) == (2.0, 0.0, 0.0)


def _child(*argv: str) -> subprocess.Popen[bytes]:
    """A process below this one, ``argv`` on its command line, once it runs (it said so on
    its stdout); it ends when its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(flush=True); sys.stdin.read()", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"\n"
    return child


def test_following_counts_a_process_started_below_the_known_ones_under_its_role():
    sampler = processes.CpuSampler({os.getpid(): "gateway"}, 1.0, follow=True)
    sampler.sample()
    child = _child("ray::SessionHost")
    try:
        sampler.sample()
        assert sampler.procs[child.pid] == "session_host"
        assert sampler.samples[0][1]["session_host"] == 0
        assert sampler.samples[1][1]["session_host"] > 0  # its start-up's CPU
    finally:
        child.communicate(b"")


def test_without_following_a_process_started_below_is_not_counted():
    sampler = processes.CpuSampler({os.getpid(): "gateway"}, 1.0)
    child = _child("ray::SessionHost")
    try:
        sampler.sample()
        assert child.pid not in sampler.procs and sampler.samples[0][1]["session_host"] == 0
    finally:
        child.communicate(b"")


def test_a_process_whose_command_line_names_another_role_now_is_listed_with_it():
    child = _child("ray::SessionHost")
    try:
        changed = processes.role_changes({child.pid: "ray", os.getpid(): "ray"})
        assert changed == {child.pid: "session_host"}  # this process's names no other role
    finally:
        child.communicate(b"")
