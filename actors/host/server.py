"""The session host terminates its clients' WebSockets itself.

Sockets arrive from the gateway by handoff (:mod:`.handoff`) with the upgrade request still
unread; from then on client frames reach the session with no Ray hop at all; the only hop
per turn is the one to inference (docs/architecture.md has the measurements behind this).
No Ray in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Event
from websockets.server import ServerProtocol

from store.continuity import Claimed

from ..config import SessionConfig
from ..core.session import Session
from ..core.timings import METADATA_KEY, Report
from ..errors import ConnectionLimitReached, InvalidResumeToken, ServerError, ServerShuttingDown
from ..protocol import EventEncoder, ServerEvent, encode, error_event, http_error_body
from .connection import SERVICE_RESTART, Connection
from .continuity import HostContinuity
from .drain import CloseSchedule, DrainPlan, Phase
from .handoff import RESPONSES_PATH, Handoff, Outcome
from .resume import RESUME_HEADER, Held, ResumeRegistry, make_any_node_token, make_token, new_secret
from .subprotocols import select_subprotocol

log = logging.getLogger(__name__)

SUPERSEDE_WAIT_S = 1.0  # how long a superseded socket gets to close cleanly
# A peer that stopped reading (vanished, or a failed keepalive ping) cannot complete the
# closing handshake: give up on it after this long, which ends its generations.
CLOSE_TIMEOUT_S = 2.0


class _HandoffServer(Server):
    """websockets' connection bookkeeping without an ``asyncio.Server``: sockets arrive by
    handoff, not by ``accept``; the server serves for as long as the actor lives."""

    def is_serving(self) -> bool:
        return True


class SessionSocket(ServerConnection):
    """A WebSocket connection that arrived by handoff: it knows which connection state it
    carries, the secret of that state's resume token, and whether its upgrade succeeded."""

    def __init__(
        self,
        protocol: ServerProtocol,
        server: Server,
        handoff: Handoff,
        *,
        ping_interval: float | None,
        ping_timeout: float | None,
    ) -> None:
        super().__init__(
            protocol,
            server,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            close_timeout=CLOSE_TIMEOUT_S,
            max_queue=64,
        )
        self.handoff = handoff
        self.secret = handoff.resume or new_secret()
        self.accepted = False
        self.claimed: Claimed | None = None  # the state a resume took from the cluster store
        # When each data message not yet read began to arrive (time.perf_counter()): a
        # response's server time starts at its create's first bytes, not once the library
        # has read and assembled them (actors.core.timings).
        self.arrivals: deque[float] = deque()
        self._frame_since: float | None = None  # the first bytes of a frame still being read
        self._read_at = 0.0

    def data_received(self, data: bytes) -> None:
        self._read_at = time.perf_counter()
        if self._frame_since is None:
            self._frame_since = self._read_at
        super().data_received(data)  # calls process_event for each whole frame in it
        self._frame_since = self._read_at if self.protocol.reader.buffer else None

    def send_data(self) -> None:
        """As websockets' own, but the frames queued since the last write leave in one: a
        batch of events is one write and, mostly, one wake-up of the client."""
        writes = self.protocol.writes
        if len(writes) > 1 and all(writes):  # no end-of-stream marker among them
            self.protocol.writes = [b"".join(writes)]
        super().send_data()

    def process_event(self, event: Event) -> None:
        if isinstance(event, Frame) and event.opcode in (Opcode.TEXT, Opcode.BINARY):  # a message begins
            self.arrivals.append(self._frame_since or self._read_at)
            self._frame_since = None  # a frame after it in the same read arrived with that read
        super().process_event(event)


def _session_socket(ws: ServerConnection) -> SessionSocket:
    """The handlers' connection: the factory makes every one a :class:`SessionSocket`."""
    assert isinstance(ws, SessionSocket)
    return ws


