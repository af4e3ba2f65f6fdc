"""The connection state a WebSocket carries on a session host, from its socket's upgrade to
its socket's end: a new state, one restored from the cluster store (resume on any node), or
one a resume takes over from its parked (or still open) previous socket; and, when the
socket ends, what becomes of it (:mod:`actors.host.aftermath` decides, :meth:`Lifecycle.settle`
carries it out).  A :class:`~actors.host.connection.Connection` has its own, shorter
lifecycle (:mod:`actors.host.connection_lifecycle`) for the one socket it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from store.connection_states import Claimed

from ..config import SessionConfig
from ..core.driver import QUIET, Driver
from ..core.inputs import Disconnected, StateRestored
from ..core.session import Session
from ..errors import InvalidResumeToken
from .aftermath import OUTCOME, Aftermath, SocketEnd, aftermath
from .connection import Connection
from .continuity import HostContinuity
from .handoff import Handoff, Outcome
from .resume import Held, ResumeRegistry
from .websocket import WebSocket

SUPERSEDE_WAIT_S = 1.0  # how long a superseded socket gets to close cleanly

NewSession = Callable[[str, str, bool], Session]  # (conn_id, owner, append_mode)


class Lifecycle:
    """The connection states of one host's WebSockets: those it holds (``registry``, parked
    ones included) and, with resume on any node, their copies in the cluster store
    (``continuity``)."""

    def __init__(
        self,
        config: SessionConfig,
        registry: ResumeRegistry,
        continuity: HostContinuity | None,
        new_session: NewSession,
    ) -> None:
        self._config = config
        self._registry = registry
        self._continuity = continuity
        self._new_session = new_session

    async def attach(
        self, ws: WebSocket, handoff: Handoff, secret: str, claimed: Claimed | None
    ) -> tuple[Held, bool] | None:
        """The connection state ``ws`` carries from now on, and whether ``ws`` brought it here:
        a new one, one ``claimed`` from the cluster store (both brought), or a resumed one
        taken over from its previous socket (closed first); ``None`` (and ``ws`` closed, 1008)
        if its resume token expired since the upgrade."""
        created = handoff.resume is None or claimed is not None
        if created:
            held = self._new_held(handoff, secret, claimed)
        else:
            assert handoff.resume is not None
            try:
                held = self._registry.check(handoff.conn_id, handoff.resume, handoff.owner)
            except InvalidResumeToken:
                await ws.close(1008, "resume token expired")  # between the upgrade and now
                return None
            self._registry.claim(held)
            old = held.socket
            if old is not None:  # the old socket may be dead without the server knowing yet
                held.superseded = True
                await _close_within(old, 1000, "resumed on another connection")
                await held.detached.wait()
        held.socket, held.superseded, held.detached = ws, False, asyncio.Event()
        return held, created

    def _new_held(self, handoff: Handoff, secret: str, claimed: Claimed | None) -> Held:
        """A new connection's state, or (``claimed``) one taken from the cluster store: its
        conversations rebuilt from the items kept there (actors.core.resumable)."""
        session = self._new_session(handoff.conn_id, handoff.owner, handoff.append_mode)
        loop = asyncio.get_running_loop()
        continuity = self._continuity
        wall = continuity.wall() if continuity is not None else 0.0
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
        self._registry.add(held)
        if continuity is not None:
            continuity.track(held, secret)
        return held

    async def settle(self, ws: WebSocket, conn: Connection, held: Held, *, draining: bool) -> Outcome:
        """``ws`` has ended and ``conn`` is closed: the session hears it, and its state is
        parked, handed on, moved or dropped (:mod:`actors.host.aftermath`)."""
        Driver(held.session, QUIET).drive(Disconnected())  # asks for nothing
        held.socket = None
        continuity = self._continuity
        rcvd = ws.protocol.close_rcvd
        how = aftermath(
            SocketEnd(
                superseded=held.superseded,
                continuity=continuity is not None,
                fenced=held.fenced,
                client_closed=rcvd is not None and rcvd.code == 1000 and not conn.server_ended,
                server_ended=conn.server_ended,
                draining=draining,
                parking=self._registry.enabled,
            )
        )
        if how is Aftermath.MOVED:
            held.detached.set()
        elif how is Aftermath.PARKED:
            self._registry.park(held)
            if continuity is not None:
                continuity.parked(held)
        else:
            if continuity is not None and how is Aftermath.ENDED:
                continuity.ended(held)  # for good: deleted from the store too
            elif continuity is not None and how is Aftermath.HANDED_ON:
                continuity.dropped(held)  # written before the 1012 (drain): resumable elsewhere
            self._registry.discard(held)
        if continuity is not None:
            await continuity.settled(held)
        return OUTCOME[how]


async def close_taken_over(registry: ResumeRegistry, held: Held, code: int, reason: str) -> None:
    """Another holder took ``held`` (:mod:`actors.host.continuity`): its socket closes with
    ``code``, or, parked, it is dropped from ``registry``."""
    if held.socket is None:
        registry.discard(held)
    else:
        await _close_within(held.socket, code, reason)


async def _close_within(ws: WebSocket, code: int, reason: str) -> None:
    """Close ``ws`` cleanly if it manages within :data:`SUPERSEDE_WAIT_S`, else abort it."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ws.close(code, reason), SUPERSEDE_WAIT_S)
    if ws.transport is not None and not ws.transport.is_closing():
        ws.transport.abort()
