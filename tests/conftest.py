"""Session-scoped fixtures: the embedded Ray, the main test server, a throw-away redis-server.
Helpers the tests share are in tests/support/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

# A test is `integration` when it lives in a tier of real deployments or asks for a fixture
# that starts a real service (Ray and Serve, a redis-server); every other test is `unit`:
# pure logic that runs in milliseconds (`make test-unit`, `pytest -m unit`).
INTEGRATION_DIRS = ("integration", "operations", "cluster", "real_model")
SERVICE_FIXTURES = {"ray_cluster", "redis_server"}
# The real-model tier (a real model on vLLM's CPU build, its own virtualenv: `make
# test-real-model`) is `real_model` too, deselected by default (pyproject addopts).
REAL_MODEL_DIR = "real_model"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: pure logic, no service started (the fast tier)")
    config.addinivalue_line("markers", "integration: real Ray/Serve, a real store server or real clients")
    config.addinivalue_line("markers", "real_model: a real model on a real engine (make test-real-model)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(item.config.rootpath / "tests").parts[0]
        real = tier in INTEGRATION_DIRS or SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.integration if real else pytest.mark.unit)
        if tier == REAL_MODEL_DIR:
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from serve.embedded import embedded_ray

    with embedded_ray(object_store_mb=200, num_cpus=2):  # its end takes Serve and every actor with it
        yield ray


@pytest.fixture(scope="session")
def server_url(ray_cluster) -> str:
    """The main test server: emu-fast/emu-gpu, the model calls tools for 20 rounds."""
    from inference.profiles import load_inference_config
    from tests.support.server import start_app

    inference = load_inference_config().model_copy(deep=True)
    inference.policy.tool_rounds = 20
    return start_app("responses-ws", **{"inference.policy": inference.policy.model_dump()})


@pytest.fixture(scope="session")
def two_replicas_url(ray_cluster) -> str:
    """A server with two inference replicas (a connection's requests must stay on one),
    shared by the modules that need one: starting an app costs several seconds."""
    from tests.support.server import start_app

    return start_app("rws-two-replicas", **{"inference.replicas": 2})


@pytest.fixture(scope="session")
def ws_url(server_url) -> str:
    from bench.client import ws_url

    return ws_url(server_url)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """The URL of a private, non-persistent redis-server; the process is killed at the end."""
    from tests.support import redis

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH: install it (`apt-get install -y redis-server`; "
                    ".ci/run does this) to run the Redis store tests", pytrace=False)
    started = redis.start(binary)
    if started is None:
        pytest.fail("redis-server did not start (3 attempts)", pytrace=False)
    proc, url = started
    try:
        yield url
    finally:
        redis.stop(proc)
