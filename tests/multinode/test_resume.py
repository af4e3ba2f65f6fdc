"""Resume on any node, on real nodes (issue 35; docs/reliability.md, "Resuming on any node"):
the tier's app runs with resume on and the Redis store on the head (conftest.py).

- A ``store:false`` chain of 20 turns, driven at once by a raw WebSocket client and by the
  openai SDK's own reconnection (``on_reconnecting`` sends the token back), both on one
  session node: that node is drained by Ray (a deadline, killed at it) at turn 7, the
  clients resume through the balancer on the other node; the drained node is started again,
  and the node the clients are on now gets SIGKILL at turn 14: they resume on the restarted
  one.  Both outputs equal an uninterrupted run's, and the first turn after each resume
  reports ``cached_tokens > 0`` (two inference replicas run).
- A node partitioned away while its client resumes on the other node cannot serve or write
  that connection's state when the partition heals (the epoch in the store).
- Expired and never-issued tokens get ``400 invalid_resume_token`` through the balancer.

Runs after test_node_loss.py (which leaves one session node killed): restarts it first.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from bench.client import FINAL_EVENT_TYPES, output_text
from bench.multinode import Harness
from store.connection_states import conn_key as store_conn_key
from store.state_reader import read_state
from tests.multinode.conftest import wait_up
from tests.support.waiting import TimedOut, wait_until

HEADER = "x-responses-ws-resume-token"
TURNS = 20
DRAIN_AT, KILL_AT = 7, 14  # the turns sent after each fault
DRAIN_DEADLINE_S = 20
KEY_PREFIX = "rws:"  # configs/serve-cluster.yaml
KNOBS = {"emulator.tool_rounds": "0", "emulator.text_tokens": "16", "emulator.seed": "35"}
OPEN_S = 60.0


def body(i: int, previous: str | None) -> dict[str, Any]:
    """Turn ``i`` of the chain: the first carries ~1200 tokens, so every later prompt is past
    the 1024 tokens from which ``cached_tokens`` is reported."""
    out: dict[str, Any] = {
        "model": "emu-fast",
        "store": False,
        "input": f"step {i}: " + "context " * (1200 if i == 0 else 6),
        "metadata": KNOBS,
    }
    if previous is not None:
        out["previous_response_id"] = previous
    return out


def cached(response: dict) -> int:
    return int(response["usage"]["input_tokens_details"]["cached_tokens"])


@dataclass
class Chain:
    """One client's run of the chain: each turn's text and ``cached_tokens``, the node each
    turn ran on, the close codes it saw and each resume's time to its first event."""

    texts: list[str] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    nodes: list[str | None] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    resume_ms: list[float] = field(default_factory=list)
    previous: str | None = None

    def record(self, response: dict, node: str | None) -> None:
        self.texts.append(output_text(response))
        self.cached.append(cached(response))
        self.nodes.append(node)
        self.previous = response["id"]


