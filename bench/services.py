"""The services the lab and the tests start beside a server, one way each: a throw-away
``redis-server`` (non-persistent, in the foreground) and a ``ray start --block`` node.

The multi-node harness (:mod:`bench.multinode.harness`) runs them inside its network
namespaces; the tests (``tests/support/redis.py``, ``tests/support/ray_cluster.py``) on
127.0.0.1 and free ports.  Both build the command lines here and wait on them here.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REDIS_START_TIMEOUT_S = 10.0
RAY_STARTED = "Ray runtime started"  # what ``ray start`` prints once its node runs


def redis_server_command(
    binary: str, port: int, bind: str = "127.0.0.1", extra: Sequence[str] = ()
) -> list[str]:
    """A ``redis-server`` on ``bind:port`` keeping nothing on disk, in the foreground."""
    return [
        binary,
        "--port", str(port),
        "--bind", bind,
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        *extra,
    ]  # fmt: skip


def answers_ping(port: int, host: str = "127.0.0.1") -> bool:
    """The Redis server on ``host:port`` answers ``PING``."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait_redis(proc: subprocess.Popen[bytes], port: int, host: str = "127.0.0.1") -> bool:
    """Until the server ``proc`` started answers on ``host:port``; ``False`` if it exited or
    did not answer within :data:`REDIS_START_TIMEOUT_S`."""
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if answers_ping(port, host):
            return True
        time.sleep(0.05)
    return False


def ray_command() -> str:
    """The ``ray`` of this interpreter's environment."""
    return str(Path(sys.executable).parent / "ray")


def ray_start_command(
    *,
    temp_dir: Path,
    num_cpus: int,
    head_port: int | None = None,
    address: str | None = None,
    extra: Sequence[str] = (),
    dashboard_port: int | None = None,
) -> list[str]:
    """``ray start --block``: a head node whose GCS listens on ``head_port`` (no dashboard,
    unless ``dashboard_port``: then on 127.0.0.1 there), or a worker node joining the GCS at
    ``address``; exactly one of the two."""
    if (head_port is None) == (address is None):
        raise ValueError("a head port or a head's address, one of them")
    cmd = [ray_command(), "start", "--block"]
    dashboard = (
        ["--include-dashboard=false"]
        if dashboard_port is None
        else ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    )
    cmd += ["--head", f"--port={head_port}", *dashboard] if address is None else [f"--address={address}"]
    cmd += [f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}", "--disable-usage-stats", *extra]
    return cmd


def ray_started(log: Path) -> bool:
    """``ray start``'s output, written to ``log``, says its node runs."""
    return log.is_file() and RAY_STARTED in log.read_text(errors="replace")


def wait_ray_started(proc: subprocess.Popen[bytes], log: Path, deadline: float, name: str) -> None:
    """Until the ``ray start`` ``proc`` (its output in ``log``) says its node runs; raises
    if it exits first or ``deadline`` (``time.monotonic``) passes."""
    while not ray_started(log):
        if proc.poll() is not None:
            raise RuntimeError(f"ray start on {name} exited:\n{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"ray start on {name}: not up in time:\n{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.2)
