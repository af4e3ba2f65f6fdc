"""A drain of the gateway's node, on the suite's single-node Ray: the gateway is told the
node drains through the entry its drain watch calls (``Gateway.node_draining``, what it does
once Ray marks the node: serve/ray_drain.py, tested on a real drain in
tests/cluster/test_ray_drain.py).  The node is not really drained here (a single-node Ray
would stop); the multi-node harness drains real nodes through the same entry.

What a client and a balancer see: /readyz answers 503 before any socket closes; upgrades
are refused 503 with Retry-After; every create gets ``server_shutting_down``; responses in
flight complete; each socket then closes with 1012 after its last terminal event, in
batches; a deadline too close for a response cuts it off with 1012 before the deadline."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.server import on_handle_loop, running_apps
from tests.support.wire import validated

GRACE_S = 2.0  # the hold: the balancer's interval x fall, short for the test
BATCH, INTERVAL_S = 2, 0.5
STREAMING = {"emulator.tool_rounds": "0", "emulator.text_tokens": "200"}  # ~3 s on emu-gpu
LONG = {"emulator.tool_rounds": "0", "emulator.text_tokens": "900"}  # ~14 s on emu-gpu


def create(**body) -> str:
    return json.dumps({"type": "response.create", "model": "emu-gpu", "input": "hi", "store": False, **body})


def node_draining(app: str, deadline: float | None) -> None:
    from ray import serve

    async def call() -> None:
        await serve.get_deployment_handle("Gateway", app_name=app).node_draining.remote(deadline)

    on_handle_loop(call(), timeout_s=30)


@dataclass
class Socket:
    """What one client saw, on its own clock (time.monotonic())."""

    streaming: bool
    creates_sent: int = 0
    refused: int = 0  # error server_shutting_down
    other_errors: list[dict] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    created_seq: list[int] = field(default_factory=list)  # each created response's create: its place
    sent_before_refusal: int | None = None  # creates sent when the first refusal arrived
    close_code: int | None = None
    closed_at: float = 0.0
    last_terminal_at: float = 0.0


async def client(url: str, streaming: bool, started: asyncio.Event, draining: asyncio.Event) -> Socket:
    seen = Socket(streaming)
    async with websockets.connect(url, ping_interval=None) as ws:
        if streaming:  # started once its response is created (below)
            await ws.send(create(metadata=STREAMING))
            seen.creates_sent += 1
        else:
            started.set()

        async def sender() -> None:
            await draining.wait()
            while True:  # creates keep coming while the node drains, until the close
                await ws.send(create(input="more", metadata={"seq": str(seen.creates_sent)}))
                seen.creates_sent += 1
                await asyncio.sleep(0.05)  # the pace of a client that keeps sending: the workload

        task = asyncio.create_task(sender())
        try:
            while True:
                event = validated(await ws.recv())
                if event["type"] == "response.created":
                    seen.created.append(event["response"]["id"])
                    seen.created_seq.append(int((event["response"].get("metadata") or {}).get("seq", 0)))
                    started.set()
                elif event["type"] == "response.completed":
                    seen.completed.append(event["response"]["id"])
                    seen.last_terminal_at = time.monotonic()
                elif event["type"] == "error":
                    if event["error"]["code"] == "server_shutting_down" and event["status"] == 503:
                        if not seen.refused:
                            seen.sent_before_refusal = seen.creates_sent
                        seen.refused += 1
                    else:
                        seen.other_errors.append(event)
        except ConnectionClosed as closed:
            seen.closed_at = time.monotonic()
            seen.close_code = closed.rcvd.code if closed.rcvd is not None else None
        finally:
            task.cancel()
    return seen


DRAIN_SETTINGS = {
    "server.drain_health_grace_s": GRACE_S,
    "server.drain_close_batch_size": BATCH,
    "server.drain_close_batch_interval_s": INTERVAL_S,
    "server.drain_deadline_margin_s": 2.0,
    "server.drain_timeout_s": 30.0,
}


def app_of(test: str) -> str:
    return f"rws-node-drain-{test[-12:]}"


@pytest.fixture(scope="module")
def drain_apps(ray_cluster, request) -> Iterator[dict[str, str]]:
    """An app for each of the module's selected tests (a drained gateway serves no other
    test), deployed at once (``running_apps``): app name -> base URL."""
    tests = [item.name for item in request.session.items if item.path == request.path]
    with running_apps({app_of(test): DRAIN_SETTINGS for test in tests}) as urls:
        yield urls


@pytest.fixture
def drain_app(drain_apps, request) -> tuple[str, str]:
    """The test's own app: its name and base URL."""
    name = app_of(request.node.name)
    return name, drain_apps[name]