class Raw:
    """A raw client: a sync websocket; on a close it reconnects through the balancer with its
    token (retrying refusals) and sends the next create.  ``key``: its API key (its prefix
    cache scope; none: anonymous), ``url``: a node's own port instead of the balancer,
    ``token``: resume that connection."""

    def __init__(
        self, harness: Harness, *, key: str | None = None, url: str | None = None, token: str | None = None
    ) -> None:
        self.harness = harness
        self.key = key
        self.chain = Chain()
        self.via_balancer = url is None
        self.ws = self._open(url or harness.ws_url, token)
        self.token = token or self.ws.response.headers[HEADER]

    def _open(self, url: str, token: str | None) -> ClientConnection:
        headers = {HEADER: token} if token else {}
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        return connect(url, additional_headers=headers, open_timeout=OPEN_S, max_size=None)

    @property
    def node(self) -> str | None:
        """The session node the balancer sent the socket to (``None`` straight to a node)."""
        return node_of(self.harness, self.ws.local_address[1]) if self.via_balancer else None

    def turn(self, i: int) -> dict:
        self.ws.send(json.dumps({"type": "response.create", **body(i, self.chain.previous)}))
        while True:
            event = json.loads(self.ws.recv(timeout=OPEN_S))
            if event["type"] in FINAL_EVENT_TYPES:
                assert event["type"] == "response.completed", event
                self.chain.record(event["response"], self.node)
                return event["response"]

    def wait_close(self, timeout_s: float) -> int:
        try:
            while True:
                self.ws.recv(timeout=timeout_s)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else 1006

    def resume(self, i: int, timeout_s: float = 60.0) -> None:
        """Reconnect with the token (through the balancer) and run turn ``i``; the time from
        the reconnect to the next turn's first event is recorded."""
        self.chain.codes.append(self.wait_close(timeout_s))
        deadline = time.monotonic() + timeout_s
        while True:
            started = time.perf_counter()
            try:
                self.ws = self._open(self.harness.ws_url, self.token)
                self.via_balancer = True
                break
            except (InvalidHandshake, OSError, TimeoutError) as exc:  # a 503 while the balancer learns
                status = getattr(getattr(exc, "response", None), "status_code", None)
                assert status in (None, 502, 503), exc
                assert time.monotonic() < deadline, f"no resume within {timeout_s}s: {exc!r}"
                time.sleep(0.5)  # the client's back-off between reconnects, as a real client's
        self.ws.send(json.dumps({"type": "response.create", **body(i, self.chain.previous)}))
        first = json.loads(self.ws.recv(timeout=OPEN_S))
        self.chain.resume_ms.append((time.perf_counter() - started) * 1000.0)
        while first["type"] not in ("response.completed", "response.failed", "error"):
            first = json.loads(self.ws.recv(timeout=OPEN_S))
        assert first["type"] == "response.completed", first
        self.chain.record(first["response"], self.node)


class Sdk:
    """The openai SDK's ``client.responses.connect`` with its reconnection on: on a close it
    reconnects by itself; ``on_reconnecting`` sends the token back and queues the create the
    agent loop would send next."""

    def __init__(self, harness: Harness, key: str = "sk-multinode-sdk") -> None:
        from openai import OpenAI

        self.harness = harness
        self.chain = Chain()
        self.pending: list[Callable[[], None]] = []
        self.headers: dict[str, str] = {}
        self.reconnect_at: float | None = None
        client = OpenAI(base_url=harness.url + "/v1", api_key=key, max_retries=0)
        self.manager = client.responses.connect(on_reconnecting=self.on_reconnecting)
        self.conn = self.manager.__enter__()
        self.headers[HEADER] = self.conn._connection.response.headers[HEADER]

    def on_reconnecting(self, event: Any) -> dict[str, Any]:
        if event.attempt == 1:
            self.chain.codes.append(event.close_code)
            self.reconnect_at = time.perf_counter() + event.delay  # the SDK's own backoff first
        for send in self.pending:
            send()  # queued by the SDK while it reconnects, sent on the new socket
        self.pending.clear()
        return {"extra_headers": dict(self.headers)}

    @property
    def node(self) -> str | None:
        return node_of(self.harness, self.conn._connection.local_address[1])

    def finished(self, timed: bool = False) -> None:
        first_at = None
        for ev in self.conn:
            first_at = first_at or time.perf_counter()
            if ev.type in FINAL_EVENT_TYPES:
                assert ev.type == "response.completed", ev
                break
        if timed and self.reconnect_at is not None and first_at is not None:
            self.chain.resume_ms.append((first_at - self.reconnect_at) * 1000.0)
        self.chain.record(ev.response.model_dump(mode="json"), self.node)

    def turn(self, i: int) -> None:
        self.conn.response.create(**body(i, self.chain.previous))
        self.finished()

    def resume(self, i: int) -> None:
        """Turn ``i`` after a fault: the create goes out once the SDK reconnects."""
        self.pending.append(lambda p=self.chain.previous: self.conn.response.create(**body(i, p)))
        self.finished(timed=True)

    def close(self) -> None:
        self.manager.__exit__(None, None, None)


def node_of(harness: Harness, port: int, timeout_s: float = 5.0) -> str | None:
    """The session node the balancer sent the client's socket from ``port`` to (``show sess``
    lists it once the balancer has connected it); ``None`` if it never does."""
    with contextlib.suppress(TimedOut):
        return wait_until(
            lambda: harness.connection_servers().get(port), timeout_s, f"the balancer's node of :{port}"
        )
    return None


