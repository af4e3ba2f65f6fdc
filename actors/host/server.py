"""The session host terminates its clients' WebSockets itself.

Sockets arrive from the gateway by handoff (:mod:`.handoff`) with the upgrade request still
unread; from then on client frames reach the session with no Ray hop at all; the only hop
per turn is the one to inference (docs/architecture.md has the measurements behind this).
No Ray in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import socket
from collections.abc import Callable
from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from ..config import SessionConfig
from ..core.session import Session
from ..core.timings import METADATA_KEY, Report
from ..errors import ConnectionLimitReached, InvalidResumeToken, ServerError, ServerShuttingDown
from ..protocol import EventEncoder, ServerEvent, encode, error_event, http_error_body
from .connection import SERVICE_RESTART, Connection
from .handoff import RESPONSES_PATH, Handoff, Outcome
from .resume import RESUME_HEADER, Held, ResumeRegistry, make_token, new_secret
from .websocket import WebSocket

log = logging.getLogger(__name__)

SUPERSEDE_WAIT_S = 1.0  # how long a superseded socket gets to close cleanly


class SocketServer:
    """Receives handed-over sockets and runs one WebSocket connection on each
    (:class:`~actors.host.websocket.WebSocket`).

    ``serve(sock, handoff)`` ends with the socket and says what became of its connection state
    (an :class:`~actors.host.handoff.Outcome`; a parked state waits for a resume, see
    :mod:`actors.host.resume`)."""

    def __init__(
        self,
        config: SessionConfig,
        actor_name: str,
        new_session: Callable[[str, str, bool], Session],
        connect: Callable[[Session], Connection],
    ) -> None:
        self._config = config
        self._name = actor_name
        self._new_session = new_session
        self._connect = connect
        self._ended: dict[str, asyncio.Future[Outcome]] = {}
        self._live: dict[str, Connection] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self.registry = ResumeRegistry(config.resume_grace_s)
        self._draining = False

    def start(self) -> None:
        """Nothing to set up: sockets arrive by handoff, not by ``accept``."""

    async def serve(self, sock: socket.socket, handoff: Handoff) -> Outcome:
        """Run the WebSocket on the handed-over socket ``sock`` until it closes.  No
        opening-handshake timeout: the gateway handed the socket over with a complete
        request head already received, so nothing is awaited from the client."""
        loop = asyncio.get_running_loop()
        sock_id = handoff.sock_id
        ended = self._ended[sock_id] = loop.create_future()
        cfg = self._config
        extensions = (
            [ServerPerMessageDeflateFactory(compress_settings={"level": cfg.deflate_level})]
            if accepts_deflate(cfg.deflate, sock)
            else []
        )
        secret = handoff.resume or new_secret()

        def answer(ws: WebSocket, request: Request) -> Response:
            response = self._check_request(ws, handoff, request) or ws.protocol.accept(request)
            if response.status_code == 101 and self.registry.enabled:
                response.headers[RESUME_HEADER] = make_token(self._name, handoff.conn_id, secret)
            return response

        def on_open(ws: WebSocket) -> None:
            task = loop.create_task(self._run(ws, handoff, secret))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

        def factory() -> WebSocket:
            protocol = ServerProtocol(extensions=extensions, max_size=cfg.max_frame_bytes)
            return WebSocket(
                protocol, answer, on_open, ping_interval=cfg.ping_interval_s, ping_timeout=cfg.ping_timeout_s
            )

        try:
            _, ws = await loop.connect_accepted_socket(factory, sock)
            await asyncio.wait([ended, ws.closed], return_when=asyncio.FIRST_COMPLETED)
            if ended.done() or ws.accepted:
                return await ended
            # The upgrade was answered with an error, or never completed.
            failed = ws.handshake_exc or ws.protocol.handshake_exc
            if failed is not None:
                log.warning("WebSocket opening handshake failed: %r", failed)
            return Outcome.REFUSED
        finally:
            self._ended.pop(sock_id, None)

    def _check_request(self, ws: WebSocket, handoff: Handoff, request: Request) -> Response | None:
        if request.path.split("?", 1)[0].rstrip("/") != RESPONSES_PATH:
            return ws.protocol.reject(404, "Not Found\n")
        if self._draining:  # handed over as the drain began: another replica takes the retry
            shutting_down = ServerShuttingDown()
            return _json_response(*http_error_body(shutting_down), retry_after_s=shutting_down.retry_after_s)
        if handoff.resume is not None:
            try:
                self.registry.check(handoff.conn_id, handoff.resume, handoff.owner)
            except InvalidResumeToken as exc:
                return _json_response(*http_error_body(exc))
        return None

    async def _attach(self, ws: WebSocket, handoff: Handoff, secret: str) -> Held | None:
        """The connection state this socket carries: a new one, or a resumed one taken
        over from its parked (or still live) previous socket."""
        if handoff.resume is None:
            session = self._new_session(handoff.conn_id, handoff.owner, handoff.append_mode)
            deadline = asyncio.get_running_loop().time() + self._config.connection_lifetime_s
            held = Held(handoff.conn_id, handoff.owner, secret, session, deadline)
            self.registry.add(held)
            return held
        try:
            held = self.registry.check(handoff.conn_id, handoff.resume, handoff.owner)
        except InvalidResumeToken:
            await ws.close(1008, "resume token expired")  # between the upgrade and now
            return None
        self.registry.claim(held)
        old = held.socket
        if old is not None:  # the old socket may be dead without the server knowing yet
            held.superseded = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(old.close(1000, "resumed on another connection"), SUPERSEDE_WAIT_S)
            if old.transport is not None and not old.transport.is_closing():
                old.transport.abort()
            await held.detached.wait()
        return held

    async def _run(self, ws: WebSocket, handoff: Handoff, secret: str) -> None:
        try:
            await self._handle(ws, handoff, secret)
        except Exception:
            log.exception("a WebSocket's handler failed")
            await ws.close(1011)

    async def _handle(self, ws: WebSocket, handoff: Handoff, secret: str) -> None:
        held = await self._attach(ws, handoff, secret)
        if held is None:
            self._end(handoff.sock_id, Outcome.REFUSED)
            return
        held.socket, held.superseded, held.detached = ws, False, asyncio.Event()
        conn = self._live[handoff.sock_id] = self._connect(held.session)
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._send_loop(ws, conn))
        timer = loop.call_at(held.lifetime_deadline, self._expire, conn)
        if self._draining:
            conn.drain()
        try:
            ws.receive(conn.feed)  # each client message goes to the session as it is read
            await ws.closed
        finally:
            timer.cancel()
            # Cancels any running generation, so its inference batch slot is freed.
            await conn.close()
            with contextlib.suppress(BaseException):
                await sender
            del self._live[handoff.sock_id]
            held.session.on_disconnect()
            held.socket = None
            if held.superseded:
                outcome = Outcome.MOVED
                held.detached.set()
            elif self.registry.enabled and not conn.server_ended and not self._draining:
                self.registry.park(held)
                outcome = Outcome.PARKED
            else:
                self.registry.discard(held)
                outcome = Outcome.CLOSED
            self._end(handoff.sock_id, outcome)

    def _end(self, sock_id: str, outcome: Outcome) -> None:
        ended = self._ended.get(sock_id)
        if ended is not None and not ended.done():
            ended.set_result(outcome)

    def _expire(self, conn: Connection) -> None:
        minutes = self._config.connection_lifetime_s / 60
        conn.finish_with(encode(error_event(ConnectionLimitReached(minutes))))

    async def _send_loop(self, ws: WebSocket, conn: Connection) -> None:
        encoder = EventEncoder()  # the echoed instructions and tools encoded once while unchanged
        mark = secrets.token_hex(16)  # where a terminal frame's figures go (no client text spells it)
        try:
            async for batch in conn.events():
                _send(ws, batch, conn, encoder, mark)
                await ws.drained()  # backpressure: a client that reads slowly slows its sender
            # events() ended without a client close: the server ends the connection
            # (1000, or 1012 when draining for a shutdown or a redeploy).
            await ws.close(conn.close_code or 1000, conn.close_reason)
        except ConnectionClosed:
            pass

    @property
    def idle(self) -> bool:
        """No socket is open and no connection state is held."""
        return not self._live and len(self.registry) == 0

    async def wait_gone(self, conn_id: str) -> None:
        await self.registry.wait_gone(conn_id)

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: refuse sockets that still arrive (503, ``Retry-After``), drop parked
        states, let responses in flight finish for up to ``timeout_s``, then close every
        socket with 1012 (:data:`~actors.host.connection.SERVICE_RESTART`)."""
        self._draining = True
        self.registry.discard_parked()
        for conn in list(self._live.values()):
            conn.drain()
        pending = list(self._ended.values())
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        for conn in list(self._live.values()):
            conn.end(*SERVICE_RESTART)
        pending = [f for f in self._ended.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)


