"""The one way the lab and the tests start Redis and a Ray node (bench/services.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import services


def test_a_ray_node_is_a_head_on_a_port_or_a_worker_of_an_address():
    head = services.ray_start_command(temp_dir=Path("/tmp/t"), num_cpus=0, head_port=6379)
    assert head[1:4] == ["start", "--block", "--head"] and "--port=6379" in head
    assert "--include-dashboard=false" in head and "--num-cpus=0" in head and "--temp-dir=/tmp/t" in head
    worker = services.ray_start_command(
        temp_dir=Path("/tmp/t"), num_cpus=1, address="10.0.0.1:6379", extra=["-x"]
    )
    assert "--head" not in worker and "--address=10.0.0.1:6379" in worker and worker[-1] == "-x"
    with_jobs = services.ray_start_command(
        temp_dir=Path("/tmp/t"), num_cpus=0, head_port=6379, dashboard=("10.0.0.1", 8265)
    )
    assert "--include-dashboard=true" in with_jobs and "--include-dashboard=false" not in with_jobs
    assert "--dashboard-host=10.0.0.1" in with_jobs and "--dashboard-port=8265" in with_jobs
    for wrong in ({}, {"head_port": 1, "address": "a:1"}, {"address": "a:1", "dashboard": ("h", 1)}):
        with pytest.raises(ValueError):
            services.ray_start_command(temp_dir=Path("/tmp/t"), num_cpus=1, **wrong)


def test_ray_started_reads_the_log(tmp_path):
    log = tmp_path / "ray.log"
    assert not services.ray_started(log)
    log.write_text("Local node IP: 127.0.0.1\n")
    assert not services.ray_started(log)
    log.write_text(f"...\n{services.RAY_STARTED}.\n")
    assert services.ray_started(log)


def test_a_redis_server_keeps_nothing_on_disk():
    """(Started and waited on by every test of a real Redis: tests/support/redis.py.)"""
    cmd = services.redis_server_command("redis-server", 7000, extra=["--protected-mode", "no"])
    assert cmd[cmd.index("--save") + 1] == "" and cmd[cmd.index("--appendonly") + 1] == "no"
    assert cmd[cmd.index("--port") + 1] == "7000" and cmd[-2:] == ["--protected-mode", "no"]