class SocketServer:
    """Receives handed-over sockets and runs one WebSocket connection on each.

    ``serve(sock, handoff)`` ends with the socket and says what became of its connection state
    (an :class:`~actors.host.handoff.Outcome`; a parked state waits for a resume, see
    :mod:`actors.host.resume`)."""

    def __init__(
        self,
        config: SessionConfig,
        actor_name: str,
        new_session: Callable[[str, str, bool], Session],
        connect: Callable[[Session], Connection],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._name = actor_name
        self._new_session = new_session
        self._connect = connect
        self._server: Server | None = None
        self._ended: dict[str, asyncio.Future[Outcome]] = {}
        self._live: dict[str, Connection] = {}
        self.registry = ResumeRegistry(config.resume_grace_s)
        self._draining = False
        # Resume on any node (actors.host.continuity): set by the host before start() when
        # the cluster store is Redis and resume is on.
        self.continuity: HostContinuity | None = None
        self.created: dict[str, Held] = {}  # sock_id → the state its socket brought here
        self._clock = clock
        self._schedule: CloseSchedule | None = None  # the drain's pace, once it began
        self._ready: deque[Connection] = deque()  # drained, waiting for their batch
        self._wake = asyncio.Event()  # a connection became ready, or the plan changed
        self._drained: asyncio.Future[None] | None = None

    def start(self) -> None:
        # No opening-handshake timeout here: the gateway handed the socket over with a
        # complete request head already received, so nothing is awaited from the client, and
        # websockets' timeout would only close a socket unanswered on a host that was slow.
        self._server = _HandoffServer(
            lambda ws: self._handle(_session_socket(ws)),
            process_request=lambda ws, request: self._check_request(_session_socket(ws), request),
            process_response=lambda ws, request, response: self._add_token(
                _session_socket(ws), request, response
            ),
            open_timeout=None,
        )

    async def serve(self, sock: socket.socket, handoff: Handoff) -> Outcome:
        """Run the WebSocket on the handed-over socket ``sock`` until it closes."""
        loop = asyncio.get_running_loop()
        sock_id = handoff.sock_id
        ended = self._ended[sock_id] = loop.create_future()
        cfg = self._config

        extensions = (
            [ServerPerMessageDeflateFactory(compress_settings={"level": cfg.deflate_level})]
            if accepts_deflate(cfg.deflate, sock)
            else []
        )

        def factory() -> SessionSocket:
            assert self._server is not None
            protocol = ServerProtocol(
                extensions=extensions, select_subprotocol=select_subprotocol, max_size=cfg.max_frame_bytes
            )
            return SessionSocket(
                protocol,
                self._server,
                handoff,
                ping_interval=cfg.ping_interval_s,
                ping_timeout=cfg.ping_timeout_s,
            )

        try:
            _, ws = await loop.connect_accepted_socket(factory, sock)
            await asyncio.wait([ended, ws.connection_lost_waiter], return_when=asyncio.FIRST_COMPLETED)
            if ended.done() or ws.accepted:
                return await ended
            # The upgrade was answered with an error, or never completed.
            if ws.protocol.handshake_exc is not None:
                log.warning("WebSocket opening handshake failed: %r", ws.protocol.handshake_exc)
            return Outcome.REFUSED
        finally:
            self._ended.pop(sock_id, None)

    async def _check_request(self, ws: SessionSocket, request: Request) -> Response | None:
        if request.path.split("?", 1)[0].rstrip("/") != RESPONSES_PATH:
            return ws.respond(404, "Not Found\n")
        if self._draining:  # handed over as the drain began: another replica takes the retry
            shutting_down = ServerShuttingDown()
            return _json_response(*http_error_body(shutting_down), retry_after_s=shutting_down.retry_after_s)
        handoff = ws.handoff
        if handoff.resume is not None and self.continuity is not None:
            ws.claimed = await self.continuity.claim(handoff.conn_id, handoff.resume, handoff.owner)
            if ws.claimed is None:
                return _json_response(*http_error_body(InvalidResumeToken()))
        elif handoff.resume is not None:
            try:
                self.registry.check(handoff.conn_id, handoff.resume, handoff.owner)
            except InvalidResumeToken as exc:
                return _json_response(*http_error_body(exc))
        return None

    def _add_token(self, ws: SessionSocket, request: Request, response: Response) -> None:
        if response.status_code == 101:
            ws.accepted = True
            if self.continuity is not None:
                response.headers[RESUME_HEADER] = make_any_node_token(ws.handoff.conn_id, ws.secret)
            elif self.registry.enabled:
                handoff = ws.handoff
                response.headers[RESUME_HEADER] = make_token(self._name, handoff.conn_id, ws.secret)

    async def _attach(self, ws: SessionSocket) -> Held | None:
        """The connection state this socket carries: a new one, or a resumed one taken
        over from its parked (or still live) previous socket."""
        handoff = ws.handoff
        if handoff.resume is None or ws.claimed is not None:
            return self._new_held(ws, ws.claimed)
        try:
            held = self.registry.check(handoff.conn_id, handoff.resume, handoff.owner)
        except InvalidResumeToken:
            await ws.close(1008, "resume token expired")  # between the upgrade and now
            return None
        self.registry.claim(held)
        old = held.socket
        if old is not None:  # the old socket may be dead without the server knowing yet
            held.superseded = True
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                await asyncio.wait_for(old.close(1000, "resumed on another connection"), SUPERSEDE_WAIT_S)
            if not old.transport.is_closing():
                old.transport.abort()
            await held.detached.wait()
        return held

    def _new_held(self, ws: SessionSocket, claimed: Claimed | None) -> Held:
        """A new connection's state, or (``claimed``) one taken from the cluster store: its
        conversations rebuilt from the items kept there (actors.core.continuity)."""
        handoff = ws.handoff
        session = self._new_session(handoff.conn_id, handoff.owner, handoff.append_mode)
        loop = asyncio.get_running_loop()
        wall = self.continuity.wall() if self.continuity is not None else 0.0
        if claimed is None:
            wall_deadline = wall + self._config.connection_lifetime_s
            epoch = 1
        else:
            wall_deadline, epoch = claimed.deadline, claimed.epoch
            if claimed.state is not None:
                session.restore(claimed.state)
        deadline = loop.time() + (
            wall_deadline - wall if claimed is not None else self._config.connection_lifetime_s
        )
        held = Held(handoff.conn_id, handoff.owner, ws.secret, session, deadline)
        held.epoch, held.wall_deadline = epoch, wall_deadline
        self.registry.add(held)
        self.created[handoff.sock_id] = held
        if self.continuity is not None:
            self.continuity.track(held, ws.secret)
        return held

    async def let_go(self, held: Held, code: int, reason: str) -> None:
        """Another holder took ``held`` (actors.host.continuity): its socket closes with
        ``code``, or, parked, it is dropped here."""
        ws = held.socket
        if ws is None:
            self.registry.discard(held)
            return
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            await asyncio.wait_for(ws.close(code, reason), SUPERSEDE_WAIT_S)
        if not ws.transport.is_closing():
            ws.transport.abort()

    async def _handle(self, ws: SessionSocket) -> None:
        handoff = ws.handoff
        held = await self._attach(ws)
        if held is None:
            self._end(handoff.sock_id, Outcome.REFUSED)
            return
        held.socket, held.superseded, held.detached = ws, False, asyncio.Event()
        conn = self._live[handoff.sock_id] = self._connect(held.session)
        if self.continuity is not None:
            conn.checkpoint = functools.partial(self.continuity.checkpoint, held)
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._send_loop(ws, conn))
        timer = loop.call_at(held.lifetime_deadline, self._expire, conn)
        if self._draining:
            conn.drain(self._ready_to_close)
        try:
            async for message in ws:
                conn.feed(message, ws.arrivals.popleft() if ws.arrivals else None)
        except ConnectionClosed:
            pass
        finally:
            timer.cancel()
            # Cancels any running generation, so its inference batch slot is freed.
            await conn.close()
            with contextlib.suppress(BaseException):
                await sender
            del self._live[handoff.sock_id]
            held.session.on_disconnect()
            held.socket = None
            outcome = self._after(ws, conn, held)
            if self.continuity is not None:
                await self.continuity.settled(held)
            self._end(handoff.sock_id, outcome)

    def _after(self, ws: SessionSocket, conn: Connection, held: Held) -> Outcome:
        """What becomes of the state when its socket has ended."""
        continuity = self.continuity
        if held.superseded:
            held.detached.set()
            return Outcome.MOVED
        if continuity is not None and held.fenced:  # another holder has it: drop it here only
            self.registry.discard(held)
            return Outcome.CLOSED
        rcvd = ws.protocol.close_rcvd
        client_closed = rcvd is not None and rcvd.code == 1000 and not conn.server_ended
        if continuity is not None and (client_closed or (conn.server_ended and not self._draining)):
            continuity.ended(held)  # for good: deleted from the store too
            self.registry.discard(held)
            return Outcome.CLOSED
        if continuity is not None and self._draining:
            continuity.dropped(held)  # written before the 1012 (drain): resumable elsewhere
            self.registry.discard(held)
            return Outcome.CLOSED
        if self.registry.enabled and not conn.server_ended and not self._draining:
            self.registry.park(held)
            if continuity is not None:
                continuity.parked(held)
            return Outcome.PARKED
        self.registry.discard(held)
        return Outcome.CLOSED

    def _end(self, sock_id: str, outcome: Outcome) -> None:
        ended = self._ended.get(sock_id)
        if ended is not None and not ended.done():
            ended.set_result(outcome)

    def _expire(self, conn: Connection) -> None:
        minutes = self._config.connection_lifetime_s / 60
        conn.finish_with(encode(error_event(ConnectionLimitReached(minutes))))

    async def _send_loop(self, ws: SessionSocket, conn: Connection) -> None:
        encoder = EventEncoder()  # the echoed instructions and tools encoded once while unchanged
        mark = secrets.token_hex(16)  # where a terminal frame's figures go (no client text spells it)
        try:
            async for batch in conn.events():
                rest: list[ServerEvent | str | Tail] = list(batch)
                try:
                    while rest:
                        # The frames queued in one context leave in one write as it exits.
                        async with ws.send_context():
                            rest = _queue(ws, rest, conn, encoder, mark)
                finally:
                    _message_sent(ws)  # also if the socket closed between a message's fragments
            # events() ended without a client close: the server ends the connection
            # (1000, or 1012 when draining for a shutdown or a redeploy).
            await _answer_late(ws, conn, encoder, mark)
            await ws.close(conn.close_code or 1000, conn.close_reason)
        except ConnectionClosed:
            pass

    @property
    def idle(self) -> bool:
        """No socket is open and no connection state is held."""
        return not self._live and len(self.registry) == 0

    async def _close_drained(self, conns: list[Connection]) -> None:
        """Close these sockets with 1012; with resume on any node, each state is written as
        it is now first, and stays in the cluster store to be resumed elsewhere."""
        if not conns:
            return
        if self.continuity is not None:
            held = {id(h.session): h for h in self.registry.held() if h.socket is not None}
            going = [held[id(c.session)] for c in conns if id(c.session) in held]
            await asyncio.gather(*(self.continuity.handed_off(h) for h in going), return_exceptions=True)
        for conn in conns:
            conn.end(*SERVICE_RESTART)

    async def wait_gone(self, conn_id: str) -> None:
        await self.registry.wait_gone(conn_id)

    async def drain(self, plan: DrainPlan | float) -> None:
        """Shutdown: refuse sockets that still arrive (503, ``Retry-After``), drop parked
        states, refuse creates (``server_shutting_down``) and let responses in flight
        finish; close each socket with 1012 (:data:`~actors.host.connection.SERVICE_RESTART`)
        after its last terminal event, in the plan's batches once its hold is over; at its
        cut-off close whatever is still open (:mod:`actors.host.drain`).  A number: a plan
        with that cut-off, no hold, no batches.  Called again while draining, the stricter
        plan wins (a node's deadline learnt later) and it returns when the drain is done."""
        if isinstance(plan, int | float):
            plan = DrainPlan(hold_s=0.0, budget_s=float(plan), batch_size=1 << 30, batch_interval_s=1.0)
        if self._drained is not None:
            assert self._schedule is not None
            self._schedule.tighten(plan)
            self._wake.set()
            await asyncio.shield(self._drained)
            return
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await self._drain(plan)
        finally:
            self._drained.set_result(None)

    async def _drain(self, plan: DrainPlan) -> None:
        self._draining = True
        schedule = self._schedule = CloseSchedule(plan, self._clock)
        self.registry.discard_parked()  # kept in the cluster store, if on: resumable elsewhere
        for conn in list(self._live.values()):
            conn.drain(self._ready_to_close)
        while self._live:
            if schedule.phase() is Phase.CUT_OFF:
                await self._close_drained(list(self._live.values()))
                break
            await self._close_drained([self._ready.popleft() for _ in range(schedule.take(len(self._ready)))])
            self._wake.clear()
            pending = [f for f in self._ended.values() if not f.done()]
            if not pending:
                break
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wake.wait()), *pending]
            # Nothing waits for a batch: wake for a drained socket, an end, or the cut-off.
            timeout = schedule.next_change_s() if self._ready else schedule.remaining_s()
            await asyncio.wait(waits, timeout=max(timeout, 0.001), return_when=asyncio.FIRST_COMPLETED)
            waits[0].cancel()
        pending = [f for f in self._ended.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)

    def _ready_to_close(self, conn: Connection) -> None:
        """A draining connection's last response ended: it closes with its batch."""
        self._ready.append(conn)
        self._wake.set()


