"""The session host's WebSocket (actors.host.websocket): when each client message began to
arrive (a response's server time starts at its create's first bytes, actors.core.timings),
the frame cap, and the keepalive that gives up on a peer that stopped answering."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from actors.host.websocket import WebSocket
from tests.support.waiting import until


async def _accept(ws: WebSocket, request: Request) -> Response:
    return ws.protocol.accept(request)


def test_a_message_arrives_with_its_first_bytes_and_a_ping_before_it_does_not_count():
    """The host's clock counts its reads: a message's arrival is the number of the read that
    brought its first bytes."""

    async def main() -> list[tuple[int, int, str]]:
        reads = itertools.count(1)
        last_read = 0
        got: list[tuple[int, int, str]] = []  # (arrival, the read that completed it, message)

        def clock() -> float:
            nonlocal last_read
            last_read = next(reads)
            return float(last_read)

        def received(message: str | bytes, arrived: float) -> None:
            got.append((int(arrived), last_read, str(message)))

        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(  # a socket handed over, as on a session host
            lambda: WebSocket(
                ServerProtocol(),
                _accept,
                lambda ws: ws.receive(received),
                ping_interval=None,
                ping_timeout=None,
                clock=clock,
            ),
            host_side,
        )
        async with connect("ws://host/v1/responses", sock=client_side, compression=None) as ws:
            await (await ws.ping())  # a control frame alone: no message begins (read: its pong is back)
            pinged = last_read
            frame = Frame(Opcode.TEXT, b'{"type":"response.create"}' * 4000).serialize(
                mask=True, extensions=[]
            )
            ws.transport.write(frame[:1000])
            await until(lambda: last_read > pinged, 5, "the host to read the frame's first part")
            first_part = last_read
            ws.transport.write(frame[1000:])  # the rest, in a later read
            await ws.send("two")
            await ws.send("three")
            await until(lambda: len(got) == 3, 5, "three messages")
            assert pinged < first_part
            return [(arrived - first_part, completed - first_part, m) for arrived, completed, m in got]

    (first, first_read, big), (second, _, two), (third, _, three) = asyncio.run(main())
    assert big.startswith('{"type"') and (two, three) == ("two", "three")
    assert first == 0, "the first bytes' read, not the ping's before them nor the rest's after"
    assert first_read > 0, "handed over once its rest was read"
    assert first < second <= third, "the later messages came with or after the frame's rest"


def _serve(
    *,
    max_size: int = 2**20,
    ping_interval: float | None,
    ping_timeout: float | None,
    close_timeout: float = 2.0,
) -> WebSocket:
    """A WebSocket that accepts the upgrade and drops its messages."""
    return WebSocket(
        ServerProtocol(max_size=max_size),
        _accept,
        lambda ws: ws.receive(lambda message, arrived: None),
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
    )


def test_a_message_over_the_cap_closes_the_connection_with_1009():
    async def main() -> int | None:
        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        _, server = await loop.connect_accepted_socket(
            lambda: _serve(max_size=1000, ping_interval=None, ping_timeout=None), host_side
        )
        async with connect("ws://host/v1/responses", sock=client_side, compression=None) as ws:
            await ws.send("x" * 2000)
            async with asyncio.timeout(5):
                await server.closed
            return ws.close_code

    assert asyncio.run(main()) == 1009


def test_a_peer_that_answers_no_ping_is_closed_1011_and_cut_off():
    async def main() -> tuple[bytes, bool]:
        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        _, server = await loop.connect_accepted_socket(
            lambda: _serve(ping_interval=0.05, ping_timeout=0.05, close_timeout=0.1), host_side
        )
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        client_side.setblocking(False)
        await loop.sock_sendall(
            client_side,
            f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode(),
        )
        async with asyncio.timeout(5):
            await server.closed  # no pong, no close echo: the server gave up on its own
            received = b""
            while chunk := await loop.sock_recv(client_side, 65536):
                received += chunk
        client_side.close()
        return received, server.accepted

    received, accepted = asyncio.run(main())
    assert accepted and received.startswith(b"HTTP/1.1 101")
    close = received[received.rindex(b"\x88") :]  # the close frame after the ping(s)
    assert int.from_bytes(close[2:4], "big") == 1011 and b"keepalive ping timeout" in close


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_batch_of_frames_flushed_at_once_arrives_whole_and_in_order(loop_kind):
    """Several frames, a fragmented message among them, handed to the transport in one
    flush (uvloop, which Ray's actors run, writes them as they are, without joining them)."""

    async def main() -> list[str | bytes]:
        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[WebSocket] = loop.create_future()
        await loop.connect_accepted_socket(
            lambda: WebSocket(
                ServerProtocol(),
                _accept,
                opened.set_result,
                ping_interval=None,
                ping_timeout=None,
            ),
            host_side,
        )
        async with connect("ws://host/v1/responses", sock=client_side, compression=None) as ws:
            server = await opened
            big = "y" * 200_000
            server.send_text(b"one")
            server.send_text(big.encode()[:1000], fin=False)
            server.send_continuation(big.encode()[1000:], fin=True)
            server.send_text(b"three")
            server.flush()
            async with asyncio.timeout(5):
                got = [await ws.recv() for _ in range(3)]
            return [m if len(m) < 10 else len(m) for m in got]

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        got = uvloop.run(main())
    else:
        got = asyncio.run(main())
    assert got == ["one", 200_000, "three"]
