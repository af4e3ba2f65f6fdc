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

from bench.client import FINAL_EVENT_TYPES, output_text
from tests.support.server import gateway_stats, start_app, stop_app
from tests.support.waiting import wait_until
from tests.support.wire import raw_collect

CROWD_APP = "rws-crowd"  # the default config: the burst's, then the storm's (which redeploys it)
MODEL = "emu-fast"
SHORT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "4"}
OPEN_TIMEOUT_S = 10.0  # websockets' default, and the SDK's
BURST = 100
BURST_TURNS = 3
STORM = 100
MAX_HOSTS = 4  # "a handful": the default packs 1024 connections per host


def run(coro):
    return asyncio.run(coro)


def create(**body: Any) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "store": False, "metadata": SHORT, **body})


def settled(app: str) -> dict | None:
    """The gateway's stats once no socket is open and no pool slot is taken."""
    stats = gateway_stats(app)
    return (
        stats
        if stats["open_connections"] == 0 and stats["connections"] == 0 and stats["starting"] == 0
        else None
    )


def assert_one_response(events: list[dict]) -> dict:
    """The events of one turn: it completed, and its sequence numbers run 0, 1, 2, ...
    Returns the completed response."""
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert [e["sequence_number"] for e in events] == list(range(len(events))), types
    response = events[-1]["response"]
    assert all(e["response"]["id"] == response["id"] for e in events if "response" in e)
    return response


# ------------------------------------------------------------------ a burst on the default config


@pytest.fixture(scope="module")
def crowd_url(ray_cluster):
    """The default config (only the port is chosen), one app for the module: the burst, then
    the storm, which ends it with a redeploy (it comes last)."""
    url = start_app(CROWD_APP)
    yield url
    stop_app(CROWD_APP)


def test_a_burst_of_100_connections_on_the_default_config_is_packed_on_a_few_hosts(crowd_url):
    """~100 WebSockets opened at once (10 s open timeout), a few turns on each: every one
    opens and every turn completes with contiguous sequence numbers; the pool packs them
    (not one host per connection), and every slot is given back after the close."""
    ws_url = crowd_url.replace("http", "ws", 1) + "/v1/responses"
    before = gateway_stats(CROWD_APP)
    measured: dict[str, Any] = {}

    async def turns(ws, i: int) -> list[dict]:
        done = []
        for t in range(BURST_TURNS):
            await ws.send(create(input=f"connection {i}, turn {t}"))
            done.append(assert_one_response(await raw_collect(ws)))
        return done

    async def main():
        t0 = time.monotonic()
        opened = await asyncio.gather(
            *(websockets.connect(ws_url, open_timeout=OPEN_TIMEOUT_S) for _ in range(BURST)),
            return_exceptions=True,
        )
        measured["open_s"] = time.monotonic() - t0
        sockets = [ws for ws in opened if not isinstance(ws, BaseException)]
        try:
            failures = [repr(exc) for exc in opened if isinstance(exc, BaseException)]
            assert not failures, f"{len(failures)} of {BURST} did not open: {failures[:3]}"
            measured["while_open"] = await asyncio.to_thread(gateway_stats, CROWD_APP)
            t1 = time.monotonic()
            measured["responses"] = await asyncio.gather(*(turns(ws, i) for i, ws in enumerate(sockets)))
            measured["turns_s"] = time.monotonic() - t1
            measured["after_turns"] = await asyncio.to_thread(gateway_stats, CROWD_APP)
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
    after = wait_until(lambda: settled(CROWD_APP), 30.0, "every slot to be given back")
    print(
        f"\nburst: {BURST} opened in {measured['open_s']:.2f}s, {len(responses)} turns in "
        f"{measured['turns_s']:.2f}s; hosts before {before['actors']}, while open "
        f"{measured['while_open']['actors']}(+{measured['while_open']['starting']} starting), after turns "
        f"{measured['after_turns']['actors']}; settled in {time.monotonic() - t2:.2f}s: {after}"
    )
    assert after["actors"] <= MAX_HOSTS


# ------------------------------------------------------------------ a reconnect storm


def record_failed_connects(monkeypatch) -> list[tuple[float, str]]:
    """Why the SDK's connects failed (its reconnect loop swallows the reason): (when, what)."""
    from openai.resources.responses import responses

    connect = responses._async_connect_websocket
    failed: list[tuple[float, str]] = []

    async def recording(*args, **kwargs):
        try:
            return await connect(*args, **kwargs)
        except Exception as exc:
            body = getattr(getattr(exc, "response", None), "body", None)
            why = f"{exc!r} caused by {exc.__cause__!r}" + (f": {bytes(body)!r}" if body else "")
            failed.append((time.monotonic(), why))
            raise

    monkeypatch.setattr(responses, "_async_connect_websocket", recording)
    return failed