LATE_WAIT_S = 1.0  # for the frames a client sent just before the close to be read


async def _answer_late(ws: SessionSocket, conn: Connection, encoder: EventEncoder, mark: str) -> None:
    """Before a drain's close frame leaves, every data frame the client sent that has
    arrived is read and answered: ``ws.arrivals`` holds one entry per message received and
    not yet read by the socket's handler, which feeds each to the connection (a create gets
    ``server_shutting_down``, :meth:`Connection.take_late`).  Frames still on the wire when
    the close leaves are the client's to resend: they got no ``response.created``."""
    deadline = ws.loop.time() + LATE_WAIT_S
    while True:
        late: list[ServerEvent | str | Tail] = list(conn.take_late())
        try:
            while late:
                async with ws.send_context():
                    late = _queue(ws, late, conn, encoder, mark)
        finally:
            _message_sent(ws)
        # Let the loop read what the kernel holds for this socket (data_received) and the
        # handler feed it, then look again.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if conn.has_late:
            continue
        if not ws.arrivals or ws.loop.time() >= deadline:
            return


def _encode_or_error(event: ServerEvent, encoder: EventEncoder) -> str:
    """An event that cannot be encoded (a bug) is replaced by ``server_error`` rather than
    killing the sender and leaving the socket silent."""
    try:
        return encoder(event)
    except Exception:
        log.exception("could not encode a %s event", getattr(event, "type", "?"))
        return encode(error_event(ServerError()))


