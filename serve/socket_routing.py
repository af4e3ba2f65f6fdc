"""Where the gateway sends an accepted socket: a WebSocket upgrade is checked (API key,
drain, resume token), admitted against the limits (serve/admission.py), given a session host
(a pool slot, or the host a resume token names) and handed over that host's link; an HTTP
connection goes to a host of HTTP mode, or is served by the gateway when none is live.  A
refusal is an HTTP answer on the upgrade (400/401/429/503, ``Retry-After`` where it helps):
no socket opens.  serve/gateway.py wires it."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from actors.errors import APIError, InvalidResumeToken, ServerError, ServerShuttingDown, TooManyConnections
from actors.host.handoff import Handoff, Link, SocketKind
from actors.host.resume import RESUME_HEADER, parse_token
from actors.protocol import http_error_body

from .admission import Admission
from .auth import KeyRing
from .front import refuse, request_headers, wants_append_mode
from .gateway_metrics import GatewayMetrics
from .pool import ActorPool, NoCapacity

log = logging.getLogger(__name__)


class SocketRouter:
    def __init__(
        self,
        keys: KeyRing,
        admission: Admission[socket.socket, Link],
        pool: ActorPool,
        metrics: GatewayMetrics,
        *,
        any_node: bool,
        draining: Callable[[], object],
        link_to: Callable[[str], Link],
    ) -> None:
        self._keys = keys
        self._admission = admission
        self._pool = pool
        self._metrics = metrics
        self._any_node = any_node  # resume on any node: states kept in the cluster store
        self._draining = draining  # why this replica drains, if it does
        self._link_to = link_to  # the link to the host a resume token names

    async def websocket(self, sock: socket.socket, head: bytes) -> None:
        """Hand a WebSocket upgrade (its request head peeked, unread) to a session host, or
        refuse it."""
        headers = request_headers(head)
        token = headers.get(RESUME_HEADER)
        try:
            owner = self._keys.owner(headers)
            if self._draining():
                raise ServerShuttingDown()
            resume = parse_token(token) if token is not None else None
            # We keep our copy of the socket while the host serves it: should the host die,
            # the client still gets a clean close (1011) rather than a dead TCP connection.
            if resume is not None and resume[0] is None and not self._any_node:
                raise InvalidResumeToken()
            entry = self._admission.admit(owner, sock)
            try:
                if resume is None or resume[0] is None:
                    # A new connection, or a resume on any node (its state is in the cluster
                    # store: whichever host gets it takes the state from there).
                    entry.lease = await self._pool.acquire()
                    if self._draining():  # the drain began while it waited for a host
                        raise ServerShuttingDown()
                    link, conn_id, secret = entry.lease.host.handle.link, entry.lease.conn_id, None
                    if resume is not None:
                        _, conn_id, secret = resume
                        entry.conn_id = conn_id
                else:
                    name, conn_id, secret = resume
                    assert name is not None
                    link = self._link_to(name)
            except BaseException:
                self._admission.failed(entry.sock_id)
                raise
        except NoCapacity as exc:
            await self.refuse(
                sock,
                *http_error_body(
                    TooManyConnections(
                        "No session host can take the connection now; retry later.", per_key=False
                    )
                ),
                retry_after_s=exc.retry_after_s,
            )
            return
        except APIError as exc:  # 400/401/429/503 on the upgrade: no socket opens
            await self.refuse(sock, *http_error_body(exc), retry_after_s=exc.retry_after_s)
            return
        entry.link = link
        try:
            await link.send(
                Handoff(
                    entry.sock_id,
                    SocketKind.WEBSOCKET,
                    conn_id,
                    owner,
                    wants_append_mode(head, headers),
                    secret,
                ),
                sock.fileno(),
            )
        except OSError as exc:  # the host is gone
            self._admission.failed(entry.sock_id)
            log.warning("handing a socket over failed: %r", exc)
            self._metrics.handoff_failed()
            await self.refuse(sock, *http_error_body(InvalidResumeToken() if resume else ServerError()))

    async def refuse(
        self, sock: socket.socket, status: int, body: dict, *, retry_after_s: int | None = None
    ) -> None:
        self._metrics.refused(status)
        await refuse(sock, status, body, retry_after_s=retry_after_s)

    async def http(self, sock: socket.socket) -> bool:
        """Hand an HTTP connection to a host (:meth:`ActorPool.acquire_http`); ``False``:
        no host is live, serve it here."""
        lease = None if self._draining() else await self._pool.acquire_http()
        if lease is None:
            return False
        sock_id = self._admission.http_opened(lease.host)
        try:
            await lease.host.handle.link.send(
                Handoff(sock_id, SocketKind.HTTP, keep_alive=lease.keep_alive), sock.fileno()
            )
        except OSError:
            self._admission.failed(sock_id)
            return False
        sock.close()  # the host has its own descriptor
        return True
