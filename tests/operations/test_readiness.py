"""/healthz and /readyz of a deployed app (the suite's embedded Ray): ready normally, and
not ready, naming the store, while the store refuses writes (a Redis that demands a
replica it does not have: NOREPLICAS); ready again once it accepts them."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from tests.support.serve_process import get_json
from tests.support.server import start_app, stop_app


def test_a_running_app_is_alive_and_ready(server_url):
    assert get_json(f"{server_url}/healthz") == (200, {"status": "ok"})
    # Each check is bounded (2 s): on a machine this loaded a store write can wait longer
    # for SQLite's lock, so the test allows a few rounds.
    assert wait_for_status(server_url, 200) == {
        "status": "ready",
        "failed": [],
        "checks": {"listener": "ok", "draining": "ok", "inference": "ok", "store": "ok"},
    }


@pytest.fixture
def redis_app(ray_cluster, redis_server):
    url = start_app(
        "rws-ready",
        **{
            "store.backend": "redis",
            "store.redis_url": redis_server,
            "store.key_prefix": f"ready-{uuid.uuid4().hex[:8]}:",
            "session.warm_actors": 1,
        },
    )
    yield url
    stop_app("rws-ready")


def wait_for_status(url: str, status: int, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        code, body = get_json(f"{url}/readyz")
        if code == status or time.monotonic() > deadline:
            assert code == status, body
            return body
        time.sleep(0.3)


def test_not_ready_while_the_store_refuses_writes(redis_app, redis_server):
    r = redis.Redis.from_url(redis_server)
    try:
        r.config_set("min-replicas-to-write", 1)  # every write now fails with NOREPLICAS
        body = wait_for_status(redis_app, 503)
        assert body["status"] == "not_ready" and body["failed"] == ["store"]
        assert "NOREPLICAS" in body["checks"]["store"] or "ReadOnly" in body["checks"]["store"], body
        assert body["checks"]["inference"] == "ok" and body["checks"]["listener"] == "ok"
        assert get_json(f"{redis_app}/healthz")[0] == 200  # alive all the same
    finally:
        r.config_set("min-replicas-to-write", 0)
    wait_for_status(redis_app, 200)
