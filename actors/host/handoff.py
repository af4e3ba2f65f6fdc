"""Both sides of the socket handoff between a gateway and a session host on one node.

The gateway accepts a TCP connection, sees a WebSocket upgrade for ``/v1/responses`` and
passes the socket's file descriptor to the host over a Unix socket (``SCM_RIGHTS``), with
the upgrade request still unread in the kernel buffer, plus a small JSON :class:`Handoff`
saying which connection state the socket carries.  A file descriptor cannot cross nodes, so
hosts run on their gateway's node (docs/architecture.md).  No Ray here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

RESPONSES_PATH = "/v1/responses"  # the only path whose upgrades are handed over


@dataclass(frozen=True, slots=True)
class Handoff:
    """What the gateway sends along with a socket: which connection state it carries
    (``resume``: the secret of a parked state to take back, else a new one)."""

    sock_id: str
    conn_id: str
    owner: str
    append_mode: bool = False
    resume: str | None = None


def handoff_path(actor_name: str) -> str:
    """Where the actor named ``actor_name`` receives sockets (Linux abstract namespace: shared
    by the processes of one node, nothing to clean up when the actor dies)."""
    return f"\0responses-ws-{actor_name}"


# ----------------------------------------------------------------------------- gateway side


def send_socket(uds_path: str, handoff: Handoff, sock: socket.socket) -> None:
    """Hand ``sock`` to the host at ``uds_path``.  The caller keeps its own copy of the
    descriptor (to close the socket with 1011 should the host die)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as uds:
        uds.connect(uds_path)
        socket.send_fds(uds, [json.dumps(asdict(handoff)).encode()], [sock.fileno()])


# ----------------------------------------------------------------------------- host side


class HandoffReceiver:
    """Receives handed-over sockets at ``path``; :meth:`take` waits for one by its id (the
    socket and the call announcing it may arrive in either order)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1024)
        self._listener.setblocking(False)
        self._arrived: dict[str, asyncio.Future[tuple[socket.socket, Handoff]]] = {}
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    def _future(self, sock_id: str) -> asyncio.Future[tuple[socket.socket, Handoff]]:
        return self._arrived.setdefault(sock_id, asyncio.get_running_loop().create_future())

    async def take(self, sock_id: str, timeout: float = 30.0) -> tuple[socket.socket, Handoff]:
        """The socket ``sock_id`` and its handoff, once it has arrived."""
        try:
            return await asyncio.wait_for(self._future(sock_id), timeout=timeout)
        finally:
            self._arrived.pop(sock_id, None)

    async def _accept(self) -> None:
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
                    handoff = Handoff(**json.loads(msg))
                    fut = self._future(handoff.sock_id)
                    if fut.done():
                        socket.socket(fileno=fds[0]).close()
                    else:
                        fut.set_result((socket.socket(fileno=fds[0]), handoff))
            except (OSError, TypeError, ValueError):
                log.exception("socket handoff failed")
            finally:
                uds.close()

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        self._listener.close()


def _set_once(fut: asyncio.Future[None]) -> None:
    # A reader callback can fire again before it is removed.
    if not fut.done():
        fut.set_result(None)
