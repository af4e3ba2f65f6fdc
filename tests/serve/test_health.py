"""Readiness checks (serve/health.py) with fake probes: what /readyz answers and what
Serve's check_health raises, without Ray."""

from __future__ import annotations

import asyncio
import sqlite3

import httpx
import pytest
from fastapi import FastAPI

from serve.health import Probes, Readiness, add_readiness_route
from store import StoreRefused


async def answers() -> None:
    return None


async def read_only_database() -> None:
    raise sqlite3.OperationalError("attempt to write a readonly database")


async def never_answers() -> None:
    await asyncio.sleep(3600)  # a probe that hangs: the thing under test (its caller's timeout)


def probes(
    *, listening: bool = True, draining: bool | str = False, inference=answers, store=answers
) -> Probes:
    return Probes(listening=lambda: listening, draining=lambda: draining, inference=inference, store=store)


def check(p: Probes, **kwargs) -> dict:
    return asyncio.run(Readiness(p, timeout_s=0.2).check(**kwargs)).body()


def test_ready_when_every_check_passes():
    assert check(probes()) == {
        "status": "ready",
        "failed": [],
        "checks": {"listener": "ok", "draining": "ok", "inference": "ok", "store": "ok"},
    }


def test_not_ready_while_draining():
    body = check(probes(draining=True))
    assert body["status"] == "not_ready" and body["failed"] == ["draining"]


def test_a_drain_of_the_node_says_why_and_the_listener_is_still_ok():
    body = check(probes(draining="the node is draining"))
    assert body["failed"] == ["draining"]
    assert body["checks"]["draining"] == "draining: the node is draining"
    assert body["checks"]["listener"] == "ok"  # still listening: the balancer's check gets its 503


def test_not_ready_when_the_store_is_unwritable():
    body = check(probes(store=read_only_database))
    assert body["failed"] == ["store"]
    assert body["checks"]["store"] == "OperationalError: attempt to write a readonly database"


def test_a_check_that_hangs_fails_after_the_timeout_and_the_others_still_report():
    body = check(probes(inference=never_answers, listening=False))
    assert body["failed"] == ["listener", "inference"]
    assert body["checks"]["inference"] == "no answer within 0.2 s"
    assert body["checks"]["store"] == "ok"


def test_serve_health_check_runs_the_same_checks_but_fails_only_what_a_restart_cures(caplog):
    """A stopped listener fails it; a draining replica is not restarted; a store or an
    inference deployment that is down does not fail it (a restarted gateway would be just as
    unready) but is logged."""
    with pytest.raises(RuntimeError, match="listener: not accepting connections"):
        asyncio.run(Readiness(probes(listening=False)).raise_unless_healthy())
    asyncio.run(Readiness(probes(draining=True)).raise_unless_healthy())
    caplog.clear()
    with caplog.at_level("WARNING", logger="serve.health"):
        asyncio.run(Readiness(probes(store=read_only_database), timeout_s=0.2).raise_unless_healthy())
        asyncio.run(Readiness(probes(inference=never_answers), timeout_s=0.2).raise_unless_healthy())
    assert [r.getMessage() for r in caplog.records] == [
        "not ready: store: OperationalError: attempt to write a readonly database",
        "not ready: inference: no answer within 0.2 s",
    ]


def test_a_failure_is_logged_when_it_starts_not_on_every_probe(caplog):
    readiness = Readiness(probes(store=read_only_database))

    async def three_rounds() -> None:
        for _ in range(3):
            await readiness.check()

    with caplog.at_level("WARNING", logger="serve.health"):
        asyncio.run(three_rounds())
    assert [r.getMessage() for r in caplog.records] == [
        "not ready: store: OperationalError: attempt to write a readonly database"
    ]


@pytest.mark.parametrize(("store", "status"), [(answers, 200), (read_only_database, 503)])
def test_readyz_answers_200_or_503_with_the_report(store, status):
    app = FastAPI()
    add_readiness_route(app, Readiness(probes(store=store)))

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/readyz")

    response = asyncio.run(get())
    assert response.status_code == status
    assert response.json()["status"] == ("ready" if status == 200 else "not_ready")


async def refuses() -> None:
    raise StoreRefused("redis refused this client: invalid username-password pair")


def test_a_store_that_refuses_the_gateway_fails_serve_health_check_too():
    """A wrong store credential is this replica's configuration, not an outage: /readyz 503
    and Serve's check fails, so `serve status` does not call the gateway HEALTHY."""
    body = check(probes(store=refuses))
    assert body["failed"] == ["store"]
    assert body["checks"]["store"].startswith("refused: StoreRefused: redis refused this client")
    with pytest.raises(RuntimeError, match="store: refused: StoreRefused"):
        asyncio.run(Readiness(probes(store=refuses), timeout_s=0.2).raise_unless_healthy())
