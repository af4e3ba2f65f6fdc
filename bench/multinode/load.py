"""WebSocket clients (the lab's one connection, bench/client.py) through the balancer: each runs ``store:false`` chains (every turn
sends only its new input and ``previous_response_id``), notes how each connection ended
(the close code, 1006 when the TCP connection ended without a close frame) and reconnects
with a new chain, as a client that lost its connection must (``store:false`` ids die with
their connection).  Each connection, once open, asks the balancer's runtime API which
session node it went to (``servers``: client port → node)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..client import (
    TERMINAL_EVENT_TYPES,
    ConnectionClosed,
    InvalidHandshake,
    ResponsesSocket,
    close_code,
    connect,
    output_text,
)

MODEL = "emu-fast"


@dataclass
class Connection:
    """One socket of a client: when it opened, the turns it completed, how it ended."""

    opened_at: float
    local_port: int
    server: str | None = None  # the session node, from the balancer (:func:`locate`)
    turns: int = 0
    closed_at: float | None = None
    close_code: int | None = None  # None: still open or closed by the client itself
    in_flight: bool = False  # a create was sent and its terminal event not yet received
    completions: list[float] = field(default_factory=list)  # when each turn's terminal event came
    cached: list[int] = field(default_factory=list)  # each completed turn's ``cached_tokens``
    creates: int = 0  # ``response.create`` sent
    created: int = 0  # ``response.created`` received
    terminals: int = 0  # terminal events received
    shutting_down: int = 0  # creates answered with ``server_shutting_down``
    stopped: bool = False  # the load ended before this connection's chain did

    def open_at(self, t: float) -> bool:
        return self.opened_at <= t and (self.closed_at is None or self.closed_at >= t)


@dataclass
class Client:
    index: int
    connections: list[Connection] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed_connects: int = 0
    history: list[dict] = field(default_factory=list)  # with ``resend_history``: the conversation

    @property
    def turns(self) -> int:
        return sum(c.turns for c in self.connections)

    def connection_at(self, t: float) -> Connection | None:
        return next((c for c in self.connections if c.open_at(t)), None)

    @property
    def closes(self) -> list[Connection]:
        return [c for c in self.connections if c.close_code is not None]


def error_code(event: dict) -> str | None:
    err = event.get("error")
    return (err.get("code") if isinstance(err, dict) else None) or event.get("code")


async def turn(
    ws: ResponsesSocket,
    text: str,
    previous: str | None,
    max_tokens: int | None,
    conn: Connection | None = None,
    history: list[dict] | None = None,
    cache_key: str | None = None,
) -> dict:
    """One ``response.create`` and the events up to its terminal one; the terminal event.
    With ``history`` the whole conversation is sent (Codex's way, no ``previous_response_id``);
    ``conn`` counts the create, its ``response.created`` and its terminal event."""
    body: dict = {
        "type": "response.create",
        "model": MODEL,
        "input": [*(history or []), {"role": "user", "content": text}],
        "store": False,
    }
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    if previous:
        body["previous_response_id"] = previous
    if cache_key is not None:
        body["prompt_cache_key"] = cache_key
    await ws.send(body)
    if conn is not None:
        conn.creates += 1
        conn.in_flight = True  # sent: a close before its terminal event leaves it unanswered
    while True:
        event = await ws.recv()
        kind = event.get("type")
        if kind == "response.created" and conn is not None:
            conn.created += 1
        if kind in TERMINAL_EVENT_TYPES or kind == "error":
            if conn is not None and kind in TERMINAL_EVENT_TYPES:
                conn.terminals += 1
            return event


async def run_client(
    url: str,
    client: Client,
    stop: asyncio.Event,
    *,
    turns_per_chain: int = 4,
    think_s: float = 0.2,
    max_tokens: int | None = None,
    reconnect_s: float = 0.2,
    open_timeout_s: float = 10.0,
    ping_interval_s: float | None = 5.0,
    servers: Callable[[], dict[int, str]] | None = None,
    resend_history: bool = False,
) -> None:
    """Chains of ``turns_per_chain`` turns, one connection each, until ``stop``; a closed
    connection is recorded and replaced.  With ``resend_history`` the client is Codex: one
    conversation across its connections, each turn resending all of it (with a
    ``prompt_cache_key``), a turn that got no ``response.completed`` sent again on the next
    connection; after ``server_shutting_down`` it waits for the server's close."""
    done = 0  # with resend_history: the conversation's completed turns
    if resend_history and not client.history:  # Codex's instructions: a prefix of >1024 tokens
        words = " ".join(["the quick brown fox jumps over a lazy dog"] * 150)
        client.history.append({"role": "developer", "content": f"Conversation {client.index}. {words}"})
    while not stop.is_set():
        try:
            ws = await connect(url, open_timeout=open_timeout_s, ping_interval=ping_interval_s)
        except (TimeoutError, OSError, InvalidHandshake) as exc:
            client.failed_connects += 1
            client.errors.append(f"connect: {exc!r}")
            await asyncio.sleep(reconnect_s)
            continue
        conn = Connection(opened_at=time.monotonic(), local_port=ws.local_address[1])
        client.connections.append(conn)
        previous: str | None = None
        try:
            if servers is not None:
                conn.server = await locate(servers, conn.local_port)
            for i in range(turns_per_chain):
                if stop.is_set():
                    conn.stopped = True
                    break
                text = f"client {client.index} turn {done if resend_history else i}"
                if resend_history:
                    event = await turn(
                        ws, text, None, max_tokens, conn, client.history, f"client-{client.index}"
                    )
                else:
                    event = await turn(ws, text, previous, max_tokens, conn)
                conn.in_flight = False
                if resend_history and error_code(event) == "server_shutting_down":
                    conn.shutting_down += 1
                    while True:  # until the server's close (1012, once the node drained) raises
                        await ws.recv_raw()
                if event.get("type") != "response.completed":
                    client.errors.append(f"turn: {json.dumps(event)[:300]}")
                    break
                previous = event["response"]["id"]
                conn.turns += 1
                conn.completions.append(time.monotonic())
                details = (event["response"].get("usage") or {}).get("input_tokens_details") or {}
                conn.cached.append(int(details.get("cached_tokens") or 0))
                if resend_history:
                    client.history += [
                        {"role": "user", "content": text},
                        {"role": "assistant", "content": output_text(event["response"])},
                    ]
                    done += 1
                await asyncio.sleep(think_s)
            await ws.close()
            conn.closed_at = time.monotonic()
        except ConnectionClosed as exc:
            conn.closed_at = time.monotonic()
            conn.close_code = close_code(exc)
            await asyncio.sleep(reconnect_s)


async def locate(servers: Callable[[], dict[int, str]], port: int, timeout_s: float = 5.0) -> str | None:
    """The session node the balancer sent the connection from ``port`` to (None: not found
    within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = (await asyncio.to_thread(servers)).get(port)
        if found is not None:
            return found
        await asyncio.sleep(0.1)
    return None


async def run_load(
    url: str,
    clients: int,
    duration_s: float,
    servers: Callable[[], dict[int, str]],
    during: Callable[[list[Client]], None] | None = None,
    during_at_s: float | None = None,
    **client_kwargs: float | int | None,
) -> list[Client]:
    """``clients`` clients for ``duration_s``, each connection located with ``servers`` (the
    balancer's view); ``during`` runs (in a thread) at ``during_at_s``."""
    stop = asyncio.Event()
    state = [Client(i) for i in range(clients)]
    tasks = [
        asyncio.create_task(run_client(url, c, stop, servers=servers, **client_kwargs))  # type: ignore[arg-type]
        for c in state
    ]
    start = time.monotonic()
    if during is not None and during_at_s is not None:
        await asyncio.sleep(during_at_s)
        await asyncio.to_thread(during, state)
    await asyncio.sleep(max(0.0, duration_s - (time.monotonic() - start)))
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    return state
