"""The gateway's listening socket: WebSocket upgrades and HTTP mode go to session hosts.

Each accepted connection's request head is *peeked* (``MSG_PEEK``, nothing consumed).  A
WebSocket upgrade of ``/v1/responses`` is handed, still unread, to a session actor on this
node (:mod:`actors.host.handoff`); so is every other HTTP connection except health checks and
the model list, which uvicorn's HTTP protocol serves here with the gateway's ASGI app (as it
does everything when no host is live).  A request head with an ``Origin`` outside
``server.allowed_origins`` is refused here first, upgrade or HTTP (serve/origins.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import uvicorn
from uvicorn.server import ServerState

from actors.errors import (
    APIError,
    OriginNotAllowed,
    RequestHeadTooLarge,
    RequestTimeout,
    ServerError,
    ServerShuttingDown,
)
from actors.host.handoff import RESPONSES_PATH
from actors.protocol import http_error_body

from .origins import OriginPolicy

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
# accept() failing for want of a descriptor or of memory, or for a connection reset while
# queued: nothing is wrong with the listener.
TRANSIENT_ACCEPT_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO}
)
ACCEPT_RETRY_S = 0.05
HEAD_TIMEOUT_S = 10.0  # for a connection's request head to arrive


def bind_socket(host: str, port: int) -> socket.socket:
    """The port's listening socket.  Replicas that join get it passed (serve/port_claim.py);
    ``SO_REUSEPORT`` lets one bind beside another while none can pass it (one leaving)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def request_headers(head: bytes) -> dict[str, str]:
    """Header names (lower-case) and values of a peeked request head."""
    headers = {}
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


REFUSE_TIMEOUT_S = 2.0


async def refuse(sock: socket.socket, status: int, body: dict, *, retry_after_s: int | None = None) -> None:
    """Answer a not-yet-upgraded request with an HTTP error and close (no socket opens).

    The request is read and discarded (within ``REFUSE_TIMEOUT_S``) before the close:
    closing a socket with unread input sends a reset, which can destroy the answer
    before the client reads it."""
    payload = json.dumps(body).encode()
    retry = f"Retry-After: {retry_after_s}\r\n" if retry_after_s is not None else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"{retry}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(REFUSE_TIMEOUT_S):
            await loop.sock_sendall(sock, head + payload)
            sock.shutdown(socket.SHUT_WR)
            while await loop.sock_recv(sock, 65536):
                pass
    sock.close()


def close_websocket(sock: socket.socket, code: int, reason: str) -> None:
    """Send a WebSocket close frame on a socket whose session actor is gone, and close it.
    (A frame the actor was writing when it died may be cut short: a client then sees a
    protocol error rather than this close.)"""
    payload = code.to_bytes(2, "big") + reason.encode()[:120]
    with contextlib.suppress(OSError):
        sock.send(bytes([0x88, len(payload)]) + payload)
    sock.close()


APPEND_MODE_HEADER = "x-responses-ws-mode"


def wants_append_mode(head: bytes, headers: dict[str, str]) -> bool:
    """Append-mode rollouts are opt-in per connection: ``?mode=append`` on the URL or the
    header ``X-Responses-WS-Mode: append`` (docs/append-mode.md)."""
    target = head.split(b"\r\n", 1)[0].split(b" ")[1] if b" " in head else b""
    query = target.split(b"?", 1)[1] if b"?" in target else b""
    return b"mode=append" in query.split(b"&") or headers.get(APPEND_MODE_HEADER, "").lower() == "append"


def is_responses_upgrade(head: bytes) -> bool:
    """Is this request head a WebSocket upgrade of the Responses endpoint?"""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"GET":
        return False
    path = parts[1].split(b"?", 1)[0].rstrip(b"/").decode("latin-1")
    if path != RESPONSES_PATH:
        return False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"upgrade" and value.strip().lower() == b"websocket":
            return True
    return False


LOCAL_PATHS = (b"/healthz", b"/readyz", b"/v1/models")


def serves_locally(head: bytes) -> bool:
    """Health checks and the model list stay on the gateway (cheap, always answered); every
    other HTTP connection goes to a session host, so HTTP mode's work never runs on the
    gateway's event loop."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    path = parts[1].split(b"?", 1)[0] if len(parts) == 3 else b""
    return any(path == p or path.startswith(p + b"/") for p in LOCAL_PATHS)


async def peek_head(sock: socket.socket, timeout: float = HEAD_TIMEOUT_S) -> bytes:
    """The request head (up to the blank line) without consuming it; b"" if the peer closed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        readable = loop.create_future()
        loop.add_reader(sock.fileno(), _set_once, readable)
        try:
            await asyncio.wait_for(readable, max(0.0, deadline - loop.time()))
        finally:
            loop.remove_reader(sock.fileno())
        data = sock.recv(MAX_HEAD, socket.MSG_PEEK)
        if not data or b"\r\n\r\n" in data or len(data) >= MAX_HEAD:
            return data
        await asyncio.sleep(0.001)  # partial head: more bytes are on their way


