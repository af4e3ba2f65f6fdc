"""A throw-away ``redis-server`` for the store tests, one per test session."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

START_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start(binary: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start a server on a free port; ``None`` if it died (e.g. someone took the port)."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if _answers_ping(port):
            return proc, port
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """The URL of a private, non-persistent redis-server; the process is killed at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: install it (`apt-get install -y redis-server`; "
                    ".ci/run does this) to run the Redis store tests", pytrace=False)
    for _ in range(3):
        started = _start(binary)
        if started is not None:
            break
    else:
        pytest.fail("redis-server did not start (3 attempts)", pytrace=False)
    proc, port = started
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
