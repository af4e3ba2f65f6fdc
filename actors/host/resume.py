"""Resumable connections: opt-in, beyond the reference API (docs/reliability.md).

With ``session.resume_grace_s > 0`` the upgrade response of every WebSocket carries a resume
token in the header ``x-responses-ws-resume-token``.  When the socket ends and the server
did not end it, the connection's state (its session: lanes, cached ``store:false``
responses) stays parked in the session actor's memory for the grace window.  An upgrade
that presents the token in the same header, with the same API key, within the window gets
that state back on the new socket; a live socket still holding it is closed (1000) first.
Responses in flight when the old socket ended are cancelled, not replayed.

The token names the actor holding the state (so any gateway on its node can route the new
socket there), the connection, and a random secret checked in constant time.

With the cluster store on Redis the state is also kept there at each turn boundary, sealed
with the secret (:mod:`actors.host.continuity`), and the token (``rws2.<conn>.<secret>``)
names only the connection: any host on any node can take it.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from dataclasses import dataclass, field

from ..core.driver import QUIET, Driver
from ..core.inputs import Released
from ..core.session import Session
from ..errors import InvalidResumeToken
from .websocket import WebSocket

RESUME_HEADER = "x-responses-ws-resume-token"
_VERSION = "rws1"
_VERSION_ANY_NODE = "rws2"


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def make_token(actor_name: str, conn_id: str, secret: str) -> str:
    return f"{_VERSION}.{actor_name}.{conn_id}.{secret}"


def make_any_node_token(conn_id: str, secret: str) -> str:
    """A token for a state kept in the cluster store: it names no actor."""
    return f"{_VERSION_ANY_NODE}.{conn_id}.{secret}"


def parse_token(token: str) -> tuple[str | None, str, str]:
    """``(actor_name, conn_id, secret)`` of a presented token (``actor_name`` is ``None`` for
    a token that names only the connection, :func:`make_any_node_token`);
    :class:`InvalidResumeToken` when it is not one of ours."""
    parts = token.strip().split(".")
    if len(parts) == 3 and parts[0] == _VERSION_ANY_NODE and all(parts[1:]):
        return None, parts[1], parts[2]
    if len(parts) != 4 or parts[0] != _VERSION or not all(parts[1:]):
        raise InvalidResumeToken()
    return parts[1], parts[2], parts[3]


@dataclass(eq=False)
class Held:
    """One connection's state across the sockets that carry it."""

    conn_id: str
    owner: str
    secret: str
    session: Session
    lifetime_deadline: float  # loop time: the lifetime limit counts from the first socket
    socket: WebSocket | None = None  # the WebSocket carrying it now, if any
    superseded: bool = False  # a resume took over the live socket
    detached: asyncio.Event = field(default_factory=asyncio.Event)  # the live socket let go
    expiry: asyncio.TimerHandle | None = None
    # Kept in the cluster store (actors.host.continuity): this holder's fencing epoch, the
    # lifetime deadline on the wall clock, and whether another holder has taken it.
    epoch: int = 0
    wall_deadline: float = 0.0
    fenced: bool = False
    gone: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ResumeRegistry:
    """The connection states one actor holds, live or parked for ``grace_s``."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._held: dict[str, Held] = {}

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0

    def __len__(self) -> int:
        return len(self._held)

    def add(self, held: Held) -> None:
        self._held[held.conn_id] = held

    def held(self) -> list[Held]:
        return list(self._held.values())

    def check(self, conn_id: str, secret: str, owner: str) -> Held:
        """The state a resume may take, or :class:`InvalidResumeToken` (one answer for an
        unknown id, a wrong secret and another key's token)."""
        held = self._held.get(conn_id)
        if held is None or not hmac.compare_digest(held.secret, secret) or held.owner != owner:
            raise InvalidResumeToken()
        return held

    def park(self, held: Held) -> None:
        """The socket ended: keep the state for the grace window."""
        held.expiry = asyncio.get_running_loop().call_later(self.grace_s, self.discard, held)

    def claim(self, held: Held) -> None:
        """A resume took the state: it is no longer counting down."""
        if held.expiry is not None:
            held.expiry.cancel()
            held.expiry = None

    def discard(self, held: Held) -> None:
        self.claim(held)
        if self._held.get(held.conn_id) is held:
            del self._held[held.conn_id]
        if not held.gone.done():  # a state another holder took is no longer the registry's
            Driver(held.session, QUIET).drive(Released())  # asks for nothing
            held.gone.set_result(None)

    def discard_parked(self) -> None:
        for held in [h for h in self._held.values() if h.socket is None]:
            self.discard(held)

    async def wait_gone(self, conn_id: str) -> None:
        held = self._held.get(conn_id)
        if held is not None:
            await asyncio.shield(held.gone)
