"""The session actor terminates its clients' WebSockets itself.

The gateway accepts a TCP connection, sees a WebSocket upgrade for ``/v1/responses`` and
passes the socket's file descriptor to this actor over a Unix socket (``SCM_RIGHTS``), with
the upgrade request still unread in the kernel buffer.  From then on client frames reach
the session with no Ray hop at all; the only hop per turn is the one to inference
(docs/architecture.md has the measurements behind this).  No Ray in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from .config import SessionConfig
from .connection import Connection
from .errors import ConnectionLimitReached
from .protocol import encode, error_event

log = logging.getLogger(__name__)

RESPONSES_PATH = "/v1/responses"


def send_socket(uds_path: str, conn_id: str, owner: str, append_mode: bool, sock: socket.socket) -> None:
    """Gateway side: hand ``sock`` (authenticated as ``owner``) to the actor at ``uds_path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as uds:
        uds.connect(uds_path)
        socket.send_fds(uds, [json.dumps([conn_id, owner, append_mode]).encode()], [sock.fileno()])


class _HandoffServer(Server):
    """websockets' connection bookkeeping without an ``asyncio.Server``: sockets arrive by
    handoff, not by ``accept``; the server serves for as long as the actor lives."""

    def is_serving(self) -> bool:
        return True


class SocketServer:
    """Receives handed-over sockets and runs one WebSocket connection on each."""

    def __init__(self, config: SessionConfig, new_connection: Callable[[str, str, bool], Connection]) -> None:
        self._config = config
        self._new_connection = new_connection
        # Linux abstract namespace: no file to clean up when the actor dies.
        self.path = f"\0responses-ws-{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._arrived: dict[str, asyncio.Future[tuple[socket.socket, str, bool]]] = {}
        self._server: Server | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._ended: dict[str, asyncio.Future[None]] = {}

    def start(self) -> None:
        self._server = _HandoffServer(self._handle, process_request=self._check_request, open_timeout=10)
        self._accepting = asyncio.get_running_loop().create_task(self._accept_handoffs())

    def _future(self, conn_id: str) -> asyncio.Future[tuple[socket.socket, str, bool]]:
        return self._arrived.setdefault(conn_id, asyncio.get_running_loop().create_future())

    async def _accept_handoffs(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            uds, _ = await loop.sock_accept(self._listener)
            try:
                readable = loop.create_future()
                loop.add_reader(uds.fileno(), _set_once, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(uds.fileno())
                msg, fds, _, _ = socket.recv_fds(uds, 4096, 1)
                if fds:
                    conn_id, owner, append_mode = json.loads(msg)
                    fut = self._future(conn_id)
                    if fut.done():
                        os.close(fds[0])
                    else:
                        fut.set_result((socket.socket(fileno=fds[0]), owner, append_mode))
            except OSError:
                log.exception("socket handoff failed")
            finally:
                uds.close()

    async def serve(self, conn_id: str) -> None:
        """Run the WebSocket connection ``conn_id`` until it closes."""
        loop = asyncio.get_running_loop()
        sock, owner, append_mode = await asyncio.wait_for(self._future(conn_id), timeout=30)
        ended = self._ended[conn_id] = loop.create_future()
        cfg = self._config

        def factory() -> ServerConnection:
            protocol = ServerProtocol(extensions=[ServerPerMessageDeflateFactory()],
                                      max_size=cfg.max_frame_bytes)
            conn = ServerConnection(protocol, self._server, ping_interval=cfg.ping_interval_s,
                                    ping_timeout=cfg.ping_timeout_s, max_queue=64)
            conn.conn_id, conn.owner, conn.append_mode = conn_id, owner, append_mode  # type: ignore[attr-defined]
            return conn

        try:
            await loop.connect_accepted_socket(factory, sock)
            await ended
        finally:
            self._arrived.pop(conn_id, None)
            self._ended.pop(conn_id, None)

    def _check_request(self, ws: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0].rstrip("/") != RESPONSES_PATH:
            return ws.respond(404, "Not Found\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        conn = self._new_connection(ws.conn_id, ws.owner, ws.append_mode)  # type: ignore[attr-defined]
        conn_id: str = ws.conn_id  # type: ignore[attr-defined]
        sender = asyncio.get_running_loop().create_task(self._send_loop(ws, conn))
        timer = asyncio.get_running_loop().call_later(
            self._config.connection_lifetime_s, self._expire, conn)
        try:
            async for message in ws:
                conn.feed(message)
        except ConnectionClosed:
            pass
        finally:
            timer.cancel()
            # Cancels any running generation, so its inference batch slot is freed.
            await conn.close()
            with contextlib.suppress(BaseException):
                await sender
            ended = self._ended.get(conn_id)
            if ended is not None and not ended.done():
                ended.set_result(None)

    def _expire(self, conn: Connection) -> None:
        minutes = self._config.connection_lifetime_s / 60
        conn.finish_with(encode(error_event(ConnectionLimitReached(minutes))))

    async def _send_loop(self, ws: ServerConnection, conn: Connection) -> None:
        sock = ws.transport.get_extra_info("socket")
        try:
            async for batch in conn.events():
                # Cork the socket so the frames of one batch leave in as few segments as
                # possible (one client wake-up instead of one per event).
                with _corked(sock, len(batch) > 1):
                    for event in batch:
                        await ws.send(event if isinstance(event, str) else encode(event))
            # frames() ended without a client close: the server ends the connection (1000).
            await ws.close(1000)
        except ConnectionClosed:
            pass

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        self._listener.close()


@contextlib.contextmanager
def _corked(sock: socket.socket | None, enabled: bool) -> Iterator[None]:
    if not enabled or sock is None:
        yield
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def _set_once(fut: asyncio.Future[None]) -> None:
    # A reader callback can fire again before it is removed.
    if not fut.done():
        fut.set_result(None)