def test_a_node_drain_fails_readyz_first_answers_every_create_and_closes_1012_in_batches(drain_app):
    app, url = drain_app
    ws = url.replace("http", "ws", 1) + "/v1/responses"

    async def main() -> tuple[list[Socket], dict]:
        draining = asyncio.Event()
        started = [asyncio.Event() for _ in range(8)]
        tasks = [asyncio.create_task(client(ws, i < 2, started[i], draining)) for i in range(8)]
        for s in started:
            await asyncio.wait_for(s.wait(), 30)
        # (the two streaming responses are under way: created)
        t0 = time.monotonic()
        await asyncio.to_thread(node_draining, app, time.time() + 60)
        draining.set()
        async with httpx.AsyncClient(timeout=10) as http:
            ready = await http.get(f"{url}/readyz")
            t_503 = time.monotonic()
            try:
                async with websockets.connect(ws, open_timeout=10):
                    refused_upgrade = None
            except InvalidStatus as exc:
                refused_upgrade = exc.response
        sockets = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        # After the drain: /readyz still answers 503 (the listener stays open for the balancer).
        async with httpx.AsyncClient(timeout=10) as http:
            still = await http.get(f"{url}/readyz")
        return sockets, {
            "t0": t0,
            "t_503": t_503,
            "ready": (ready.status_code, ready.json()),
            "upgrade": refused_upgrade,
            "still": still.status_code,
        }

    sockets, seen = asyncio.run(main())
    t0 = seen["t0"]
    closes = sorted(s.closed_at - t0 for s in sockets)
    print(
        f"\nnode drain: readyz 503 at +{seen['t_503'] - t0:.2f} s; closes at "
        + ", ".join(f"+{c:.2f}" for c in closes)
        + f" s; creates sent {sum(s.creates_sent for s in sockets)}, refused server_shutting_down "
        f"{sum(s.refused for s in sockets)}, completed {sum(len(s.completed) for s in sockets)}"
    )
    status, body = seen["ready"]
    assert status == 503 and body["checks"]["draining"] == "draining: the node is draining", body
    upgrade = seen["upgrade"]
    assert upgrade is not None and upgrade.status_code == 503 and upgrade.headers["Retry-After"]
    assert json.loads(upgrade.body)["error"]["code"] == "server_shutting_down"
    assert seen["still"] == 503
    # /readyz failed before any socket closed; no socket closed before the hold was over.
    assert seen["t_503"] < min(s.closed_at for s in sockets)
    assert min(closes) >= GRACE_S - 0.3
    for s in sockets:
        assert s.close_code == 1012, s
        assert s.other_errors == [], s.other_errors
        # Every response that started ended before its socket closed.  A create sent in the
        # moment before the session host learnt of the drain may still run (the first "more"
        # can beat the host's notice on a loaded machine: queued behind the streaming response,
        # it starts after later creates were refused); none sent after the socket's first
        # refusal does: every response created is one of the creates sent before it (each
        # create names its place in the socket's sending order in its metadata, echoed).
        assert s.created == s.completed and len(s.created) >= (1 if s.streaming else 0), s
        assert s.refused > 0 and s.sent_before_refusal is not None, s
        assert all(seq < s.sent_before_refusal for seq in s.created_seq), s
        assert s.last_terminal_at <= s.closed_at
        # Every create was answered (a refusal, or the response itself), but at most the one
        # on the wire when the close frame left.
        answered = s.refused + len(s.completed)
        assert s.creates_sent - 1 <= answered <= s.creates_sent, s
    # The closes came in batches half a second apart, not all at once.  Each session host of
    # the node closes its share of a batch, rounded up (DrainPlan.share), so when the eight
    # connections were spread over more hosts than a batch holds, a batch closes more than
    # BATCH: the idle sockets span at least one interval, not (len / BATCH - 1) of them.
    idle = sorted(s.closed_at for s in sockets if not s.streaming)
    assert idle[-1] - idle[0] >= INTERVAL_S * 0.8, idle


def test_a_deadline_too_close_for_a_response_cuts_it_off_with_1012_before_the_deadline(drain_app):
    app, url = drain_app
    ws = url.replace("http", "ws", 1) + "/v1/responses"

    async def main() -> tuple[Socket, float, float]:
        started = asyncio.Event()
        task = asyncio.create_task(client_long(ws, started))
        await asyncio.wait_for(started.wait(), 30)  # its response is created
        deadline = time.time() + 5.0  # the node is killed in 5 s; the response needs ~14
        t0 = time.monotonic()
        await asyncio.to_thread(node_draining, app, deadline)
        seen = await asyncio.wait_for(task, 30)
        return seen, t0, deadline - time.time() + time.monotonic()

    async def client_long(url: str, started: asyncio.Event) -> Socket:
        seen = Socket(True)
        async with websockets.connect(url, ping_interval=None) as conn:
            await conn.send(create(metadata=LONG))
            try:
                while True:
                    event = validated(await conn.recv())
                    if event["type"] == "response.created":
                        seen.created.append(event["response"]["id"])
                        started.set()
                    elif event["type"] == "response.completed":
                        seen.completed.append(event["response"]["id"])
            except ConnectionClosed as closed:
                seen.closed_at = time.monotonic()
                seen.close_code = closed.rcvd.code if closed.rcvd is not None else None
        return seen

    seen, t0, deadline_mono = asyncio.run(main())
    print(
        f"\ndeadline drain: closed {seen.close_code} at +{seen.closed_at - t0:.2f} s, deadline +{deadline_mono - t0:.2f} s"
    )
    assert seen.close_code == 1012  # the client may retry
    assert len(seen.created) == 1 and seen.completed == []  # cut off: the deadline forced it
    assert seen.closed_at < deadline_mono  # the margin: closed before the node is killed
