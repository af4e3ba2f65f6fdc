"""Session-scoped embedded Ray + Serve app for integration tests (design.md §7)."""

from __future__ import annotations

import socket

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
