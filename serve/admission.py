"""What the gateway holds for the connections it handed to session hosts, as pure state.

A WebSocket upgrade is admitted against the replica's limits (``server.max_connections``,
``server.max_connections_per_key``: :class:`TooManyConnections`), then handed to a host over
that host's link; the gateway keeps its copy of the socket until the host reports the end.
An end that keeps the state (:attr:`Outcome.keeps_slot`) parks its pool slot until the
host's ``StateGone``.  HTTP connections hold no slot, only the host's HTTP count.  A host's
death closes its sockets (the gateway sends 1011) and forgets its parked states.

No I/O: slots go back through the injected :class:`Slots` (the pool); the sockets to close
are returned.  serve/gateway.py applies them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from actors.errors import TooManyConnections
from actors.host.handoff import Outcome

from .pool import Host, Lease

S = TypeVar("S")  # the gateway's copy of a socket
L = TypeVar("L")  # a link to a session host


class Slots(Protocol):
    """Where slots go back (:class:`serve.pool.ActorPool`)."""

    def release(self, lease: Lease) -> None: ...

    def release_http(self, host: Host) -> None: ...


@dataclass(eq=False, slots=True)
class OpenSocket(Generic[S, L]):
    """An admitted WebSocket: whose it is, the gateway's copy of its descriptor (to close it
    with 1011 should the host die), the pool slot it holds (``None`` for a resume) and the
    link it was handed over (``None`` until chosen)."""

    sock_id: str
    owner: str
    sock: S
    lease: Lease | None = None
    link: L | None = None
    conn_id: str = ""  # the connection state it carries, when not its lease's (a resume on any node)


class Admission(Generic[S, L]):
    def __init__(
        self, slots: Slots, *, max_connections: int, max_connections_per_key: int, prefix: str
    ) -> None:
        self._slots = slots
        self._max = max_connections
        self._max_per_key = max_connections_per_key
        self._prefix = prefix
        self._ids = itertools.count()
        self._per_owner: Counter[str] = Counter()
        self._sockets: dict[str, OpenSocket[S, L]] = {}  # admitted WebSockets by sock_id
        # conn_id → the slots of states parked for a resume, with the link of the host holding
        # each (a connection resumed on any node may be parked on two hosts for a moment).
        self._parked: dict[str, list[tuple[L | None, Lease]]] = {}
        self._http: dict[str, Host] = {}  # sock_id → the host serving that HTTP connection

    @property
    def open_connections(self) -> int:
        """Admitted WebSockets, handed over or being handed over."""
        return len(self._sockets)

    @property
    def http_connections(self) -> int:
        """HTTP-mode connections with a request being served on a session host."""
        return len(self._http)

    # ------------------------------------------------------------------ WebSockets
    def admit(self, owner: str, sock: S) -> OpenSocket[S, L]:
        """Count a WebSocket for ``owner``, or refuse it (:class:`TooManyConnections`).
        Until it is handed over, :meth:`failed` undoes it."""
        if len(self._sockets) >= self._max:
            raise TooManyConnections("The server is at its connection limit; retry later.", per_key=False)
        if self._per_owner[owner] >= self._max_per_key:
            raise TooManyConnections(
                f"Too many open WebSocket connections for this API key ({self._max_per_key}).", per_key=True
            )
        entry: OpenSocket[S, L] = OpenSocket(f"{self._prefix}-s{next(self._ids)}", owner, sock)
        self._sockets[entry.sock_id] = entry
        self._per_owner[owner] += 1
        return entry

    def ended(self, sock_id: str, outcome: Outcome) -> S | None:
        """The host reports the socket ended: free its count and its slot, or park the slot
        if the state lives on.  Returns the gateway's copy of the socket, to close."""
        http_host = self._http.pop(sock_id, None)
        if http_host is not None:
            self._slots.release_http(http_host)
            return None
        entry = self._sockets.pop(sock_id, None)
        if entry is None:
            return None
        self._per_owner[entry.owner] -= 1
        if not self._per_owner[entry.owner]:
            del self._per_owner[entry.owner]
        if entry.lease is not None:
            if outcome.keeps_slot:  # the slot stays taken until the state is gone
                conn_id = entry.conn_id or entry.lease.conn_id
                self._parked.setdefault(conn_id, []).append((entry.link, entry.lease))
            else:
                self._slots.release(entry.lease)
        return entry.sock

    def failed(self, sock_id: str) -> None:
        """The connection never reached a host (no slot, no link, the handoff failed): undo
        its admission.  The caller answers the socket itself."""
        self.ended(sock_id, Outcome.REFUSED)

    def gone(self, conn_id: str, link: L | None = None) -> None:
        """The host (at the end of ``link``, if known) dropped a parked state: its slot is free."""
        parked = self._parked.get(conn_id, [])
        for i, (held_by, lease) in enumerate(parked):
            if link is None or held_by is None or held_by is link:
                del parked[i]
                self._slots.release(lease)
                break
        if not parked:
            self._parked.pop(conn_id, None)

    # ------------------------------------------------------------------ HTTP
    def http_opened(self, host: Host) -> str:
        """An HTTP connection goes to ``host`` (its HTTP count taken by the pool); its id.
        The host's end notice, or :meth:`failed`, gives the count back."""
        sock_id = f"{self._prefix}-h{next(self._ids)}"
        self._http[sock_id] = host
        return sock_id

    # ------------------------------------------------------------------ faults
    def host_died(self, link: L, host: Host | None) -> list[S]:
        """The link ended without our doing: the host is gone.  Its WebSockets end (their
        slots are released); its HTTP connections and parked states are forgotten (the pool
        forgets the host).  ``host`` is ``None`` for a host of another gateway.  Returns the
        sockets to close with 1011."""
        socks = []
        for entry in [e for e in self._sockets.values() if e.link is link]:
            self.ended(entry.sock_id, Outcome.CLOSED)
            socks.append(entry.sock)
        if host is not None:
            self._http = {k: h for k, h in self._http.items() if h is not host}
            kept = {
                k: [(h, lease) for h, lease in v if lease.host is not host] for k, v in self._parked.items()
            }
            self._parked = {k: v for k, v in kept.items() if v}
        return socks


__all__ = ["Admission", "OpenSocket", "Slots"]
