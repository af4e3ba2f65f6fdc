"""Serving a crowd: a burst of connections on the default (packed) session config, and a
reconnect storm after a redeploy, driven by the openai SDK's own reconnect.

Each scenario runs on an app of its own (its pool and its counters are the test's alone);
``-s`` prints what it measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import websockets
from ray import serve

from tests.support.server import start_app
from tests.support.wire import raw_collect, validated

BURST_APP = "rws-crowd"
STORM_APP = "rws-crowd-storm"
MODEL = "emu-fast"
SHORT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "4"}
OPEN_TIMEOUT_S = 10.0  # websockets' default, and the SDK's
BURST = 100
BURST_TURNS = 3
STORM = 80
MAX_HOSTS = 4  # "a handful": the default packs 256 connections per host


def run(coro):
    return asyncio.run(coro)


def create(**body: Any) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "store": False, "metadata": SHORT, **body})


def gateway_stats(app: str) -> dict:
    return serve.get_deployment_handle("Gateway", app_name=app).stats.remote().result()


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def settled(app: str) -> dict | None:
    """The gateway's stats once no socket is open and no pool slot is taken."""
    stats = gateway_stats(app)
    return stats if stats["open_connections"] == 0 and stats["connections"] == 0 and stats["starting"] == 0 else None


def assert_one_response(events: list[dict]) -> dict:
    """The events of one turn: it completed, and its sequence numbers run 0, 1, 2, ...
    Returns the completed response."""
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert [e["sequence_number"] for e in events] == list(range(len(events))), types
    response = events[-1]["response"]
    assert all(e["response"]["id"] == response["id"] for e in events if "response" in e)
    return response


def output_text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


# ------------------------------------------------------------------ a burst on the default config


@pytest.fixture(scope="module")
def burst_url(ray_cluster):
    url = start_app(BURST_APP)  # the default session config: only the port is chosen
    yield url
    serve.delete(BURST_APP)


def test_a_burst_of_100_connections_on_the_default_config_is_packed_on_a_few_hosts(burst_url):
    """~100 WebSockets opened at once (10 s open timeout), a few turns on each: every one
    opens and every turn completes with contiguous sequence numbers; the pool packs them
    (not one host per connection), and every slot is given back after the close."""
    ws_url = burst_url.replace("http", "ws", 1) + "/v1/responses"
    before = gateway_stats(BURST_APP)
    measured: dict[str, Any] = {}

    async def turns(ws, i: int) -> list[dict]:
        done = []
        for t in range(BURST_TURNS):
            await ws.send(create(input=f"connection {i}, turn {t}"))
            done.append(assert_one_response(await raw_collect(ws)))
        return done

    async def main():
        t0 = time.monotonic()
        opened = await asyncio.gather(*(websockets.connect(ws_url, open_timeout=OPEN_TIMEOUT_S)
                                        for _ in range(BURST)), return_exceptions=True)
        measured["open_s"] = time.monotonic() - t0
        sockets = [ws for ws in opened if not isinstance(ws, BaseException)]
        try:
            failures = [repr(exc) for exc in opened if isinstance(exc, BaseException)]
            assert not failures, f"{len(failures)} of {BURST} did not open: {failures[:3]}"
            measured["while_open"] = await asyncio.to_thread(gateway_stats, BURST_APP)
            t1 = time.monotonic()
            measured["responses"] = await asyncio.gather(*(turns(ws, i) for i, ws in enumerate(sockets)))
            measured["turns_s"] = time.monotonic() - t1
            measured["after_turns"] = await asyncio.to_thread(gateway_stats, BURST_APP)
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)

    run(main())
    responses = [r for per_conn in measured["responses"] for r in per_conn]
    assert len(responses) == BURST * BURST_TURNS
    assert len({r["id"] for r in responses}) == len(responses)
    assert all(r["status"] == "completed" and output_text(r) for r in responses)

    for when in ("while_open", "after_turns"):
        stats = measured[when]
        assert stats["open_connections"] == BURST + before["open_connections"], (when, stats)
        assert stats["connections"] == BURST + before["connections"], (when, stats)
        assert stats["actors"] + stats["starting"] <= MAX_HOSTS, (when, stats)
    t2 = time.monotonic()
    after = wait_for(lambda: settled(BURST_APP), what="every slot to be given back")
    print(f"\nburst: {BURST} opened in {measured['open_s']:.2f}s, {len(responses)} turns in "
          f"{measured['turns_s']:.2f}s; hosts before {before['actors']}, while open "
          f"{measured['while_open']['actors']}(+{measured['while_open']['starting']} starting), after turns "
          f"{measured['after_turns']['actors']}; settled in {time.monotonic() - t2:.2f}s: {after}")
    assert after["actors"] <= MAX_HOSTS
