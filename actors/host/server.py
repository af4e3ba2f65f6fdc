"""The session host terminates its clients' WebSockets itself.

Sockets arrive from the gateway by handoff (:mod:`.handoff`) with the upgrade request still
unread; from then on client frames reach the session with no Ray hop at all; the only hop
per turn is the one to inference (docs/architecture.md has the measurements behind this).
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
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from store.connection_states import Claimed

from ..config import SessionConfig
from ..core.driver import QUIET, Driver
from ..core.inputs import Disconnected, StateRestored
from ..core.session import Session
from ..core.timings import METADATA_KEY, Report
from ..errors import ConnectionLimitReached, InvalidResumeToken, ServerError, ServerShuttingDown
from ..protocol import EventEncoder, ServerEvent, encode, error_event, http_error_body
from .aftermath import Aftermath, SocketEnd, aftermath
from .connection import Connection
from .connection_lifecycle import SERVICE_RESTART
from .continuity import HostContinuity
from .drain import CloseSchedule, DrainPlan, Phase
from .handoff import RESPONSES_PATH, Handoff, Outcome
from .resume import RESUME_HEADER, Held, ResumeRegistry, make_any_node_token, make_token, new_secret
from .subprotocols import select_subprotocol
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
        clock: Callable[[], float] = time.monotonic,
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

        claimed: Claimed | None = None  # the state a resume took from the cluster store

        async def answer(ws: WebSocket, request: Request) -> Response:
            nonlocal claimed
            refused, claimed = await self._check_request(ws, handoff, request)
            response = refused or ws.protocol.accept(request)
            if response.status_code == 101:
                if self.continuity is not None:
                    response.headers[RESUME_HEADER] = make_any_node_token(handoff.conn_id, secret)
                elif self.registry.enabled:
                    response.headers[RESUME_HEADER] = make_token(self._name, handoff.conn_id, secret)
            return response

        def on_open(ws: WebSocket) -> None:
            task = loop.create_task(self._run(ws, handoff, secret, claimed))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

        def factory() -> WebSocket:
            protocol = ServerProtocol(
                extensions=extensions, select_subprotocol=select_subprotocol, max_size=cfg.max_frame_bytes
            )
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

    async def _check_request(
        self, ws: WebSocket, handoff: Handoff, request: Request
    ) -> tuple[Response | None, Claimed | None]:
        """The upgrade's refusal, if any, and the state a resume took from the cluster store."""
        if request.path.split("?", 1)[0].rstrip("/") != RESPONSES_PATH:
            return ws.protocol.reject(404, "Not Found\n"), None
        if self._draining:  # handed over as the drain began: another replica takes the retry
            shutting = ServerShuttingDown()
            return _json_response(*http_error_body(shutting), retry_after_s=shutting.retry_after_s), None
        if handoff.resume is not None and self.continuity is not None:
            claimed = await self.continuity.claim(handoff.conn_id, handoff.resume, handoff.owner)
            if claimed is None:
                return _json_response(*http_error_body(InvalidResumeToken())), None
            return None, claimed
        if handoff.resume is not None:
            try:
                self.registry.check(handoff.conn_id, handoff.resume, handoff.owner)
            except InvalidResumeToken as exc:
                return _json_response(*http_error_body(exc)), None
        return None, None

    async def _attach(
        self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None
    ) -> Held | None:
        """The connection state this socket carries: a new one, or a resumed one taken
        over from its parked (or still live) previous socket."""
        if handoff.resume is None or claimed is not None:
            return self._new_held(handoff, secret, claimed)
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

    def _new_held(self, handoff: Handoff, secret: str, claimed: Claimed | None) -> Held:
        """A new connection's state, or (``claimed``) one taken from the cluster store: its
        conversations rebuilt from the items kept there (actors.core.resumable)."""
        session = self._new_session(handoff.conn_id, handoff.owner, handoff.append_mode)
        loop = asyncio.get_running_loop()
        wall = self.continuity.wall() if self.continuity is not None else 0.0
        if claimed is None:
            wall_deadline = wall + self._config.connection_lifetime_s
            epoch = 1
        else:
            wall_deadline, epoch = claimed.deadline, claimed.epoch
            if claimed.state is not None:
                Driver(session, QUIET).drive(StateRestored(claimed.state))  # evictions at most
        deadline = loop.time() + (
            wall_deadline - wall if claimed is not None else self._config.connection_lifetime_s
        )
        held = Held(handoff.conn_id, handoff.owner, secret, session, deadline)
        held.epoch, held.wall_deadline = epoch, wall_deadline
        self.registry.add(held)
        self.created[handoff.sock_id] = held
        if self.continuity is not None:
            self.continuity.track(held, secret)
        return held

    async def close_taken_over(self, held: Held, code: int, reason: str) -> None:
        """Another holder took ``held`` (actors.host.continuity): its socket closes with
        ``code``, or, parked, it is dropped here."""
        ws = held.socket
        if ws is None:
            self.registry.discard(held)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ws.close(code, reason), SUPERSEDE_WAIT_S)
        if ws.transport is not None and not ws.transport.is_closing():
            ws.transport.abort()

    async def _run(self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None) -> None:
        try:
            await self._handle(ws, handoff, secret, claimed)
        except Exception:
            log.exception("a WebSocket's handler failed")
            await ws.close(1011)

    async def _handle(self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None) -> None:
        held = await self._attach(ws, handoff, secret, claimed)
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
            ws.receive(conn.feed)  # each client message goes to the session as it is read
            await ws.closed
        finally:
            timer.cancel()
            # Cancels any running generation, so its inference batch slot is freed.
            await conn.close()
            with contextlib.suppress(BaseException):
                await sender
            del self._live[handoff.sock_id]
            Driver(held.session, QUIET).drive(Disconnected())  # asks for nothing
            held.socket = None
            outcome = self._after(ws, conn, held)
            if self.continuity is not None:
                await self.continuity.settled(held)
            self._end(handoff.sock_id, outcome)

    def _after(self, ws: WebSocket, conn: Connection, held: Held) -> Outcome:
        """What becomes of the state when its socket has ended (:mod:`actors.host.aftermath`)."""
        continuity = self.continuity
        rcvd = ws.protocol.close_rcvd
        how = aftermath(
            SocketEnd(
                superseded=held.superseded,
                continuity=continuity is not None,
                fenced=held.fenced,
                client_closed=rcvd is not None and rcvd.code == 1000 and not conn.server_ended,
                server_ended=conn.server_ended,
                draining=self._draining,
                parking=self.registry.enabled,
            )
        )
        if how is Aftermath.MOVED:
            held.detached.set()
            return Outcome.MOVED
        if how is Aftermath.PARKED:
            self.registry.park(held)
            if continuity is not None:
                continuity.parked(held)
            return Outcome.PARKED
        if continuity is not None and how is Aftermath.ENDED:
            continuity.ended(held)  # for good: deleted from the store too
        elif continuity is not None and how is Aftermath.HANDED_ON:
            continuity.dropped(held)  # written before the 1012 (drain): resumable elsewhere
        self.registry.discard(held)
        return Outcome.CLOSED

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