class Front:
    def __init__(
        self,
        listener: socket.socket,
        http_config: uvicorn.Config,
        handoff: Callable[[socket.socket, bytes], Awaitable[None]],
        handoff_http: Callable[[socket.socket], Awaitable[bool]],
        origins: OriginPolicy,
        *,
        on_refused: Callable[[int], None] | None = None,  # the status of each refusal sent here
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        self._listener = listener
        self._origins = origins
        self._on_refused = on_refused
        self._head_timeout_s = head_timeout_s
        self._closed = False
        self._http = http_config
        self._http.load()
        self._state = ServerState()
        self._handoff = handoff
        self._handoff_http = handoff_http
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Accept until closed.  Out of descriptors (``EMFILE``/``ENFILE``), the loop waits
        and tries again: the connection stays in the kernel's queue (taken by the port's
        other listeners, or by this one once a socket closes) instead of the listener dying."""
        self._accepting = asyncio.current_task()
        loop = asyncio.get_running_loop()
        short = False
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:
                if exc.errno not in TRANSIENT_ACCEPT_ERRORS:
                    raise
                if not short:
                    log.warning("accepting a connection failed (%s); retrying", os.strerror(exc.errno or 0))
                short = True
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            short = False
            self._dispatch_soon(sock)

    @property
    def dispatching(self) -> int:
        """Connections accepted and not yet served, handed over or refused."""
        return len(self._tasks)

    def _dispatch_soon(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.get_running_loop().create_task(self._dispatch(sock))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refuse(self, sock: socket.socket, exc: APIError) -> None:
        status, body = http_error_body(exc)
        if self._on_refused is not None:
            self._on_refused(status)
        await refuse(sock, status, body, retry_after_s=exc.retry_after_s)

    async def _dispatch(self, sock: socket.socket) -> None:
        """Every connection gets an answer: served, handed over, or refused with a typed
        HTTP error; closed without one only if the peer closed first."""
        try:
            try:
                head = await peek_head(sock, self._head_timeout_s)
            except TimeoutError:
                await self._refuse(sock, RequestTimeout(self._head_timeout_s))
                return
            if len(head) >= MAX_HEAD and b"\r\n\r\n" not in head:
                await self._refuse(sock, RequestHeadTooLarge(MAX_HEAD))
                return
            origin = request_headers(head).get("origin") if head else None
            if not self._origins.allows(origin):  # a web page not allowed: upgrade or HTTP alike
                await self._refuse(sock, OriginNotAllowed(origin or ""))
                return
            if head and self._closed:  # draining: the port's other listeners take the retry
                await self._refuse(sock, ServerShuttingDown())
                return
            if head and is_responses_upgrade(head):
                await self._handoff(sock, head)
                return
            if not head:
                sock.close()
                return
            if not serves_locally(head) and await self._handoff_http(sock):
                return
            # uvicorn types this as asyncio.Protocol; after Config.load() it is its HTTP protocol class
            protocol = self._http.http_protocol_class(  # type: ignore[call-arg]
                config=self._http, server_state=self._state, app_state={}
            )
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, sock)
        except Exception:
            log.exception("dispatching a connection failed")
            await refuse(sock, *http_error_body(ServerError()))

    def close(self) -> None:
        """Stop accepting connections.  Those already accepted go on, and the ones the
        kernel had queued for this listener are taken too: each is answered (refused with
        503 ``server_shutting_down`` and ``Retry-After``: the port's other listeners take
        the retry), never reset."""
        self._closed = True
        # The accept loop stops first: an event loop waiting on the listener holds it open
        # (uvloop, which Ray's actors run, counts a reference to the socket), so closing it
        # under a pending accept left it listening in the port's SO_REUSEPORT group, where it
        # took a share of new connections (a redeploy's reconnecting clients) and never
        # served them.
        if self._accepting is not None:
            self._accepting.cancel()
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._listener)
        # The listener is usually shared with the replicas that go on (serve/port_claim.py):
        # closing this descriptor leaves its queue to them.  Should this be the last one, the
        # close resets the connections the kernel queued (Linux moves them to another listener
        # of the port only with net.ipv4.tcp_migrate_req=1), so what is queued now is accepted
        # and answered first.
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # BlockingIOError: the queue is empty
                break
            sock.setblocking(False)
            self._dispatch_soon(sock)
        self._listener.close()

    async def drain_http(self, timeout_s: float) -> None:
        """Answer the connections still being dispatched, then let HTTP requests in flight
        finish; keep-alive connections close after them."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
        for protocol in list(self._state.connections):
            protocol.shutdown()
        if self._state.tasks:
            await asyncio.wait(list(self._state.tasks), timeout=timeout_s)


def _set_once(fut: asyncio.Future[None]) -> None:
    # A reader callback can fire again before it is removed.
    if not fut.done():
        fut.set_result(None)
