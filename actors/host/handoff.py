"""Both sides of the socket handoff between a gateway and a session host on one node.

The gateway accepts a TCP connection and peeks at its request head; it passes the socket's
file descriptor to a host over a *link* — one Unix ``SOCK_SEQPACKET`` connection per
(gateway, host) pair, kept open — with the request still unread in the kernel buffer, plus a
small JSON :class:`Handoff` saying what the socket carries.  The host answers on the same
link when a socket has ended (:class:`Ended`) and when a connection state it parked for a
resume is gone (:class:`StateGone`).  So admitting a connection costs the gateway no Ray call at
all; a link that reaches end-of-file means the host process died (its sockets then get a
1011 close from the gateway's copy of each descriptor).  A file descriptor cannot cross
nodes, so hosts run on their gateway's node (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

RESPONSES_PATH = "/v1/responses"  # the only path whose upgrades are handed over as WebSockets
MAX_MESSAGE = 4096


class SocketKind(enum.StrEnum):
    """What a handed-over socket carries."""

    WEBSOCKET = "websocket"
    HTTP = "http"


class Outcome(enum.StrEnum):
    """What became of a socket's connection state when the socket ended."""

    CLOSED = "closed"  # dropped
    PARKED = "parked"  # kept for a resume
    MOVED = "moved"  # a resume took it to a newer socket
    REFUSED = "refused"  # the upgrade was answered with an error, or never completed

    @property
    def keeps_slot(self) -> bool:
        """The state lives on: its host slot stays taken until the host says it is gone
        (:class:`StateGone`)."""
        return self in (Outcome.PARKED, Outcome.MOVED)


@dataclass(frozen=True, slots=True)
class Handoff:
    """What the gateway sends along with a socket: which connection state it carries
    (``resume``: the secret of a parked state to take back, else a new one); for HTTP,
    whether the connection stays open after its first request (``keep_alive``)."""

    sock_id: str
    kind: SocketKind = SocketKind.WEBSOCKET
    conn_id: str = ""
    owner: str = ""
    append_mode: bool = False
    resume: str | None = None
    keep_alive: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SocketKind(self.kind))  # as decoded: a string


@dataclass(frozen=True, slots=True)
class Ended:
    """Host → gateway: the socket ``sock_id`` has ended, with this :class:`Outcome`."""

    sock_id: str
    outcome: Outcome

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # as decoded: a string


@dataclass(frozen=True, slots=True)
class StateGone:
    """Host → gateway: the connection state ``conn_id`` (parked or moved) is gone."""

    conn_id: str


_MESSAGES: dict[str, type[Handoff] | type[Ended] | type[StateGone]] = {
    "handoff": Handoff,
    "ended": Ended,
    "gone": StateGone,
}


_NAMES = {kind: name for name, kind in _MESSAGES.items()}  # the wire's names, not the classes'


def _encode(message: Handoff | Ended | StateGone) -> bytes:
    return json.dumps({"msg": _NAMES[type(message)], **asdict(message)}).encode()


def _decode(data: bytes) -> Handoff | Ended | StateGone:
    raw = json.loads(data)
    return _MESSAGES[raw.pop("msg")](**raw)


def handoff_path(actor_name: str) -> str:
    """Where the host named ``actor_name`` takes links (Linux abstract namespace: shared by
    the processes of one node, nothing to clean up when the host dies)."""
    return f"\0responses-ws-{actor_name}"


class Link:
    """One end of a gateway–host link: messages, each with at most one descriptor."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.closed = False
        self._outbox: deque[Ended | StateGone] = deque()
        self._flushing: asyncio.Task[None] | None = None
        # One sender at a time: the peer's queue holds only a few messages
        # (net.unix.max_dgram_qlen), and a waiting sender watches the socket for room with
        # the event loop's one writer callback per descriptor.
        self._sending = asyncio.Lock()

    @classmethod
    def connect(cls, path: str) -> Link:
        """Gateway side: open a link to the host at ``path`` (:class:`OSError` if none)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    async def send(self, message: Handoff | Ended | StateGone, fd: int | None = None) -> None:
        """Send one message (with ``fd``); waits while the peer's queue is full."""
        async with self._sending:
            await self._send(_encode(message), fd)

    async def _send(self, data: bytes, fd: int | None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                if fd is None:
                    self._sock.send(data)
                else:
                    socket.send_fds(self._sock, [data], [fd])
                return
            except BlockingIOError:
                await _until(loop.add_writer, loop.remove_writer, self._sock.fileno())

    def notify(self, message: Ended | StateGone) -> None:
        """Host side: tell the gateway, in the background and in order; a link already gone
        is ignored (its gateway has stopped)."""
        if self.closed:
            return
        self._outbox.append(message)
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        with contextlib.suppress(OSError):
            while self._outbox and not self.closed:
                await self.send(self._outbox.popleft())

    async def messages(self) -> AsyncIterator[tuple[Handoff | Ended | StateGone, socket.socket | None]]:
        """Messages until the peer closes the link (or dies)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 1)
            except BlockingIOError:
                await _until(loop.add_reader, loop.remove_reader, self._sock.fileno())
                continue
            except OSError:
                data, fds = b"", []
            if not data:
                self.close()
                return
            sock = socket.socket(fileno=fds[0]) if fds else None
            try:
                message = _decode(data)
            except (ValueError, TypeError, KeyError):
                log.exception("a malformed message on a handoff link")
                if sock is not None:
                    sock.close()
                continue
            yield message, sock

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()


class HandoffReceiver:
    """Host side: takes links at ``path`` and calls ``on_socket(sock, handoff, link)`` for
    every socket that arrives (the link is where its :class:`Ended` notice goes)."""

    def __init__(
        self, path: str, on_socket: Callable[[socket.socket, Handoff, Link], Coroutine[Any, Any, None]]
    ) -> None:
        self.path = path
        self._on_socket = on_socket
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(path)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._sockets: set[asyncio.Task[None]] = set()  # one per socket being served
        self._links: set[asyncio.Task[None]] = set()  # one per link, reading it
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            self._spawn(self._links, self._serve_link(Link(sock)))

    async def _serve_link(self, link: Link) -> None:
        async for message, sock in link.messages():
            if isinstance(message, Handoff) and sock is not None:
                self._spawn(self._sockets, self._on_socket(sock, message, link))
            elif sock is not None:
                sock.close()

    def close(self) -> None:
        """Take no more links.  The links already open are read on until their gateway
        closes them: a socket sent before the gateway began to drain still arrives, and is
        answered (a draining host refuses it, typed) instead of dying unread."""
        if self._accepting is not None:
            self._accepting.cancel()
        with contextlib.suppress(ValueError, OSError):  # uvloop holds a listener with a pending accept open
            asyncio.get_running_loop().remove_reader(self._listener)
        self._listener.close()


async def _until(add: Callable[..., None], remove: Callable[[int], object], fd: int) -> None:
    """Wait for ``fd`` to be ready (readable or writable, by the ``add``/``remove`` pair of
    the event loop given)."""
    ready = asyncio.get_running_loop().create_future()
    add(fd, _set_once, ready)
    try:
        await ready
    finally:
        remove(fd)


def _set_once(fut: asyncio.Future[None]) -> None:
    # A reader/writer callback can fire again before it is removed.
    if not fut.done():
        fut.set_result(None)
