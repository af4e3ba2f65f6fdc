"""The benchmarks' WebSocket client: one WebSocket-mode connection (``/v1/responses``).

:class:`ResponsesSocket` sends a client event and reads server events (JSON objects as
dicts), stamping each on arrival, until the answer ends (:data:`FINAL_EVENT_TYPES`, or a
caller's own ``until``); the :class:`Answer` holds them with the client-side timings.
Open one with
``sock = await connect(url)`` or ``async with connect(url) as sock:``.

Every WebSocket the lab opens goes through :func:`connect` (tests/test_layout.py checks it),
and what a kind catches of it is named here (:class:`ConnectionClosed`, :func:`close_code`,
the refusals of an upgrade): no other client module imports ``websockets``
(tests/bench/test_lab_layout.py).  The hostile-frame fuzzer (bench/fuzz_oracle.py) is not a
client of this kind: it sends raw bytes and invalid UTF-8 over a synchronous socket on
purpose; the reference and bare servers (bench/reference.py, bench/floor_reference.py) are
servers, not clients.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage, InvalidStatus
from websockets.protocol import State

# What a kind catches: a socket closed (by either side, or the TCP connection lost), and an upgrade
# refused (``InvalidStatus``: an HTTP answer; ``InvalidMessage``: none) or failed otherwise.
__all__ = [
    "Answer",
    "ConnectionClosed",
    "InvalidHandshake",
    "InvalidMessage",
    "InvalidStatus",
    "ResponsesSocket",
    "close_code",
    "connect",
]
ABNORMAL_CLOSE = 1006  # no close frame: the TCP connection ended without one (RFC 6455 §7.1.5)


def close_code(exc: ConnectionClosed) -> int:
    """The close code the server sent, :data:`ABNORMAL_CLOSE` when it sent none."""
    return exc.rcvd.code if exc.rcvd is not None else ABNORMAL_CLOSE


# The terminal events of a response, as the wire names them (docs/protocol.md §3): the client's
# own copy of the protocol, checked against the server's by tests/bench/test_client.py.
TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
# The last event of the answer to a request: a terminal event, or an ``error`` (not started).
FINAL_EVENT_TYPES = TERMINAL_EVENT_TYPES | {"error"}


def output_text(response: dict[str, Any]) -> str:
    """The text of a response's messages, joined (its ``output_text`` parts)."""
    return "".join(
        part.get("text", "")
        for item in response.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    )


# The first output token of a response (time to first token ends here).
FIRST_TOKEN_TYPES = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})

Event = dict[str, Any]


def ws_url(base_url: str, query: str = "") -> str:
    """The WebSocket-mode endpoint of the server at ``base_url`` (``http://host:port``; an
    endpoint URL already, ``ws://host:port/v1/responses``, is kept as it is)."""
    if base_url.startswith(("ws://", "wss://")):
        return base_url + query
    return base_url.replace("http", "ws", 1) + "/v1/responses" + query


def is_final(event: Event) -> bool:
    return event.get("type") in FINAL_EVENT_TYPES


# The same types as they appear at the head of a raw frame (the server writes ``type`` first):
# a load generator tells a frame's kind without parsing it (bench/runner).
_FINAL_HEADS = tuple(f'"type":"{t}"' for t in sorted(FINAL_EVENT_TYPES))
_FIRST_TOKEN_HEADS = tuple(f'"type":"{t}"' for t in sorted(FIRST_TOKEN_TYPES))
HEAD_CHARS = 60


def is_final_frame(raw: str) -> bool:
    """A raw frame holding a final event (told from its head, unparsed)."""
    head = raw[:HEAD_CHARS]
    return any(t in head for t in _FINAL_HEADS)


def is_first_token_frame(raw: str) -> bool:
    """A raw frame holding an output delta (told from its head, unparsed)."""
    head = raw[:HEAD_CHARS]
    return any(t in head for t in _FIRST_TOKEN_HEADS)


def frame_type(raw: str) -> str | None:
    """A raw frame's event type, told from its head (unparsed); None when the head holds none."""
    start = raw.find('"type":"', 0, HEAD_CHARS)
    if start < 0:
        return None
    start += 8
    end = raw.find('"', start)
    return raw[start:end] if end > start else None


@dataclass
class Answer:
    """The events a request was answered with, each stamped (``time.perf_counter``) on
    arrival; ``sent_at`` is just before the request went out."""

    sent_at: float
    request_bytes: int
    events: list[Event] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)

    def add(self, event: Event) -> None:
        self.events.append(event)
        self.stamps.append(time.perf_counter())

    @property
    def last(self) -> Event | None:
        return self.events[-1] if self.events else None

    @property
    def response(self) -> Event | None:
        """The Response of the terminal event; ``None`` if the answer did not end in one."""
        last = self.last
        return last["response"] if last and last.get("type") in TERMINAL_EVENT_TYPES else None

    @property
    def error(self) -> Event | None:
        """The ``error`` object of an ``error`` event that ended the answer."""
        last = self.last
        return last.get("error") if last and last.get("type") == "error" else None

    @property
    def total_s(self) -> float:
        """Request sent → its last event."""
        return (self.stamps[-1] if self.stamps else self.sent_at) - self.sent_at

    @property
    def ttft_s(self) -> float | None:
        """Request sent → its first output delta."""
        return next(
            (
                t - self.sent_at
                for e, t in zip(self.events, self.stamps)
                if e.get("type") in FIRST_TOKEN_TYPES
            ),
            None,
        )