async def _answer_late(ws: WebSocket, conn: Connection, encoder: EventEncoder, mark: str) -> None:
    """Before a drain's close frame leaves, every data frame the client sent that has
    arrived is answered: each message goes to the connection as it is read (a create gets
    ``server_shutting_down``, :meth:`Connection.take_late_answers`), and the loop is let read what
    the kernel holds for this socket until a look finds nothing new (for up to
    :data:`LATE_WAIT_S`).  Frames still on the wire when the close leaves are the client's
    to resend: they got no ``response.created``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LATE_WAIT_S
    while True:
        _send(ws, conn.take_late_answers(), conn, encoder, mark)
        # Let the loop read what the kernel holds for this socket (data_received feeds it).
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if not conn.has_late:
            return
        if loop.time() >= deadline:
            _send(ws, conn.take_late_answers(), conn, encoder, mark)
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


def _send(
    ws: WebSocket, batch: Sequence[ServerEvent | str], conn: Connection, encoder: EventEncoder, mark: str
) -> None:
    """Send a batch of frames, in one write, except a terminal frame that carries figures
    (:func:`_figures_last`): its first part leaves with the frames before it, then the rest
    of it with the frames after.  Nothing is awaited in between, so no other frame or a
    close comes between the two fragments of its message."""
    for item in batch:
        if isinstance(item, str):
            ws.send_text(item.encode())
        elif (report := conn.figures_to_restamp(item)) is not None:
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
        conn.restamp(report)
        return text, None

    def rest() -> str:
        conn.restamp(report)  # writes the figures into the metadata
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
