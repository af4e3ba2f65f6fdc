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
from dataclasses import dataclass
from typing import Any

from ..client import (
    FINAL_EVENT_TYPES,
    FIRST_TOKEN_TYPES,
    ResponsesSocket,
    connect,
    is_final_frame,
    is_first_token_frame,
)
from ..invariants import ConnectionCheck

OPEN_TIMEOUT_S = 60.0
DRAIN_S = 0.05  # a checked channel's wait for stray events before it closes
HTTP_TIMEOUT_S = 300.0


@dataclass
class Reply:
    raw: str  # the final event's JSON text ('' when the answer ended without one)
    sent: float  # time.time() when sent
    total_s: float
    ttft_s: float | None
    status: int | None = None  # HTTP status when not 200


class Channel:
    """A loop's way to the server; :meth:`open` before the first turn."""

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
    def __init__(self, base_url: str, api_key: str | None, open_timeout_s: float = OPEN_TIMEOUT_S) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.open_timeout_s = open_timeout_s
        self.socket: ResponsesSocket | None = None

    async def open(self) -> None:
        self.socket = await connect(self.base_url, api_key=self.api_key, open_timeout=self.open_timeout_s)

    @property
    def is_open(self) -> bool:
        return self.socket is not None

    async def send(self, body: str) -> Reply:
        sock = self.socket
        assert sock is not None, "open() first"
        sent = time.time()
        t0 = time.perf_counter()
        ttft = None
        await sock.send_raw(body)
        while True:
            raw = await sock.recv_raw()
            if ttft is None and is_first_token_frame(raw):
                ttft = time.perf_counter() - t0
            if is_final_frame(raw):
                return Reply(raw, sent, time.perf_counter() - t0, ttft)

    async def close(self) -> None:
        if self.socket is not None:
            sock, self.socket = self.socket, None
            await sock.close()


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
    """Streams a create over ``client`` (an ``httpx.AsyncClient`` for one target)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def send(self, body: str) -> Reply:
        sent = time.time()
        t0 = time.perf_counter()
        ttft = None
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
