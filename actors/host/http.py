"""HTTP mode on a session host: handed-over HTTP connections served with the ASGI app.

The gateway hands stateless HTTP connections to session hosts as it does WebSockets, so the
heavy part of HTTP mode — loading, re-rendering and re-scanning a whole conversation per
request — runs on hosts, which scale out, and never on the gateway's event loop, which only
accepts, peeks and hands over (docs/scaling.md).  No Ray here.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState


class HttpServer:
    def __init__(self, app: ASGIApp) -> None:
        self._config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                      timeout_keep_alive=30)
        self._config.load()
        self._state = ServerState()
        base: Any = self._config.http_protocol_class

        class Tracked(base):  # type: ignore[misc, valid-type]
            """uvicorn's protocol, telling us when its connection is over."""

            def __init__(self, *args: Any, closed: asyncio.Future[None], **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._closed = closed

            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                if not self._closed.done():
                    self._closed.set_result(None)

        self._protocol = Tracked

    async def serve(self, sock: socket.socket) -> None:
        """Serve the connection ``sock`` (its request still unread) until it closes."""
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        protocol = self._protocol(config=self._config, server_state=self._state, app_state={}, closed=closed)
        await loop.connect_accepted_socket(lambda: protocol, sock)
        await closed

    async def drain(self, timeout_s: float) -> None:
        """Let requests in flight finish; keep-alive connections close after them."""
        for protocol in list(self._state.connections):
            protocol.shutdown()
        if self._state.tasks:
            await asyncio.wait(list(self._state.tasks), timeout=timeout_s)