def _encode_or_error(event: ServerEvent, encoder: EventEncoder) -> str:
    """An event that cannot be encoded (a bug) is replaced by ``server_error`` rather than
    killing the sender and leaving the socket silent."""
    try:
        return encoder(event)
    except Exception:
        log.exception("could not encode a %s event", getattr(event, "type", "?"))
        return encode(error_event(ServerError()))


Tail = Callable[[], str]  # the rest of a terminal frame whose first part is out (:func:`_figures_last`)


def _send(
    ws: WebSocket, batch: list[ServerEvent | str], conn: Connection, encoder: EventEncoder, mark: str
) -> None:
    """Send a batch of frames, in one write, except a terminal frame that carries figures
    (:func:`_figures_last`): its first part leaves with the frames before it, then the rest
    of it with the frames after.  Nothing is awaited in between, so no other frame or a
    close comes between the two fragments of its message."""
    for item in batch:
        if isinstance(item, str):
            ws.send_text(item.encode())
        elif (report := conn.deferred(item)) is not None:
            head, tail = _figures_last(item, report, conn, encoder, mark)
            if tail is None:
                ws.send_text(head.encode())
                continue
            ws.send_text(head.encode(), fin=False)
            ws.flush()
            ws.send_continuation(tail().encode(), fin=True)
        else:
            ws.send_text(_encode_or_error(conn.outgoing(item), encoder).encode())
    ws.flush()


