"""Resume on any node (docs/reliability.md, "Resuming on any node"): with resume on and the
Redis store, a ``store:false`` chain goes on across a crash of its session host and a drain
of its whole app, resumed through a balancer by whichever app and host the token reaches.

One node here: two apps (two gateways, each with its own session hosts and inference)
sharing one real redis-server stand in for two nodes, and a TCP balancer in front of them
(tests/support/balancer.py) is switched from one to the other.  A host is killed with
SIGKILL (a crash), an app is deleted (a drain: 1012).  The multi-node harness runs the same
steps with real nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import psutil
import pytest
import redis
import websockets
from ray import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bench.client import output_text
from tests.support.balancer import Balancer
from tests.support.server import delete_apps, start_apps, stop_app
from tests.support.waiting import until, wait_until
from tests.support.wire import raw_collect

HEADER = "x-responses-ws-resume-token"
KEY = "key-any-node"
GRACE_S = 20.0
TURN = {"emulator.tool_rounds": "0", "emulator.text_tokens": "12"}
TURNS = 8


def run(coro):
    return asyncio.run(coro)


# The apps each test asks ``cluster`` for (a crash or a drain leaves an app unfit for the
# next test: each such test has its own).
APPS_OF = {
    "test_a_store_false_chain_survives_a_host_crash_and_a_drain_with_the_same_output": (
        "rws-any-a",
        "rws-any-b",
    ),
    "test_an_expired_or_never_issued_token_gets_invalid_resume_token": ("rws-any-c",),
    "test_bench_resume_resumes_every_chain_through_the_labs_client": ("rws-any-c",),
    "test_the_openai_sdk_continues_across_a_crash_and_a_drain_by_itself": ("rws-any-d", "rws-any-b"),
}


@pytest.fixture(scope="module")
def cluster(ray_cluster, redis_server, request):
    """Apps on one Redis (one key prefix): ``make(name)`` returns the port of the app
    ``name``.  The first call deploys it and every app the module's selected tests ask for
    (``APPS_OF``) at once: two cores deploy two at a time (``start_apps``)."""
    prefix = f"rws-any-{uuid.uuid4().hex[:8]}:"
    started: dict[str, int] = {}
    selected = [item.originalname for item in request.session.items if item.path == request.path]
    overrides = {
        "session.resume_grace_s": GRACE_S,
        "server.api_keys": [KEY],
        "store.backend": "redis",
        "store.redis_url": redis_server,
        "store.key_prefix": prefix,
    }

    def make(name: str) -> int:
        if name not in started:
            names = {name, *(app for test in selected for app in APPS_OF.get(test, ()))} - set(started)
            started.update(
                {n: port_of(url) for n, url in start_apps(dict.fromkeys(names, overrides)).items()}
            )
        return started[name]

    make.prefix = prefix  # type: ignore[attr-defined]
    make.redis = redis.Redis.from_url(redis_server, decode_responses=True)  # type: ignore[attr-defined]
    yield make
    for name in started:
        stop_app(name)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture(scope="module")
def expected(cluster) -> list[str]:
    """The chain's output uninterrupted (on app B)."""

    async def main() -> list[str]:
        async with connect(cluster("rws-any-b")) as ws:
            out, previous = [], None
            for i in range(TURNS):
                response = await turn(ws, i, previous)
                out.append(output_text(response))
                previous = response["id"]
        return out

    return run(main())


def body(i: int, previous: str | None) -> dict:
    body = {
        "model": "emu-fast",
        "store": False,
        "input": f"step {i}: " + "context " * (300 if i == 0 else 5),
        "metadata": TURN,
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def create(i: int, previous: str | None) -> str:
    body = {
        "type": "response.create",
        "model": "emu-fast",
        "store": False,
        "input": f"step {i}: " + "context " * (300 if i == 0 else 5),
        "metadata": TURN,
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return json.dumps(body)


def connect(port: int, token: str | None = None):
    headers = {"Authorization": f"Bearer {KEY}"}
    if token is not None:
        headers[HEADER] = token
    return websockets.connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers)


async def turn(ws, i: int, previous: str | None) -> dict:
    await ws.send(create(i, previous))
    last = (await raw_collect(ws))[-1]
    assert last["type"] == "response.completed", last
    return last["response"]


def kill_host_of(balancer: Balancer) -> None:
    """SIGKILL the session host process serving the balancer's latest upstream connection."""
    port = balancer.upstream_ports[-1]
    for proc in psutil.process_iter(["cmdline"]):
        if not (proc.info["cmdline"] or [""])[0].startswith("ray::SessionHost"):
            continue
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.raddr and c.raddr.port == port for c in conns):
            os.kill(proc.pid, signal.SIGKILL)
            return
    raise AssertionError(f"no session host holds the socket from port {port}")


