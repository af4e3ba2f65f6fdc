"""Session-scoped embedded Ray + Serve app for integration tests (design.md §7)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from serve.builder import init_ray

    init_ray(object_store_mb=200, num_cpus=2)
    yield ray
    ray.shutdown()  # takes Serve and every actor with it


def start_app(name: str, **overrides) -> str:
    from serve.builder import start
    from serve.config import load_app_config

    config = load_app_config(None, **{"server.port": free_port(), **overrides})
    return start(config, name=name)


@pytest.fixture(scope="session")
def server_url(ray_cluster) -> str:
    """The main test server: emu-fast/emu-gpu, the model calls tools for 20 rounds."""
    from inference.profiles import load_inference_config

    inference = load_inference_config().model_copy(deep=True)
    inference.policy.tool_rounds = 20
    return start_app("responses-ws", **{"inference.policy": inference.policy.model_dump()})


@pytest.fixture(scope="session")
def ws_url(server_url) -> str:
    return server_url.replace("http://", "ws://") + "/v1/responses"


# --------------------------------------------------------------- a throw-away redis-server

START_TIMEOUT_S = 10.0


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start(binary: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start a server on a free port; ``None`` if it died (e.g. someone took the port)."""
    port = free_port()
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