Tail = Callable[[], str]  # the rest of a terminal frame whose first part is out (:func:`_figures_last`)


def _queue(
    ws: SessionSocket,
    batch: list[ServerEvent | str | Tail],
    conn: Connection,
    encoder: EventEncoder,
    mark: str,
) -> list[ServerEvent | str | Tail]:
    """Queue the batch's frames on ``ws``'s protocol, up to and including the first part of a
    terminal frame that carries figures (:func:`_figures_last`); what is left to queue once
    that has been written, the rest of that frame first.  Its two parts are the fragments of
    one message, marked in progress as ``ws.send`` marks its own (a close between them fails
    the connection rather than cut the message short)."""
    protocol = ws.protocol
    for i, item in enumerate(batch):
        if isinstance(item, str):
            protocol.send_text(item.encode())
        elif callable(item):
            try:
                protocol.send_continuation(item().encode(), fin=True)
            finally:
                _message_sent(ws)
        elif (report := conn.deferred(item)) is not None:
            head, tail = _figures_last(item, report, conn, encoder, mark)
            if tail is None:
                protocol.send_text(head.encode())
                continue
            protocol.send_text(head.encode(), fin=False)
            ws.send_in_progress = ws.loop.create_future()
            return [tail, *batch[i + 1 :]]
        else:
            protocol.send_text(_encode_or_error(conn.outgoing(item), encoder).encode())
    return []


def _message_sent(ws: SessionSocket) -> None:
    """The fragmented message in progress, if any, is over (sent whole, or the socket is gone)."""
    if ws.send_in_progress is not None:
        ws.send_in_progress.set_result(None)
        ws.send_in_progress = None


def _figures_last(
    event: ServerEvent, report: Report, conn: Connection, encoder: EventEncoder, mark: str
) -> tuple[str, Tail | None]:
    """A terminal event whose client asked for the server's figures, as the fragments of one
    message (RFC 6455 §5.4): the text up to the figures, and what makes the rest — called once
    that part has been encoded, compressed and written, it takes the figures, which go with
    the few bytes after them (the response's metadata comes after its output and its echoed
    instructions and tools).  So the figures hold the terminal frame's own work but its last
    bytes (docs/performance.md).  No rest (``None``): the text is the whole frame (the event
    could not be encoded; the server_error frame in its place)."""
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
        assert report.into is not None
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