async def closed_code(ws) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.recv()
    return closed.value.rcvd.code if closed.value.rcvd is not None else 1006


def test_a_store_false_chain_survives_a_host_crash_and_a_drain_with_the_same_output(cluster, expected):
    port_a, port_b = cluster("rws-any-a"), cluster("rws-any-b")
    balancer = Balancer(port_b)
    timings: list[tuple[str, float, int]] = []

    async def resumed(token: str, i: int, previous: str, what: str):
        started = time.perf_counter()
        ws = await connect(balancer.port, token)
        response = await turn(ws, i, previous)
        cached = response["usage"]["input_tokens_details"]["cached_tokens"]
        timings.append((what, (time.perf_counter() - started) * 1000.0, cached))
        return ws, response

    async def interrupted() -> list[str]:
        balancer.target_port = port_a
        ws = await connect(balancer.port)
        token = ws.response.headers[HEADER]
        assert token.startswith("rws2.")
        out, previous = [], None
        for i in range(3):
            response = await turn(ws, i, previous)
            out.append(output_text(response))
            previous = response["id"]
        # The crash: the host process is killed; the gateway closes the socket 1011.
        kill_host_of(balancer)
        assert await closed_code(ws) == 1011
        ws, response = await resumed(token, 3, previous, "after a host crash (same app, another host)")
        out.append(output_text(response))
        previous = response["id"]
        for i in range(4, 6):
            response = await turn(ws, i, previous)
            out.append(output_text(response))
            previous = response["id"]
        # The drain: app A goes (a rolling upgrade of its node); the socket closes 1012, and
        # the balancer sends the reconnect to app B.
        balancer.target_port = port_b
        delete_apps("rws-any-a")
        assert await closed_code(ws) == 1012
        ws, response = await resumed(token, 6, previous, "after a drain (another app)")
        out.append(output_text(response))
        previous = response["id"]
        for i in range(7, TURNS):
            response = await turn(ws, i, previous)
            out.append(output_text(response))
            previous = response["id"]
        await ws.close()  # a normal close: the state is deleted from the store
        return out

    try:
        got = run(interrupted())
    finally:
        balancer.close()
    for what, ms, cached in timings:
        print(
            f"resume {what}: reconnect to the terminal event of the next turn {ms:.1f} ms, cached_tokens={cached}"
        )
    assert got == expected
    wait_until(  # the normal close deleted the state: no content left
        lambda: (
            not [k for k in cluster.redis.keys(f"{cluster.prefix}conn:*") if holds_content(cluster.redis, k)]
        ),
        10,
        "the closed connections' states to be deleted",
    )


def holds_content(redis, key) -> bool:
    """A connection's snapshot (its hash's ``blob``) or its change log (the list beside it,
    ``conn:{id}:log``) is still in the store."""
    kind = redis.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    return kind == "list" or (kind == "hash" and bool(redis.hexists(key, "blob")))


