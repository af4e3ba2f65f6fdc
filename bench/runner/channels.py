"""How a loop's pre-encoded creates reach the server: one :class:`Channel` per transport.

- ``ws``: one WebSocket-mode connection (bench/client.py's, raw frames: a frame's kind is
  told from its head, only the final one is parsed);
- ``http-full`` / ``http-chained``: ``POST /v1/responses`` with ``stream: true`` (SSE) over
  a connection pool the client process shares per target (httpx, as bench/transports.py).

A channel sends one body and waits for the final event: :class:`Reply` holds its raw text
and the client-side timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..client import ResponsesSocket, connect, is_final_frame, is_first_token_frame

OPEN_TIMEOUT_S = 60.0
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

    async def send(self, body: str) -> Reply:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class WsChannel(Channel):
    def __init__(self, base_url: str, api_key: str | None) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.socket: ResponsesSocket | None = None

    async def open(self) -> None:
        self.socket = await connect(self.base_url, api_key=self.api_key, open_timeout=OPEN_TIMEOUT_S)

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