class ResponsesSocket:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    @property
    def deflate(self) -> bool:
        """The server accepted the client's permessage-deflate offer."""
        return bool(self.ws.protocol.extensions)

    @property
    def upgrade_headers(self) -> websockets.datastructures.Headers:
        """The headers of the server's answer to the upgrade (a resume token's among them)."""
        assert self.ws.response is not None  # an open connection was answered
        return self.ws.response.headers

    async def until_closed(self, on_frame: Callable[[str], None] = lambda raw: None) -> ConnectionClosed:
        """Read frames (each to ``on_frame``) until the connection ends; how it ended."""
        try:
            async for message in self.ws:
                on_frame(message if isinstance(message, str) else message.decode())
        except ConnectionClosed as exc:
            return exc
        return ConnectionClosed(self.ws.protocol.close_rcvd, self.ws.protocol.close_sent)

    @property
    def local_address(self) -> tuple[str, int]:
        """This end's (host, port) of the TCP connection."""
        return self.ws.transport.get_extra_info("sockname")[:2]

    async def send(self, event: Event) -> Answer:
        """Send a client event; the :class:`Answer` to fill with what comes back."""
        data = json.dumps(event)
        answer = Answer(time.perf_counter(), len(data))
        await self.ws.send(data)
        return answer

    async def send_raw(self, data: str) -> None:
        """Send a client event already encoded (a load generator's pre-encoded create)."""
        await self.ws.send(data)

    async def recv_raw(self) -> str:
        """The next server event as its raw text, unparsed."""
        data = await self.ws.recv()
        return data if isinstance(data, str) else data.decode()

    async def recv(self) -> Event:
        return json.loads(await self.ws.recv())

    async def request(self, event: Event, *, until: Callable[[Event], bool] = is_final) -> Answer:
        """Send ``event`` and read events up to the first one ``until`` accepts."""
        answer = await self.send(event)
        while True:
            answer.add(await self.recv())
            if until(answer.events[-1]):
                return answer

    async def create(self, **body: Any) -> Answer:
        """A ``response.create`` with ``body``, answered up to its final event."""
        return await self.request({"type": "response.create", **body})

    def close_code(self) -> int:
        """How the connection ended: the close code the server sent, :data:`ABNORMAL_CLOSE`
        when it sent none."""
        received = self.ws.protocol.close_rcvd
        return received.code if received is not None else ABNORMAL_CLOSE

    @property
    def ended(self) -> bool:
        """The server closed the connection, or the TCP connection ended (not this end's close)."""
        return self.ws.protocol.close_rcvd is not None or self.ws.state is State.CLOSED

    async def wait_closed(self) -> int:
        """Wait until the connection ends; its :meth:`close_code`."""
        await self.ws.wait_closed()
        return self.close_code()

    def abort(self) -> None:
        """Drop the TCP connection without a close frame (the network lost)."""
        self.ws.transport.abort()

    async def close(self) -> None:
        await self.ws.close()


class connect:
    """Open a :class:`ResponsesSocket` to the server at ``base_url``: ``await connect(…)``
    or ``async with connect(…) as sock``.  ``api_key`` goes in ``Authorization``; ``query``
    is the upgrade URL's (``?mode=append``); ``compression="deflate"`` negotiates
    permessage-deflate (off by default); ``ping_interval`` (s, ``None``: no pings) is the
    keepalive's, a pong due within as long; ``additional_headers`` go on the upgrade request
    (a resume token).  ``base_url`` may be the endpoint's ``ws://`` URL itself."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        query: str = "",
        compression: str | None = None,
        open_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        additional_headers: dict[str, str] | None = None,
    ) -> None:
        headers = dict(additional_headers or {})
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._url = ws_url(base_url, query)
        self._options: dict[str, Any] = {
            "max_size": None,
            "compression": compression,
            "open_timeout": open_timeout,
            "ping_interval": ping_interval,
            "ping_timeout": ping_interval,
            "additional_headers": headers or None,
        }
        self._socket: ResponsesSocket | None = None

    async def _open(self) -> ResponsesSocket:
        return ResponsesSocket(await websockets.connect(self._url, **self._options))

    def __await__(self) -> Generator[Any, None, ResponsesSocket]:
        return self._open().__await__()

    async def __aenter__(self) -> ResponsesSocket:
        self._socket = await self._open()
        return self._socket

    async def __aexit__(self, *exc: object) -> None:
        assert self._socket is not None  # entered
        await self._socket.close()
