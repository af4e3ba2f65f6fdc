"""``responses-ws status`` as an operator runs it (a process of its own, ``--json``), and a
password-protected redis-server of a test's own for it to judge (the store whose
credential the application has)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.services import redis_server_command
from serve.embedded import free_port
from tests.support.waiting import TimedOut, wait_until


@dataclass(frozen=True)
class StatusRun:
    code: int
    doc: dict[str, Any] | None  # its --json output
    stderr: str


def run_status(args: list[str], env: dict[str, str], timeout_s: float = 60) -> StatusRun:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "responses-ws"), "status", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    doc = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
    return StatusRun(done.returncode, doc, done.stderr)


def poll_status(args: list[str], env: dict[str, str], until: Any, timeout_s: float, what: str) -> StatusRun:
    """Run it until ``until(run)`` holds; AssertionError with the last run after ``timeout_s``."""
    runs: list[StatusRun] = []

    def looked() -> StatusRun | None:
        runs.append(run_status(args, env))
        return runs[-1] if until(runs[-1]) else None

    try:
        return wait_until(looked, timeout_s, what, every_s=0.5)
    except TimedOut as exc:
        raise AssertionError(f"timed out waiting for {what}; last run: {runs[-1]}") from exc


@dataclass
class PrivateRedis:
    proc: subprocess.Popen[bytes]
    url: str
    password_file: Path

    def pause(self, paused: bool = True) -> None:
        """SIGSTOP (unreachable: connections open, nothing answers) or SIGCONT."""
        os.kill(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)


def _answers(port: int, password: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            got = b""
            while b"\r\n" not in got.partition(b"\r\n")[2]:  # both replies
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
            return b"+PONG" in got
    except OSError:
        return False


@contextmanager
def private_redis(directory: Path) -> Iterator[PrivateRedis]:
    """A redis-server on a free loopback port with ``requirepass`` from a file (as the cluster
    YAMLs start the store), killed on the way out."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not on PATH (make redis)"
    password = secrets.token_hex(16)
    password_file = directory / "redis-password"
    password_file.write_text(password + "\n")
    port = free_port()
    proc = subprocess.Popen(
        redis_server_command(binary, port, extra=["--requirepass", password]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or _answers(port, password), 10, "redis-server", every_s=0.05
        )
        assert proc.poll() is None, "redis-server did not start"
        yield PrivateRedis(proc, f"redis://127.0.0.1:{port}/0", password_file)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
