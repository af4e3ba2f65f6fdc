"""HTTP mode on a session host: handed-over HTTP connections served with the ASGI app.

The gateway hands stateless HTTP connections to session hosts as it does WebSockets, so the
heavy part of HTTP mode — loading, re-rendering and re-scanning a whole conversation per
request — runs on hosts, which scale out, and never on the gateway's event loop, which only
accepts, peeks and hands over (docs/scaling.md).  A host that stands in for the HTTP hosts
(serve/pool.py: none started in time) serves one request per connection
(``keep_alive=False``): the response says ``Connection: close``, and the client's next
request is routed again.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.server import ServerState


def closing(app: ASGIApp) -> ASGIApp:
    """``app`` answering with ``Connection: close`` (uvicorn then closes the connection
    after the response)."""

    async def closing_app(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        await app(scope, receive, send_closing)

    return closing_app


class HttpServer:
    def __init__(self, app: ASGIApp) -> None:
        self._config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=30
        )
        self._config.load()
        self._state = ServerState()
        base: Any = self._config.http_protocol_class

        class Tracked(base):
            """uvicorn's protocol, telling us when its connection is over."""

            app: ASGIApp  # uvicorn's attribute, wrapped below

            def __init__(
                self, *args: Any, closed: asyncio.Future[None], keep_alive: bool, **kwargs: Any
            ) -> None:
                super().__init__(*args, **kwargs)
                self._closed = closed
                if not keep_alive:
                    self.app = closing(self.app)

            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                if not self._closed.done():
                    self._closed.set_result(None)

        self._protocol = Tracked

    async def serve(self, sock: socket.socket, keep_alive: bool = True) -> None:
        """Serve the connection ``sock`` (its request still unread) until it closes; after
        its first response unless ``keep_alive``."""
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        protocol = self._protocol(
            config=self._config, server_state=self._state, app_state={}, closed=closed, keep_alive=keep_alive
        )
        await loop.connect_accepted_socket(lambda: protocol, sock)
        await closed

    async def drain(self, timeout_s: float) -> None:
        """Let requests in flight finish; keep-alive connections close after them."""
        for protocol in list(self._state.connections):
            protocol.shutdown()
        if self._state.tasks:
            await asyncio.wait(list(self._state.tasks), timeout=timeout_s)
