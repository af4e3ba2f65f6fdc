"""What leaves one WebSocket: the send loop that writes its connection's event batches
(encoded by an :class:`~actors.protocol.EventEncoder`, through the figures stage of
:mod:`actors.host.figures` while it has work), answers what arrived late before a drain's
close, and closes the socket; and the deflate policy (``session.deflate``) its upgrade
negotiates with.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
import socket
from collections.abc import Sequence

from websockets.exceptions import ConnectionClosed
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory

from ..config import SessionConfig
from ..errors import ServerError
from ..protocol import EventEncoder, ServerEvent, encode, error_event
from .connection import Connection
from .frames import PROCESS_PIECES
from .websocket import WebSocket

log = logging.getLogger(__name__)

LATE_WAIT_S = 1.0  # for the frames a client sent just before the close to be read


class Sender:
    """Writes ``conn``'s events to ``ws`` until the connection ends (:meth:`run`)."""

    def __init__(self, ws: WebSocket, conn: Connection) -> None:
        self._ws = ws
        self._conn = conn
        self._figures = conn.figures
        self._encoder = EventEncoder()  # the echoed instructions and tools encoded once while unchanged
        self._mark = secrets.token_hex(16)  # where a terminal frame's figures go (no client text spells it)

    async def run(self) -> None:
        """Each batch in one write, waiting for the client to read (backpressure: a client
        that reads slowly slows its sender); when the connection's events end without a
        client close, the server ends it: 1000, or 1012 when draining for a shutdown or a
        redeploy."""
        ws, conn = self._ws, self._conn
        try:
            async for batch in conn.events():
                self._send(batch)
                del batch  # sent: not kept while the client runs its tools (Outbox.batches)
                await ws.drained()
            await self._answer_late()
            await ws.close(conn.close_code or 1000, conn.close_reason)
        except ConnectionClosed:
            pass

    async def _answer_late(self) -> None:
        """Before a drain's close frame leaves, every data frame the client sent that has
        arrived is answered: each message goes to the connection as it is read (a create gets
        ``server_shutting_down``, :meth:`Connection.take_late_answers`), and the loop is let
        read what the kernel holds for this socket until a look finds nothing new (for up to
        :data:`LATE_WAIT_S`).  Frames still on the wire when the close leaves are the client's
        to resend: they got no ``response.created``."""
        conn = self._conn
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LATE_WAIT_S
        while True:
            self._send(conn.take_late_answers())
            # Let the loop read what the kernel holds for this socket (data_received feeds it).
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if not conn.has_late:
                return
            if loop.time() >= deadline:
                self._send(conn.take_late_answers())
                return

    def _send(self, batch: Sequence[ServerEvent | str]) -> None:
        """Send a batch of frames in one write, except a terminal frame that carries figures
        (:meth:`~actors.host.figures.Figures.split`): its first part leaves with the frames
        before it, then the rest of it with the frames after.  Nothing is awaited in between,
        so no other frame or a close comes between the two fragments of its message.  An
        event's echoed instructions and tools go as the bytes kept for them
        (:mod:`actors.host.frames`), copied into no larger buffer on the way."""
        ws, figures, as_bytes = self._ws, self._figures, PROCESS_PIECES.all
        for item in batch:
            if isinstance(item, str):
                ws.send_text(item.encode())
            elif not figures.pending or (report := figures.take(item)) is None:
                ws.send_text(as_bytes(self._encode(item)))  # no figures to take as it leaves
            else:
                head, tail = figures.split(item, report, self._encode, self._mark)
                if tail is None:
                    ws.send_text(as_bytes(head))
                    continue
                ws.send_text(as_bytes(head), fin=False)
                ws.flush()
                ws.send_continuation(tail().encode(), fin=True)
        ws.flush()

    def _encode(self, event: ServerEvent) -> list[str]:
        """The event's text in pieces (:meth:`~actors.protocol.EventEncoder.pieces`).  An
        event that cannot be encoded (a bug) is replaced by ``server_error`` rather than
        killing the sender and leaving the socket silent."""
        try:
            return self._encoder.pieces(event)
        except Exception:
            log.exception("could not encode a %s event", getattr(event, "type", "?"))
            return [encode(error_event(ServerError()))]


def deflate_extensions(config: SessionConfig, sock: socket.socket) -> list[ServerPerMessageDeflateFactory]:
    """The extensions a WebSocket on ``sock`` offers to negotiate: permessage-deflate at
    ``session.deflate_level`` if :func:`accepts_deflate`, else none."""
    if not accepts_deflate(config.deflate, sock):
        return []
    return [ServerPerMessageDeflateFactory(compress_settings={"level": config.deflate_level})]


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