def all_up(harness: Harness) -> None:
    for node in harness.session_nodes:
        if harness.ready(node.name) != 200:
            t0 = time.monotonic()
            harness.restart(node.name)
            print(f"\nrestarted {node.name}: ready in {time.monotonic() - t0:.1f}s")
    wait_up(harness)


@pytest.fixture(scope="module")
def store(harness: Harness) -> redis.Redis:
    return redis.Redis.from_url(harness.redis_url, decode_responses=True)


@pytest.fixture(scope="module")
def expected(harness: Harness) -> Chain:
    """The chain uninterrupted, through the balancer."""
    all_up(harness)
    raw = Raw(harness)
    for i in range(TURNS):
        raw.turn(i)
    raw.ws.close()
    return raw.chain


def conn_key(conn_id: str) -> str:
    return store_conn_key(conn_id, KEY_PREFIX)


def conn_state(store: redis.Redis, token: str) -> tuple[dict[str, str], dict]:
    """The connection's hash in the store (its change log under ``"log"``) and its state."""
    return read_state(store, token, KEY_PREFIX)


def test_a_partitioned_node_cannot_serve_or_write_a_state_resumed_elsewhere(harness, expected, store):
    old = Raw(harness)
    node = old.node
    assert node is not None
    other = next(n.name for n in harness.session_nodes if n.name != node)
    for i in range(3):
        old.turn(i)
    before, state = conn_state(store, old.token)
    assert state["lanes"][0]["id"] == old.chain.previous, (state, old.chain.previous)
    harness.partition(node)
    try:
        # The client resumes on the other node (straight to it: the balancer still sees the
        # partitioned node healthy) while the old socket stays open on the partitioned one.
        new = Raw(
            harness, url=harness.node_url(other).replace("http", "ws", 1) + "/v1/responses", token=old.token
        )
        new.chain.previous = old.chain.previous
        new.turn(3)
        taken, state = conn_state(store, old.token)
        assert state["lanes"][0]["id"] == new.chain.previous
        assert int(taken["epoch"]) == int(before["epoch"]) + 1 and taken["holder"] != before["holder"]
    finally:
        harness.partition(node, heal=True)
    # Healed: the old holder gets a create on its old socket.  It may not answer it with a
    # completed response, nor write the state: its socket closes (1000 when the takeover's
    # message reaches it first, 1012 when its own write is fenced).
    answered: list[str] = []
    try:
        old.ws.send(json.dumps({"type": "response.create", **body(3, old.chain.previous)}))
        while True:
            event = json.loads(old.ws.recv(timeout=40.0))
            answered.append(event["type"])
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else 1006
    after, state = conn_state(store, old.token)
    print(
        f"\npartitioned {node}; resumed on {other} (epoch {before['epoch']} -> {taken['epoch']}); healed: "
        f"the old socket got {answered} and closed {code}; the store's epoch {after['epoch']}, holder "
        f"{after['holder']}, the latest response the new holder's: {state['lanes'][0]['id'] == new.chain.previous}"
    )
    assert "response.completed" not in answered and code in (1000, 1012), (answered, code)
    assert state["lanes"][0]["id"] == new.chain.previous
    assert (after["epoch"], after["holder"], after["blob"], after["log"]) == (
        taken["epoch"],
        taken["holder"],
        taken["blob"],
        taken["log"],
    )
    new.turn(4)  # the new holder goes on
    assert new.chain.texts[-2:] == expected.texts[3:5]
    new.ws.close()