def _figures_last(
    event: ServerEvent, report: Report, conn: Connection, encoder: EventEncoder, mark: str
) -> tuple[str, Tail | None]:
    """A terminal event whose client asked for the server's figures, as the fragments of one
    message (RFC 6455 §5.4): the text up to the figures, and what makes the rest — called once
    that part has been encoded, compressed and written, it takes the figures, which go with
    the few bytes after them (the response's metadata comes after its output and its echoed
    instructions and tools).  No rest (``None``): the text is the whole frame (the event
    could not be encoded; the server_error frame in its place).

    The one place figures are spliced into encoded JSON, by choice: the event is encoded
    once with ``mark`` where the figures go, and the figures replace it once the bulk is
    written, so they hold the terminal frame's own work but its last bytes
    (docs/performance.md).  Taken as data before the frame is encoded, they would leave
    its encoding, compression and write out of ``api_overhead``."""
    assert report.into is not None
    report.into[METADATA_KEY] = mark
    text = _encode_or_error(event, encoder)
    quoted = json.dumps(mark)
    at = text.find(quoted)
    if at < 0:
        conn.taken(report)
        return text, None

    def rest() -> str:
        conn.taken(report)  # writes the figures into the metadata
        return json.dumps(report.into[METADATA_KEY], ensure_ascii=False) + text[at + len(quoted) :]

    return text[:at], rest


def accepts_deflate(policy: str, sock: socket.socket) -> bool:
    """Whether a client's permessage-deflate offer is accepted (``session.deflate``): with
    ``auto``, not from a peer on the loopback, where inflating and deflating the echoed
    instructions and tools costs more than sending them as they are (docs/performance.md)."""
    if policy != "auto":
        return policy == "always"
    try:
        peer = ipaddress.ip_address(sock.getpeername()[0])
    except (OSError, ValueError, IndexError):  # not an IP socket, or already gone
        return True
    mapped = getattr(peer, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return not (mapped or peer).is_loopback


def _json_response(status: int, body: dict, *, retry_after_s: int | None = None) -> Response:
    payload = json.dumps(body).encode()
    headers = Headers(
        [("Content-Type", "application/json"), ("Content-Length", str(len(payload))), ("Connection", "close")]
    )
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return Response(status, HTTPStatus(status).phrase, headers, payload)