def test_a_redeploy_closes_every_socket_1012_and_the_sdk_reconnects_them_all(crowd_url, monkeypatch):
    """N openai-SDK connections (``on_reconnecting`` given: the SDK reconnects by itself)
    each complete a turn; a redeploy drains the gateway, which closes every socket with 1012;
    every client reconnects with the SDK's backoff to the new gateway and completes a turn
    there, sending its whole conversation (a new socket starts with an empty cache)."""
    from openai import AsyncOpenAI

    failed_connects = record_failed_connects(monkeypatch)
    url = crowd_url  # the default config (the burst's sockets closed and their slots given back)
    port = int(url.rsplit(":", 1)[1])
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    reconnects: list[list[Any]] = [[] for _ in range(STORM)]  # the ReconnectingEvents per client
    served: list[dict] = [{} for _ in range(STORM)]
    release = asyncio.Event()
    measured: dict[str, Any] = {}

    async def read_turn(events) -> list[dict]:
        out = []
        async for ev in events:
            out.append(ev.to_dict())
            if ev.type in FINAL_EVENT_TYPES:
                return out
        raise AssertionError("the connection ended before the response did")

    async def agent(i: int) -> None:
        reconnecting = asyncio.Event()

        def on_reconnecting(event):
            reconnects[i].append(event)
            reconnecting.set()
            return None  # same URL, same headers: the SDK's backoff decides when

        first_input = [{"role": "user", "content": f"agent {i}: start"}]
        async with client.responses.connect(on_reconnecting=on_reconnecting) as conn:
            events = conn.__aiter__()  # one iterator: its reconnect carries it to the new socket
            await conn.response.create(model=MODEL, input=first_input, store=False, metadata=SHORT)
            first = served[i]["first"] = assert_one_response(await read_turn(events))
            # The next thing on this socket is the server's 1012: the iterator reconnects.
            reader = asyncio.create_task(read_turn(events))
            await asyncio.wait(
                [reader, asyncio.create_task(reconnecting.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            if not reconnecting.is_set():  # the iterator ended (or raised) without a reconnect
                raise AssertionError(f"agent {i}: no reconnect; the socket gave {reader.result()}")
            served[i]["closed_at"] = time.monotonic()
            # Sent while the SDK reconnects: it queues the frame and flushes it on the new
            # socket.  Full input: the new socket has no cache to continue from.
            await conn.response.create(
                model=MODEL,
                store=False,
                metadata=SHORT,
                input=[
                    *first_input,
                    {"role": "assistant", "content": output_text(first)},
                    {"role": "user", "content": f"agent {i}: after the redeploy"},
                ],
            )
            served[i]["second"] = assert_one_response(await reader)
            served[i]["served_at"] = time.monotonic()
            await release.wait()  # the test reads the new gateway's stats with every socket open

    async def until_all(key: str, agents: asyncio.Future, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not all(key in s for s in served):
                if agents.done():
                    agents.result()  # an agent failed: raise its exception
                    raise AssertionError(f"agents ended without {key}")
                await asyncio.sleep(0.05)

    async def main():
        agents = asyncio.gather(*(agent(i) for i in range(STORM)))
        try:
            await until_all("first", agents, 120)
            measured["before"] = await asyncio.to_thread(gateway_stats, CROWD_APP)
            measured["redeploy_at"] = time.monotonic()
            # A changed config for the same app on the same port: Serve starts a new gateway
            # replica (it shares the port's listening socket), then stops the old one, which
            # drains: it stops listening and closes its idle sockets with 1012 at once.
            await asyncio.to_thread(start_app, CROWD_APP, **{"server.port": port, "session.max_inflight": 8})
            measured["redeployed_s"] = time.monotonic() - measured["redeploy_at"]
            await until_all("served_at", agents, 120)
            measured["after"] = await asyncio.to_thread(gateway_stats, CROWD_APP)
            release.set()
            await asyncio.wait_for(agents, 30)
        finally:
            agents.cancel()
            await asyncio.gather(agents, return_exceptions=True)

    run(main())
    before, after = measured["before"], measured["after"]
    attempts = [len(evs) for evs in reconnects]
    t0 = measured["redeploy_at"]
    closed = sorted(s["closed_at"] - t0 for s in served)
    back = sorted(s["served_at"] - t0 for s in served)
    print(
        f"\nstorm: {STORM} SDK connections; the redeploy call took {measured['redeployed_s']:.2f}s; "
        f"1012 seen {closed[0]:.2f}..{closed[-1]:.2f}s after it began; {sum(attempts)} reconnect attempts "
        f"(at most {max(attempts)} on one connection); served again by {back[len(back) // 2]:.2f}s (median), "
        f"{back[-1]:.2f}s (all); new gateway: {after}"
    )
    # Every client saw the server's 1012 and reconnected on its own.
    codes = [[ev.close_code for ev in evs] for evs in reconnects]
    assert all(evs and evs[0].attempt == 1 for evs in reconnects), codes
    assert {c for cs in codes for c in cs} == {1012}, codes
    # ... on its first attempt (~0.5 s later): the new gateway was listening before the
    # old one closed its sockets, and the old one no longer was.  (Serve's default
    # rolling update stops first: the port was closed for the new replica's start-up,
    # which cost every client 3-4 of the SDK's 5 backoff rounds; and a listener closed
    # under a pending accept kept taking a share of the connections, to reset them.)
    assert max(attempts) == 1, (
        "reconnect attempts per client",
        sorted(attempts),
        "failed connects",
        [(round(at - t0, 2), why) for at, why in failed_connects],
    )
    # Every one was served on both sides of the redeploy.
    ids = {s[k]["id"] for s in served for k in ("first", "second")}
    assert len(ids) == 2 * STORM
    assert all(output_text(s["second"]) for s in served)
    # The old gateway had all of them, the new one has all of them now, packed.
    assert before["open_connections"] == STORM and after["open_connections"] == STORM, (before, after)
    assert after["actors"] + after["starting"] <= MAX_HOSTS, after
    settled_after = wait_until(
        lambda: settled(CROWD_APP), 30.0, "every slot of the new gateway to be given back"
    )
    assert settled_after["actors"] <= MAX_HOSTS