def test_expired_and_never_issued_tokens_get_invalid_resume_token(harness, store):
    """A dropped connection's state expires in the store (its TTL, brought forward here to
    spare the tier the 30 s grace); its token, and one never issued, get the typed 400."""
    raw = Raw(harness)
    raw.turn(0)
    _, conn_id, _ = raw.token.split(".", 2)
    key = conn_key(conn_id)
    # The state's expiry taken away here: the host's last refresh once it sees the drop (it
    # parks the state for the grace window) sets it again, which shows the refresh is done.
    # (A heartbeat, every third of the grace, could set it first: a rare, harmless early look.)
    assert store.persist(key)
    raw.ws.socket.shutdown(socket.SHUT_RDWR)  # dropped: no close frame, the state stays parked
    raw.ws.close()
    wait_until(lambda: store.pttl(key) > 0, 10, "the host's refresh of the dropped connection's state")
    store.pexpire(key, 1)  # what the grace's TTL does, now
    store.pexpire(key + ":log", 1)
    wait_until(lambda: not store.exists(key), 10, "the state's expiry", every_s=0.05)
    for token in (raw.token, f"rws2.{conn_id}x.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"):
        with pytest.raises(InvalidStatus) as refused:
            connect(harness.ws_url, additional_headers={HEADER: token}, open_timeout=OPEN_S).close()
        assert refused.value.response.status_code == 400
        assert json.loads(bytes(refused.value.response.body))["error"]["code"] == "invalid_resume_token"


def co_located(harness: Harness) -> tuple[Raw, Sdk]:
    """A raw client and an SDK client on the same session node (leastconn places each new
    connection on the node with fewer: extra open sockets steer the SDK's)."""
    raw = Raw(harness, key="sk-multinode-raw")
    fillers: list[ClientConnection] = []
    try:
        for _ in range(6):
            sdk = Sdk(harness)
            if sdk.node == raw.node:
                return raw, sdk
            fillers.append(sdk.conn._connection)  # held open: the next goes to raw's node
        raise AssertionError("the SDK's connection never landed beside the raw client's")
    finally:
        for ws in fillers:
            ws.close()


def test_a_store_false_chain_continues_across_a_drain_and_a_sigkill_of_its_node(harness, expected):
    all_up(harness)
    raw, sdk = co_located(harness)
    first = raw.node
    assert first is not None
    second = next(n.name for n in harness.session_nodes if n.name != first)
    timeline: list[str] = []
    try:
        for i in range(TURNS):
            if i == DRAIN_AT:
                d = harness.drain(first, deadline_s=DRAIN_DEADLINE_S, reason_message="resume tier")
                t0 = time.monotonic()
                raw.resume(i)
                sdk.resume(i)
                timeline.append(f"drained {first}: both resumed {time.monotonic() - t0:.1f}s after the drain")
                if d.timer is not None:
                    d.timer.join(timeout=DRAIN_DEADLINE_S + 10)
                t0 = time.monotonic()
                harness.restart(first)
                wait_up(harness)
                timeline.append(f"{first} killed at its deadline, restarted in {time.monotonic() - t0:.1f}s")
            elif i == KILL_AT:
                t0 = time.monotonic()
                n = harness.kill(second)
                raw.resume(i)
                sdk.resume(i)
                timeline.append(
                    f"SIGKILL of {second} ({n} processes): both resumed {time.monotonic() - t0:.1f}s after"
                )
            else:
                raw.turn(i)
                sdk.turn(i)
    finally:
        sdk.close()
        raw.ws.close()
    for name, chain in (("raw", raw.chain), ("sdk", sdk.chain)):
        print(
            f"\n{name}: nodes {chain.nodes}\n  close codes {chain.codes}, reconnect to first event "
            f"{[round(ms) for ms in chain.resume_ms]} ms, cached_tokens {chain.cached}"
        )
    print("  " + "\n  ".join(timeline))
    print(f"uninterrupted: cached_tokens {expected.cached}")
    for chain in (raw.chain, sdk.chain):
        assert chain.texts == expected.texts
        assert chain.nodes[:DRAIN_AT] == [first] * DRAIN_AT
        assert chain.nodes[DRAIN_AT:KILL_AT] == [second] * (KILL_AT - DRAIN_AT)
        assert chain.nodes[KILL_AT:] == [first] * (TURNS - KILL_AT)
        assert chain.codes == [1012, 1006], chain.codes
        # Its own scope (key): only its own earlier turns can have cached its prefix.
        assert chain.cached[0] == 0 and chain.cached[DRAIN_AT] > 0 and chain.cached[KILL_AT] > 0, chain.cached
