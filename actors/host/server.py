"""The session host terminates its clients' WebSockets itself.

Sockets arrive from the gateway by handoff (:mod:`.handoff`) with the upgrade request still
unread; from then on client frames reach the session with no Ray hop at all; the only hop
per turn is the one to inference (docs/architecture.md has the measurements behind this).
Each socket's upgrade is answered by :mod:`.upgrade`, its connection state comes and goes by
:mod:`.lifecycle`, its frames leave through a :class:`~actors.host.sender.Sender`; this
module runs them, and a drain's closes in batches (:mod:`.drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from store.connection_states import Claimed

from ..config import SessionConfig
from ..core.session import Session
from ..errors import ConnectionLimitReached
from ..protocol import encode, error_event
from .connection import Connection
from .connection_lifecycle import SERVICE_RESTART
from .continuity import HostContinuity
from .drain import CloseSchedule, DrainPlan, Phase
from .handoff import Handoff, Outcome
from .lifecycle import Lifecycle, NewSession
from .resume import Held, ResumeRegistry, new_secret
from .sender import Sender, deflate_extensions
from .subprotocols import select_subprotocol
from .terminal_writes import Checkpoint
from .upgrade import Upgrade
from .websocket import WebSocket

log = logging.getLogger(__name__)

Connect = Callable[[Session, Checkpoint | None], Connection]  # (session, checkpoint)


@dataclass(frozen=True, slots=True)
class Served:
    """What became of a handed-over socket's connection state; ``created``: the state it
    brought (or took) here, if any (a parked one holds a host slot until it is gone)."""

    outcome: Outcome
    created: Held | None


class SocketServer:
    """Runs one WebSocket connection on each handed-over socket
    (:class:`~actors.host.websocket.WebSocket`) of the host ``actor_name``: ``serve(sock,
    handoff)`` ends with the socket.  ``registry`` holds the host's connection states (parked
    ones wait for a resume, :mod:`actors.host.resume`); ``continuity``, with resume on any
    node, keeps them in the cluster store too."""

    def __init__(
        self,
        config: SessionConfig,
        actor_name: str,
        new_session: NewSession,
        connect: Connect,
        *,
        registry: ResumeRegistry | None = None,
        continuity: HostContinuity | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._connect = connect
        self._registry = registry if registry is not None else ResumeRegistry(config.resume_grace_s)
        self._continuity = continuity
        self._upgrade = Upgrade(actor_name, self._registry, continuity, lambda: self._draining)
        self._lifecycle = Lifecycle(config, self._registry, continuity, new_session)
        self._ended: dict[str, asyncio.Future[Outcome]] = {}
        self._created: dict[str, Held] = {}  # sock_id → the state its socket brought here
        self._live: dict[str, Connection] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._draining = False
        self._clock = clock
        self._schedule: CloseSchedule | None = None  # the drain's pace, once it began
        self._ready: deque[Connection] = deque()  # drained, waiting for their batch
        self._wake = asyncio.Event()  # a connection became ready, or the plan changed
        self._drained: asyncio.Future[None] | None = None

    async def serve(self, sock: socket.socket, handoff: Handoff) -> Served:
        """Run the WebSocket on the handed-over socket ``sock`` until it closes.  No
        opening-handshake timeout: the gateway handed the socket over with a complete
        request head already received, so nothing is awaited from the client."""
        loop = asyncio.get_running_loop()
        sock_id = handoff.sock_id
        ended = self._ended[sock_id] = loop.create_future()
        cfg = self._config
        extensions = deflate_extensions(cfg, sock)
        secret = handoff.resume or new_secret()
        claimed: Claimed | None = None  # the state a resume took from the cluster store

        async def answer(ws: WebSocket, request: Request) -> Response:
            nonlocal claimed
            response, claimed = await self._upgrade.answer(ws, handoff, secret, request)
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
                return Served(await ended, self._created.get(sock_id))
            # The upgrade was answered with an error, or never completed.
            failed = ws.handshake_exc or ws.protocol.handshake_exc
            if failed is not None:
                log.warning("WebSocket opening handshake failed: %r", failed)
            return Served(Outcome.REFUSED, self._created.get(sock_id))
        finally:
            self._ended.pop(sock_id, None)
            self._created.pop(sock_id, None)

    async def _run(self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None) -> None:
        try:
            await self._handle(ws, handoff, secret, claimed)
        except Exception:
            log.exception("a WebSocket's handler failed")
            await ws.close(1011)

    async def _handle(self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None) -> None:
        attached = await self._lifecycle.attach(ws, handoff, secret, claimed)
        if attached is None:
            self._end(handoff.sock_id, Outcome.REFUSED)
            return
        held, created = attached
        if created:
            self._created[handoff.sock_id] = held
        continuity = self._continuity
        conn = self._live[handoff.sock_id] = self._connect(
            held.session, functools.partial(continuity.checkpoint, held) if continuity is not None else None
        )
        loop = asyncio.get_running_loop()
        sender = loop.create_task(Sender(ws, conn).run())
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
            outcome = await self._lifecycle.settle(ws, conn, held, draining=self._draining)
            self._end(handoff.sock_id, outcome)

    def _end(self, sock_id: str, outcome: Outcome) -> None:
        ended = self._ended.get(sock_id)
        if ended is not None and not ended.done():
            ended.set_result(outcome)

    def _expire(self, conn: Connection) -> None:
        minutes = self._config.connection_lifetime_s / 60
        conn.finish_with(encode(error_event(ConnectionLimitReached(minutes))))

    @property
    def idle(self) -> bool:
        """No socket is open and no connection state is held."""
        return not self._live and len(self._registry) == 0

    async def _close_drained(self, conns: list[Connection]) -> None:
        """Close these sockets with 1012; with resume on any node, each state is written as
        it is now first, and stays in the cluster store to be resumed elsewhere."""
        if not conns:
            return
        if self._continuity is not None:
            held = {id(h.session): h for h in self._registry.held() if h.socket is not None}
            going = [held[id(c.session)] for c in conns if id(c.session) in held]
            await asyncio.gather(*(self._continuity.handed_off(h) for h in going), return_exceptions=True)
        for conn in conns:
            conn.end(*SERVICE_RESTART)

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
        self._registry.discard_parked()  # kept in the cluster store, if on: resumable elsewhere
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
