"""A Ray cluster of a test's own, started with ``ray start --head`` as an operator would
(token authentication, Serve's throughput mode), on free ports and in a private temp dir
(so no other ``ray.init()`` on this machine finds and joins it).

Every process of the cluster carries a marker in its environment; :meth:`LocalCluster.stop`
ends exactly those processes, by pid (SIGTERM, then SIGKILL to any left)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.services import ray_start_command, ray_started, wait_ray_started
from serve.embedded import RAY_ENV, free_port

MARKER = "RESPONSES_WS_TEST_CLUSTER"


def marked_pids(marker: str) -> list[int]:
    """Pids of the processes whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def is_gcs(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "gcs_server"
    except OSError:
        return False


class LocalCluster:
    def __init__(self) -> None:
        self.marker = secrets.token_hex(8)
        self.port = free_port()
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rws-ray-", dir="/tmp"))  # short: socket paths
        self.address = f"127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_ENV)
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), MARKER: self.marker})
        self.env = env
        self.log = self.temp_dir / "ray-start.log"
        self.metrics_port = free_port()  # Ray's metrics export port (Prometheus text)
        self.dashboard_url = f"http://127.0.0.1:{free_port()}"  # Ray's dashboard (`serve status`'s)
        ports = [f"--metrics-export-port={self.metrics_port}"] + [
            f"--{name}-port={free_port()}"
            for name in (
                "node-manager",
                "object-manager",
                "ray-client-server",
                "dashboard-agent-listen",
                "dashboard-agent-grpc",
                "runtime-env-agent",
            )
        ]
        with open(self.log, "w") as out:
            self._proc = subprocess.Popen(
                ray_start_command(
                    temp_dir=self.temp_dir,
                    num_cpus=2,
                    head_port=self.port,
                    extra=ports,
                    dashboard_port=int(self.dashboard_url.rsplit(":", 1)[1]),
                ),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def run(self, code: str, timeout_s: float = 180) -> str:
        """Run ``code`` as a driver of this cluster (``ADDRESS`` is defined); its stdout."""
        result = subprocess.run(
            [sys.executable, "-c", f"ADDRESS = {self.address!r}\n{code}"],
            env=self.env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert result.returncode == 0, f"driver failed:\n{result.stderr[-4000:]}"
        return result.stdout

    @contextmanager
    def driver(self) -> Iterator[Driver]:
        """A driver of this cluster that stays connected: :meth:`Driver.run` runs code in it
        without a new process's start (importing Ray and joining take seconds)."""
        driver = Driver(self)
        try:
            yield driver
        finally:
            driver.close()

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def ray_up(self) -> bool:
        """The head node runs, or ``ray start`` has exited (tests/support/children.py)."""
        return self.exited() or ray_started(self.log)

    def wait_up(self, timeout_s: float = 120) -> None:
        wait_ray_started(self._proc, self.log, time.monotonic() + timeout_s, "the test's head node")

    def stop(self) -> None:
        # SIGTERM first, but not to the GCS: ``ray start`` stops it once the rest has gone
        # (~3 s here).  A GCS sent SIGTERM beside the rest kept itself and ``ray start``
        # running until the SIGKILL 10 s later (measured), and ``ray start`` alone sent
        # SIGTERM stopped nothing in 20 s once Serve ran on the cluster.
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            pids = [pid for pid in marked_pids(self.marker) if sig == signal.SIGKILL or not is_gcs(pid)]
            if self._proc.poll() is None:
                pids.append(self._proc.pid)
            for pid in set(pids):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and (marked_pids(self.marker) or self._proc.poll() is None):
                time.sleep(0.2)
        self._proc.wait(timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class Driver:
    """A Python process that runs each block of code sent to it in one namespace
    (``ADDRESS`` is defined), and says when it is done with it."""

    DONE, FAILED = "--driver: done--", "--driver: failed--"
    LOOP = """
import json, sys, traceback
namespace = {"ADDRESS": ADDRESS}
for line in sys.stdin:
    try:
        exec(json.loads(line), namespace)
        print(DONE, flush=True)
    except Exception:
        traceback.print_exc()
        print(FAILED, flush=True)
"""

    def __init__(self, cluster: LocalCluster) -> None:
        self.log = cluster.temp_dir / f"driver-{secrets.token_hex(4)}.log"
        code = f"ADDRESS, DONE, FAILED = {cluster.address!r}, {self.DONE!r}, {self.FAILED!r}\n{self.LOOP}"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                env=cluster.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def run(self, code: str, timeout_s: float = 180) -> str:
        """Run ``code``; what it printed."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        watchdog = threading.Timer(timeout_s, self.proc.kill)
        watchdog.start()
        lines, status = [], None
        try:
            for line in self.proc.stdout:
                if line.rstrip("\n") in (self.DONE, self.FAILED):
                    status = line.rstrip("\n")
                    break
                lines.append(line)
        finally:
            watchdog.cancel()
        assert status == self.DONE, f"driver failed:\n{self.log.read_text()[-4000:]}"
        return "".join(lines)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
