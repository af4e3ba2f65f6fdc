"""A throw-away ``redis-server``: private, non-persistent, on a free port."""

from __future__ import annotations

import socket
import subprocess
import time

from serve.embedded import free_port

START_TIMEOUT_S = 10.0


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_once(binary: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """A server on a free port; ``None`` if it died (e.g. someone took the port)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


def start(binary: str, attempts: int = 3) -> tuple[subprocess.Popen[bytes], str] | None:
    """Start ``binary`` (a redis-server); its process and URL, or ``None`` after ``attempts``
    failed starts.  Stop it with :func:`stop`."""
    for _ in range(attempts):
        started = _start_once(binary)
        if started is not None:
            proc, port = started
            return proc, f"redis://127.0.0.1:{port}/0"
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