def test_an_expired_or_never_issued_token_gets_invalid_resume_token(cluster):
    port = cluster("rws-any-c")

    async def main():
        answers = []
        for token in ("rws2.never-issued.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "rws2..x", "garbage"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(port, token):
                    pass
            answers.append(refused.value.response.status_code)
            body = json.loads(bytes(refused.value.response.body))
            assert body["error"]["code"] == "invalid_resume_token"
        assert answers == [400, 400, 400]
        # A token of a connection the client closed normally is gone with it.
        ws = await connect(port)
        token = ws.response.headers[HEADER]
        await turn(ws, 0, None)
        await ws.close()
        conn_id = token.split(".")[1]
        await until(
            lambda: (
                not [
                    k
                    for k in cluster.redis.keys(f"{cluster.prefix}conn:*{conn_id}*")
                    if holds_content(cluster.redis, k)
                ]
            ),
            10,
            "the closed connection's state to be deleted",
            every_s=0.05,
        )
        with pytest.raises(InvalidStatus) as refused:
            async with connect(port, token):
                pass
        assert refused.value.response.status_code == 400

    run(main())


def test_bench_resume_resumes_every_chain_through_the_labs_client(cluster):
    """``responses-ws bench resume``'s clients, small: each drops its socket (a TCP abort) and
    resumes with its token (the load runner's ``resume`` workload), and its chain goes on."""
    from bench.kinds.resume import Plan, drive, summary

    plan = Plan(clients=2, resumes=2, steady=1, prefix_tokens=200, text_tokens=8)
    url = f"ws://127.0.0.1:{cluster('rws-any-c')}/v1/responses"
    s = summary(run(drive(url, plan, api_key=KEY)))
    assert s["errors"] == []
    assert s["resumes"] == plan.clients * plan.resumes
    assert s["resume_first_event_ms"]["n"] == plan.clients * plan.resumes
    assert s["steady_first_event_ms"]["n"] == plan.clients * plan.steady * (plan.resumes + 1)


def test_the_openai_sdk_continues_across_a_crash_and_a_drain_by_itself(cluster, expected):
    """The SDK reconnects on 1011 and 1012 by itself; ``on_reconnecting`` sends the token."""
    import threading

    from openai import OpenAI

    port_a, port_b = cluster("rws-any-d"), cluster("rws-any-b")
    balancer = Balancer(port_a)
    client = OpenAI(base_url=f"http://127.0.0.1:{balancer.port}/v1", api_key=KEY, max_retries=0)
    token: dict[str, str] = {}
    codes: list[int] = []
    pending: list = []

    def on_reconnecting(event):
        codes.append(event.close_code)
        for send in pending:  # the agent loop's next turn, sent as the SDK reconnects
            threading.Timer(0.3, send).start()
        pending.clear()
        return {"extra_headers": token}

    out: list[str] = []
    try:
        with client.responses.connect(on_reconnecting=on_reconnecting) as conn:
            token[HEADER] = conn._connection.response.headers[HEADER]

            def finished():
                ev = next(ev for ev in conn if ev.type in ("response.completed", "error", "response.failed"))
                assert ev.type == "response.completed", ev
                out.append(output_text(ev.response.model_dump(mode="json")))
                return ev.response.id

            previous = None
            for i in range(TURNS):
                if i == 3:  # the host crashes
                    pending.append(lambda p=previous, i=i: conn.response.create(**body(i, p)))
                    kill_host_of(balancer)
                elif i == 6:  # the app drains; the balancer sends the reconnect elsewhere
                    pending.append(lambda p=previous, i=i: conn.response.create(**body(i, p)))
                    balancer.target_port = port_b
                    serve.delete("rws-any-d", _blocking=False)
                else:
                    conn.response.create(**body(i, previous))
                previous = finished()
    finally:
        balancer.close()
    assert codes[:1] == [1011] and 1012 in codes, codes
    assert out == expected


def test_with_resume_off_nothing_of_a_store_false_chain_is_written(ray_cluster, redis_server, tmp_path):
    """Neither the Redis store nor the SQLite file gets a ``store:false`` response's content:
    only its usage line (counts, no text)."""
    marker = f"private-{uuid.uuid4().hex}"
    prefix = f"rws-off-{uuid.uuid4().hex[:8]}:"
    apps = {
        "rws-off-redis": {
            "store.backend": "redis",
            "store.redis_url": redis_server,
            "store.key_prefix": prefix,
        },
        "rws-off-sqlite": {"store.backend": "sqlite", "store.data_dir": str(tmp_path / "data")},
    }
    urls = start_apps({name: {"server.api_keys": [KEY], **store} for name, store in apps.items()})  # at once
    ports = {name: port_of(url) for name, url in urls.items()}

    async def chain(port: int) -> None:
        async with connect(port) as ws:
            previous = None
            for i in range(3):
                await ws.send(json.dumps({"type": "response.create", **body(i, previous), "input": marker}))
                last = (await raw_collect(ws))[-1]
                assert last["type"] == "response.completed", last
                previous = last["response"]["id"]

    for port in ports.values():
        run(chain(port))
    delete_apps(*apps)  # drained, both at once: whatever was pending is written
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    keys = r.keys(f"{prefix}*")
    assert not [k for k in keys if ":conn:" in k or ":resp:" in k], keys
    for key in keys:
        kind = r.type(key)
        values = {"string": lambda k: [r.get(k)], "list": lambda k: r.lrange(k, 0, -1), "set": r.smembers}[
            kind
        ](key)
        assert not any(marker in str(v) for v in values), key
    files = list((tmp_path / "data").rglob("*"))
    assert files, "the SQLite store was opened"
    for f in files:
        if f.is_file():
            assert marker.encode() not in f.read_bytes(), f
