"""A recording TCP relay in front of the balancer for one real client (Codex CLI, the openai
SDK): every connection the client opens to it is piped through unchanged, and the WebSocket
frames both ways are parsed (permessage-deflate inflated) so a test sees what the client sent
and received: each JSON message with its time, the server's close code (1006: the TCP
connection ended without one), the client's, whose side ended the TCP stream first, plain
HTTP requests (a fallback), and which session node the
balancer sent the connection to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

TAIL = b"\x00\x00\xff\xff"  # what permessage-deflate strips from each message (RFC 7692)


class FrameReader:
    """One direction of a WebSocket connection, from its first byte: the HTTP head, then (once
    :attr:`websocket` is set: a response direction sets it from its own ``101`` head) frames
    reassembled into messages, a message with RSV1 set inflated (permessage-deflate)."""

    def __init__(self, response: bool) -> None:
        self.response = response
        self.buf = b""
        self.head: str | None = None  # the HTTP request or response head, once complete
        self.websocket = False
        self._opcode = 0
        self._inflater = zlib.decompressobj(-15)
        self._parts: list[bytes] = []
        self._compressed = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The complete messages in ``data`` (and what came before it): (opcode, payload)."""
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return []
            self.head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
            if self.response:
                self.websocket = self.head.split("\r\n", 1)[0].split(" ")[1:2] == ["101"]
        out: list[tuple[int, bytes]] = []
        if not self.websocket:
            self.buf = b""  # a plain HTTP body: not parsed
            return out
        while (frame := self._frame()) is not None:
            fin, rsv1, opcode, payload = frame
            if opcode >= 0x8:  # control frames are never fragmented nor compressed
                out.append((opcode, payload))
                continue
            if opcode != 0:
                self._parts, self._compressed, self._opcode = [], rsv1, opcode
            self._parts.append(payload)
            if fin:
                message = b"".join(self._parts)
                if self._compressed:
                    message = self._inflater.decompress(message + TAIL)
                out.append((self._opcode, message))
        return out

    def _frame(self) -> tuple[bool, bool, int, bytes] | None:
        b = self.buf
        if len(b) < 2:
            return None
        fin, rsv1, opcode = bool(b[0] & 0x80), bool(b[0] & 0x40), b[0] & 0x0F
        masked, n, at = bool(b[1] & 0x80), b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack("!Q", b[2:10])[0], 10
        key = b[at : at + 4] if masked else b""
        at += 4 if masked else 0
        if len(b) < at + n:
            return None
        payload = b[at : at + n]
        if masked:
            payload = bytes(x ^ key[i % 4] for i, x in enumerate(payload))
        self.buf = b[at + n :]
        return fin, rsv1, opcode, payload


@dataclass
class Tapped:
    """One connection of the client through the relay."""

    opened_at: float
    upstream_port: int
    server: str | None = None  # the session node (the balancer's view)
    request: str = ""  # the client's request line, e.g. ``GET /v1/responses HTTP/1.1``
    upgraded: bool = False
    sent: list[tuple[float, dict]] = field(default_factory=list)  # client → server JSON messages
    received: list[tuple[float, dict]] = field(default_factory=list)  # server → client
    close_code: int | None = None  # the server's close frame; 1006 when the TCP stream just ended
    closed_at: float | None = None
    client_close_code: int | None = None  # the client's close frame, if it sent one
    ended_by: str | None = None  # "client" or "server": whose side of the TCP stream ended first

    def events(self, kind: str) -> list[tuple[float, dict]]:
        return [(t, e) for t, e in self.received if e.get("type") == kind]

    def creates(self) -> list[tuple[float, dict]]:
        return [(t, m) for t, m in self.sent if m.get("type") == "response.create"]


class Wiretap:
    """``with Wiretap(host, port, servers) as tap:`` the client connects to ``tap.url``;
    ``servers`` (client source port → node, the balancer's runtime API) locates each
    connection."""

    def __init__(self, host: str, port: int, servers: Callable[[], dict[int, str]] | None = None) -> None:
        self.target = (host, port)
        self.servers = servers
        self.connections: list[Tapped] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="wiretap", daemon=True)
        self._thread.start()
        ready.wait(10)
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Wiretap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
            ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        conn = Tapped(time.monotonic(), up_writer.get_extra_info("sockname")[1])
        self.connections.append(conn)
        out, back = FrameReader(response=False), FrameReader(response=True)
        locate = asyncio.create_task(self._locate(conn))

        def client_message(opcode: int, payload: bytes) -> None:
            if opcode == 0x1:
                conn.sent.append((time.monotonic(), json.loads(payload)))
            elif opcode == 0x8 and conn.client_close_code is None:
                conn.client_close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005

        def server_message(opcode: int, payload: bytes) -> None:
            if opcode == 0x1:
                conn.received.append((time.monotonic(), json.loads(payload)))
            elif opcode == 0x8 and conn.close_code is None:
                conn.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                conn.closed_at = time.monotonic()

        async def pump(
            src: asyncio.StreamReader,
            dst: asyncio.StreamWriter,
            frames: FrameReader,
            on: Callable[[int, bytes], None],
        ) -> None:
            side = "client" if frames is out else "server"
            with contextlib.suppress(OSError):
                while True:
                    try:
                        data = await src.read(65536)
                    except OSError:
                        data = b""
                    if not data:  # this side ended its stream (or reset it)
                        conn.ended_by = conn.ended_by or side
                        break
                    for message in frames.feed(data):
                        on(*message)
                    if frames is back and back.head is not None and not conn.upgraded:
                        conn.upgraded = out.websocket = back.websocket
                    if frames is out and out.head is not None and not conn.request:
                        conn.request = out.head.split("\r\n", 1)[0]
                    dst.write(data)  # the client's frames come after the 101 reaches it
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(
            pump(reader, up_writer, out, client_message), pump(up_reader, writer, back, server_message)
        )
        if conn.close_code is None:
            conn.close_code, conn.closed_at = 1006, time.monotonic()
        locate.cancel()

    async def _locate(self, conn: Tapped, timeout_s: float = 5.0) -> None:
        if self.servers is None:
            return
        deadline = time.monotonic() + timeout_s
        while conn.server is None and time.monotonic() < deadline:
            conn.server = (await asyncio.to_thread(self.servers)).get(conn.upstream_port)
            await asyncio.sleep(0.1)
