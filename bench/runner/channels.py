"""How a loop's pre-encoded creates reach the server: one :class:`Channel` per transport.

- ``ws``: one WebSocket-mode connection (bench/client.py's, raw frames: a frame's kind is
  told from its head, only the final one is parsed);
- ``http-full`` / ``http-chained``: ``POST /v1/responses`` with ``stream: true`` (SSE) over
  a connection pool the client process shares per target (httpx, as bench/transports.py).

A channel sends one body and waits for the final event: :class:`Reply` holds its raw text
and the client-side timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..client import (
    FINAL_EVENT_TYPES,
    FIRST_TOKEN_TYPES,
    TERMINAL_EVENT_TYPES,
    ConnectionClosed,
    ResponsesSocket,
    close_code,
    connect,
    frame_type,
    is_final_frame,
    is_first_token_frame,
)
from ..invariants import ConnectionCheck
from .model import ConnectionRecord

OPEN_TIMEOUT_S = 60.0
PING_INTERVAL_S = 20.0  # the keepalive's (bench/client.py's default)
DRAIN_S = 0.05  # a checked channel's wait for stray events before it closes
HTTP_TIMEOUT_S = 300.0


@dataclass
class Reply:
    raw: str  # the final event's JSON text ('' when the answer ended without one)
    sent: float  # time.time() when sent
    total_s: float
    ttft_s: float | None
    status: int | None = None  # HTTP status when not 200
    gap_s: float | None = None  # ws: from the frame (or the send) before the final one to it
    first_s: float | None = None  # ws: the send -> the answer's first frame
    # append mode (:class:`AppendChannel`): the output items of this answer, which ends at the
    # pause on a function call (``raw`` that call's ``response.output_item.done``) or the terminal
    # event; the response's id (from its ``response.created``)
    segment: list[dict[str, Any]] | None = None
    response_id: str | None = None


SHUTTING_DOWN = "server_shutting_down"  # the error a stopping server answers a create with


class Connections:
    """A client process's WebSocket connections, each a :class:`ConnectionRecord` from its open
    (numbered per loop); ``on_open`` (e.g. a :class:`~bench.runner.locate.Locator`'s lookup)
    runs on each before its first create."""

    def __init__(self, on_open: Callable[[ConnectionRecord], Awaitable[None]] | None = None) -> None:
        self.records: list[ConnectionRecord] = []
        self.on_open = on_open
        self._per_loop: Counter[int] = Counter()

    def opened(self, loop: int, local_port: int, target: str = "") -> ConnectionRecord:
        record = ConnectionRecord(loop, self._per_loop[loop], time.time(), local_port, target=target)
        self._per_loop[loop] += 1
        self.records.append(record)
        return record


def note_frame(record: ConnectionRecord, raw: str) -> bool:
    """Count a server frame on its connection's record; whether it is the answer's final one."""
    kind = frame_type(raw)
    if kind == "response.created":
        record.created += 1
        return False
    if kind in TERMINAL_EVENT_TYPES:
        record.terminals += 1
        record.completed += kind == "response.completed"
    elif kind == "error":
        err = json.loads(raw).get("error")
        if (err.get("code") if isinstance(err, dict) else None) == SHUTTING_DOWN:
            record.shutting_down += 1
    else:
        return False
    record.in_flight = False
    return True


class Channel:
    """A loop's way to the server; :meth:`open` before the first turn.  A WebSocket channel
    keeps its connection's :class:`ConnectionRecord` (``record``) when given a
    :class:`Connections`."""

    record: ConnectionRecord | None = None
    created: str | None = None  # the last send's ``response.created`` event (raw), once it came

    async def open(self) -> None:
        pass

    @property
    def is_open(self) -> bool:
        """A connection of its own is open (an HTTP channel shares its process's pool: no)."""
        return False

    async def send(self, body: str) -> Reply:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class WsChannel(Channel):
    """One WebSocket connection.  With ``connections`` (and the ``loop`` it belongs to) it
    keeps a :class:`ConnectionRecord`: every create and the frames answering it counted, and
    how the connection ended (watched while it is open: a close between turns is seen when it
    happens), the server's close code unless the client closed it."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        open_timeout_s: float = OPEN_TIMEOUT_S,
        *,
        ping_interval_s: float | None = PING_INTERVAL_S,
        connections: Connections | None = None,
        loop: int = 0,
        compression: str | None = None,
        headers: dict[str, str] | None = None,
        lookup_in_background: bool = False,
        query: str = "",
    ) -> None:
        self.base_url = base_url
        self.query = query  # the upgrade URL's (append mode opts in there)
        self.headers = headers  # on the upgrade request (a resume token)
        self.open_ms: float | None = None  # the last open's handshake
        # the connections' on_open (where it went) beside the first create rather than before it
        self.lookup_in_background = lookup_in_background
        self._lookup: asyncio.Task[None] | None = None
        self.api_key = api_key
        self.open_timeout_s = open_timeout_s
        self.ping_interval_s = ping_interval_s
        self.compression = compression
        self.connections, self.loop = connections, loop
        self.socket: ResponsesSocket | None = None
        self._watch: asyncio.Task[None] | None = None

    async def open(self) -> None:
        began = time.perf_counter()
        self.socket = await connect(
            self.base_url,
            api_key=self.api_key,
            open_timeout=self.open_timeout_s,
            ping_interval=self.ping_interval_s,
            compression=self.compression,
            additional_headers=self.headers,
            query=self.query,
        )
        self.open_ms = (time.perf_counter() - began) * 1000  # the handshake alone (no lookup after it)
        if self.connections is not None:
            self.record = self.connections.opened(self.loop, self.socket.local_address[1], self.base_url)
            self._watch = asyncio.create_task(self._watch_close(self.socket))
            if self.connections.on_open is not None:
                lookup = self.connections.on_open(self.record)
                if self.lookup_in_background:
                    self._lookup = asyncio.create_task(lookup)  # type: ignore[arg-type]
                else:
                    await lookup

    async def _watch_close(self, sock: ResponsesSocket) -> None:
        self._ended(await sock.wait_closed())

    def _ended(self, code: int | None) -> None:
        """The connection ended now (``code``: the server's; None: the client closed it)."""
        if self.record is not None and self.record.closed is None:
            self.record.closed, self.record.close_code = time.time(), code

    @property
    def is_open(self) -> bool:
        return self.socket is not None

    async def located(self) -> ConnectionRecord | None:
        """Its record once the connections' ``on_open`` (where it went) ran on it, also when
        that ran in the background (``lookup_in_background``)."""
        if self._lookup is not None:
            await asyncio.gather(self._lookup, return_exceptions=True)
        return self.record

    def upgrade_header(self, name: str) -> str | None:
        """A header of the server's answer to the upgrade (a resume token's)."""
        assert self.socket is not None, "open() first"
        return self.socket.upgrade_headers.get(name)

    def abort(self) -> None:
        """Drop the TCP connection without a close frame (a lost network); the client ended it."""
        if self.socket is not None:
            sock, self.socket = self.socket, None
            self._ended(None)
            sock.abort()
            if self._watch is not None:
                self._watch.cancel()

    async def wait_closed(self) -> int:
        """Wait until the server ends the connection; its close code."""
        sock = self.socket
        assert sock is not None, "open() first"
        code = await sock.wait_closed()
        self._ended(code)
        return code

    async def send(self, body: str) -> Reply:
        sock, record = self.socket, self.record
        assert sock is not None, "open() first"
        sent = time.time()
        t0 = time.perf_counter()
        ttft = None
        self.created = None
        try:
            await sock.send_raw(body)
            if record is not None:
                record.creates += 1
                record.in_flight = True
            before, first = t0, None
            while True:
                raw = await sock.recv_raw()
                now = time.perf_counter()
                if first is None:
                    first = now - t0
                if self.created is None and frame_type(raw) == "response.created":
                    self.created = raw
                if ttft is None and is_first_token_frame(raw):
                    ttft = now - t0
                if self._pauses(raw) or (
                    note_frame(record, raw) if record is not None else is_final_frame(raw)
                ):
                    return self._reply(raw, sent, now - t0, ttft, gap_s=now - before, first_s=first)
                before = now
        except ConnectionClosed as exc:
            self._ended(close_code(exc))
            raise

    def _pauses(self, raw: str) -> bool:
        """Whether the answer under way pauses at this frame before its terminal event (a
        mode that does: :class:`~bench.runner.agent.AppendChannel`)."""
        return False

    def _reply(
        self, raw: str, sent: float, total_s: float, ttft: float | None, gap_s: float, first_s: float | None
    ) -> Reply:
        return Reply(raw, sent, total_s, ttft, gap_s=gap_s, first_s=first_s)

    async def close(self) -> None:
        if self.socket is not None:
            sock, self.socket = self.socket, None
            self._ended(sock.close_code() if sock.ended else None)
            await sock.close()
            if self._watch is not None:
                self._watch.cancel()


class CheckedWsChannel(WsChannel):
    """A WebSocket channel whose every create and event goes through a
    :class:`~bench.invariants.ConnectionCheck` (every frame parsed): a refused or broken
    connection is a ``connection`` violation, the events that arrive within :data:`DRAIN_S`
    after the last answer are shown to the check on close (strays), and a create left
    unanswered then is lost."""

    def __init__(self, base_url: str, api_key: str | None, check: ConnectionCheck) -> None:
        super().__init__(base_url, api_key)
        self.check = check

    def _broken(self, what: str, exc: Exception) -> None:
        self.check.run.violate(
            "connection", self.check.name, None, f"{what}{type(exc).__name__}: {exc}"[:300]
        )

    async def open(self) -> None:
        try:
            await super().open()
        except Exception as exc:
            self._broken("connect: ", exc)
            raise

    async def send(self, body: str) -> Reply:
        sock = self.socket
        assert sock is not None, "open() first"
        self.check.create_sent(json.loads(body).get("previous_response_id"))
        sent = time.time()
        t0 = time.perf_counter()
        ttft = None
        try:
            await sock.send_raw(body)
            while True:
                raw = await sock.recv_raw()
                event = json.loads(raw)
                self.check.feed(event)
                if ttft is None and event.get("type") in FIRST_TOKEN_TYPES:
                    ttft = time.perf_counter() - t0
                if event.get("type") in FINAL_EVENT_TYPES:
                    return Reply(raw, sent, time.perf_counter() - t0, ttft)
        except Exception as exc:
            self._broken("", exc)
            raise

    async def close(self) -> None:
        if self.socket is not None:
            with contextlib.suppress(Exception):  # websockets' recv() is cancellation-safe
                while True:
                    self.check.feed(json.loads(await asyncio.wait_for(self.socket.recv_raw(), DRAIN_S)))
            self.check.close()
        await super().close()


class HttpChannel(Channel):
    """Streams a create over ``client`` (an ``httpx.AsyncClient`` for one target).  Made with
    ``own=(base_url, api_key)`` instead it builds a client of its own in :meth:`open` (a new
    connection, as a new agent session makes) and closes it in :meth:`close`."""

    def __init__(self, client: Any = None, *, own: tuple[str, str | None] | None = None) -> None:
        self.client = client
        self.own = own

    async def open(self) -> None:
        if self.own is not None:
            self.client = http_client(*self.own)

    async def close(self) -> None:
        if self.own is not None and self.client is not None:
            client, self.client = self.client, None
            await client.aclose()

    async def send(self, body: str) -> Reply:
        sent = time.time()
        t0 = time.perf_counter()
        ttft = None
        self.created = None
        async with self.client.stream(
            "POST", "/v1/responses", content=body.encode(), headers={"Content-Type": "application/json"}
        ) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return Reply(text[:300], sent, time.perf_counter() - t0, None, r.status_code)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].lstrip()
                if self.created is None and frame_type(data) == "response.created":
                    self.created = data
                if ttft is None and is_first_token_frame(data):
                    ttft = time.perf_counter() - t0
                if is_final_frame(data):
                    return Reply(data, sent, time.perf_counter() - t0, ttft)
        return Reply("", sent, time.perf_counter() - t0, ttft)


def http_client(base_url: str, api_key: str | None) -> Any:
    """A connection pool to one target, unbounded (one connection per loop in flight)."""
    import httpx

    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        timeout=HTTP_TIMEOUT_S,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
    )
