"""Usage exactly once under faults (docs/reliability.md): the short version of ``responses-ws
bench ledger`` — WebSocket and HTTP clients on a real server with a real SQLite store,
session hosts SIGKILLed under load, the ledger reconciled against what the clients saw."""

from __future__ import annotations

import asyncio

import pytest

from bench.kinds.ledger import Plan, faults
from tests.support.server import start_app, stop_app

APP = "rws-ledger"


@pytest.fixture(scope="module")
def ledger_app(ray_cluster, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("ledger-store")
    url = start_app(
        APP, **{"session.connections_per_actor": 2, "session.warm_actors": 2, "store.data_dir": str(data_dir)}
    )
    yield url, data_dir
    stop_app(APP)


def test_killed_session_hosts_lose_no_ledger_line_and_none_is_billed_twice_or_unseen(ledger_app):
    url, data_dir = ledger_app
    result = asyncio.run(faults(url, data_dir, Plan(ws=8, http=4, duration_s=15, kill_every_s=3, seed=26)))
    verdict = result["reconcile"]
    assert result["kills"] >= 2, result["kill_log"]
    assert result["ws_dropped"] > 0, "the kills ended client sockets mid-run"
    assert verdict["seen_billed"] > 100, verdict
    assert verdict["mismatches"] == 0, verdict
    assert verdict["billed_unseen_stored_fetched"] == verdict["billed_unseen_stored"], (
        "a stored response billed before its host died can be fetched, with the billed usage"
    )
