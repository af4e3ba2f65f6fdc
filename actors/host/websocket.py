"""One WebSocket on a handed-over socket: websockets' sans-I/O :class:`ServerProtocol` driven
by an ``asyncio.Protocol`` of the project's own, through the library's public methods only.

Bytes read go to ``receive_data``; of the events that come out, the upgrade request is
answered by the owner's hook, data frames are assembled into messages handed to the owner
with the time their first bytes arrived, pongs answer the keepalive pings (the protocol
answers pings and the close itself).  What is to be sent leaves in one transport write per
:meth:`WebSocket.flush`, so a batch of frames is one write.  The owner's data frames are
framed here (:mod:`actors.host.frames`) while no extension is negotiated, their payload's
pieces written as they are; with permessage-deflate the protocol frames them, compressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import cast

from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from .frames import CONTINUATION, TEXT, frame_header

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0  # for the peer to complete a closing handshake (a vanished one never does)
WRITE_LIMIT = 32768  # bytes buffered in the transport before the sender waits (pause_writing)
MAX_PENDING = 64  # messages held before the owner takes them; then reading pauses

Answer = Callable[["WebSocket", Request], Awaitable[Response]]  # the upgrade's response (101 accepts it)
Receive = Callable[[str | bytes, float], None]  # a message, and when its first bytes arrived


class WebSocket(asyncio.Protocol):
    """A server-side WebSocket: the upgrade answered by ``answer``, ``on_open`` called once
    it is accepted, messages handed to the receiver given to :meth:`receive`.

    A message's arrival is the ``clock()`` (``time.perf_counter``) of the read that brought its first
    bytes (a response's server time starts there, :mod:`actors.core.timings`): the read that
    completes its first frame, or the earliest one since a read that completed a frame,
    so bytes of a frame that follows another in the same read count from the next read."""

    def __init__(
        self,
        protocol: ServerProtocol,
        answer: Answer,
        on_open: Callable[[WebSocket], None],
        *,
        ping_interval: float | None,
        ping_timeout: float | None,
        close_timeout: float = CLOSE_TIMEOUT_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.protocol = protocol
        self._clock = clock
        self._answer = answer
        self._on_open = on_open
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        self.transport: asyncio.Transport | None = None
        self.accepted = False
        self.handshake_exc: Exception | None = None  # an answer hook that raised
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._receiver: Receive | None = None
        self._pending: list[tuple[str | bytes, float]] = []  # before a receiver is given
        self._since: float | None = None  # the first read of a frame not yet complete
        self._parts: list[bytes | bytearray | memoryview] = []  # the message being assembled
        self._text = False
        self._arrived = 0.0
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._pong: tuple[bytes, asyncio.Future[None]] | None = None
        self._abort_at: asyncio.TimerHandle | None = None
        self._answering: asyncio.Task[None] | None = None  # the upgrade's answer (kept referenced)
        self._out: list[bytes] = []  # what flush writes before the protocol's own (in order)

    # -- the owner's side
    def receive(self, receiver: Receive) -> None:
        """Hand every message, from now on and those held so far, to ``receiver``."""
        self._receiver = receiver
        pending, self._pending = self._pending, []
        for message, arrived in pending:
            receiver(message, arrived)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def send_text(self, data: bytes | Sequence[bytes], *, fin: bool = True) -> None:
        """Queue a text frame whose payload is ``data`` (or its parts joined; ``fin=False``:
        the first of a fragmented message); it leaves with the next :meth:`flush`."""
        self._send(TEXT, data, fin)

    def send_continuation(self, data: bytes | Sequence[bytes], *, fin: bool) -> None:
        self._send(CONTINUATION, data, fin)

    def _send(self, opcode: int, data: bytes | Sequence[bytes], fin: bool) -> None:
        self._check_open()
        parts = (data,) if isinstance(data, bytes) else data
        if self.protocol.extensions:  # permessage-deflate: the protocol compresses the payload whole
            payload = parts[0] if len(parts) == 1 else b"".join(parts)
            if opcode == TEXT:
                self.protocol.send_text(payload, fin)
            else:
                self.protocol.send_continuation(payload, fin)
            return
        out = self._out
        ahead = self.protocol.data_to_send()  # a pong or a ping queued before: it goes first
        if ahead:
            out += ahead
        out.append(frame_header(sum(map(len, parts)), opcode=opcode, fin=fin))
        out += [p for p in parts if p]  # an empty write would read as the end of the stream

    def flush(self) -> None:
        """Write what is to be sent, in one write: the frames (and their payloads' parts)
        handed to the transport as they are (``writelines``: uvloop, which Ray's actors run,
        sends them with one vectored write and copies none of them into one buffer first)."""
        writes = self.protocol.data_to_send()
        if self._out:
            writes, self._out = self._out + writes, []
        if not writes or self.transport is None:
            return
        data = [w for w in writes if w]
        if len(data) == 1:
            self.transport.write(data[0])
        elif data:
            self.transport.writelines(data)
        if len(data) < len(writes):  # the end of the stream: half-close
            if self.transport.can_write_eof():
                with contextlib.suppress(Exception):  # OSError, or uvloop's RuntimeError
                    self.transport.write_eof()
            else:
                self.transport.close()

    async def drained(self) -> None:
        """Return once the transport's buffer is below its limit again (or it is closed)."""
        if self.transport is not None and self.transport.is_closing():
            await asyncio.sleep(0)  # lets connection_lost run
        if self._paused and not self.closed.done():
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (unless it has begun) and wait until the socket is
        closed; a peer that does not answer within the close timeout is cut off."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self.flush()
            self._expect_close()
        await asyncio.shield(self.closed)

    def _check_open(self) -> None:
        if self.protocol.state is not State.OPEN:
            raise ConnectionClosed(self.protocol.close_rcvd, self.protocol.close_sent)

    def _expect_close(self) -> None:
        """Once the protocol expects the TCP connection to close, give the peer the close
        timeout to close it, then abort."""
        if self._abort_at is None and self.transport is not None and self.protocol.close_expected():
            self._abort_at = asyncio.get_running_loop().call_later(self._close_timeout, self.transport.abort)

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it
        self.transport.set_write_buffer_limits(WRITE_LIMIT)

    def data_received(self, data: bytes) -> None:
        read_at = self._clock()
        if self._since is None:
            self._since = read_at
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        self.flush()  # pongs, the close's echo
        self._expect_close()
        for event in events:
            if isinstance(event, Frame):
                self._frame(event, read_at)
            elif isinstance(event, Request):
                self._answering = asyncio.get_running_loop().create_task(self._upgrade(event))
        if events:
            self._since = None

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the protocol's state is CLOSED
        for handle in (self._keepalive, self._abort_at):
            if handle is not None:
                handle.cancel()
        self._paused = False
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def _wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- events out of the protocol
    async def _upgrade(self, request: Request) -> None:
        """Answer the upgrade (reading paused meanwhile: the client sends no frame before
        the answer); once accepted, keepalive pings start and the owner is told."""
        assert self.transport is not None
        self.transport.pause_reading()
        try:
            response = await self._answer(self, request)
        except Exception as exc:
            log.exception("answering a WebSocket upgrade failed")
            self.handshake_exc = exc
            response = self.protocol.reject(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "Failed to open a WebSocket connection.\nSee server log for more information.\n",
            )
        if self.closed.done():  # the peer went away meanwhile
            return
        self.protocol.send_response(response)
        self.flush()
        self._expect_close()  # a refused upgrade: the server closes the connection
        if not self.transport.is_closing():
            self.transport.resume_reading()
        if response.status_code == 101 and self.protocol.state is State.OPEN:
            self.accepted = True
            if self._ping_interval is not None:
                self._keepalive = asyncio.get_running_loop().create_task(
                    self._keep_alive(self._ping_interval)
                )
            self._on_open(self)

    def _frame(self, frame: Frame, read_at: float) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:  # a message begins
            self._arrived = self._since if self._since is not None else read_at
            self._since = None  # a frame after it in the same read arrived with that read
            self._text = opcode is Opcode.TEXT
            self._parts = [frame.data]
        elif opcode is Opcode.CONT:
            self._parts.append(frame.data)
        else:
            pong = self._pong
            if opcode is Opcode.PONG and pong is not None and frame.data == pong[0] and not pong[1].done():
                pong[1].set_result(None)
            return  # pings and the close are the protocol's own
        if frame.fin:
            self._message()

    def _message(self) -> None:
        data = bytes(self._parts[0]) if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = []
        message: str | bytes = data
        if self._text:
            try:
                message = data.decode()
            except UnicodeDecodeError:
                self.protocol.fail(CloseCode.INVALID_DATA, "invalid UTF-8")
                self.flush()
                self._expect_close()
                return
        if self._receiver is not None:
            self._receiver(message, self._arrived)
            return
        self._pending.append((message, self._arrived))
        if len(self._pending) >= MAX_PENDING and self.transport is not None:
            self.transport.pause_reading()

    async def _keep_alive(self, interval: float) -> None:
        """A ping every ``interval`` seconds; no pong within the ping timeout fails the
        connection (1011), which ends its generations."""
        loop = asyncio.get_running_loop()
        while self.protocol.state is State.OPEN:
            await asyncio.sleep(interval)
            if self.protocol.state is not State.OPEN:
                return
            pong = loop.create_future()
            self._pong = (os.urandom(4), pong)
            self.protocol.send_ping(self._pong[0])
            self.flush()
            if self._ping_timeout is None:
                continue
            try:
                await asyncio.wait_for(pong, self._ping_timeout)
            except TimeoutError:
                if self.protocol.state is State.OPEN:
                    self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                    self.flush()
                    self._expect_close()
                return
