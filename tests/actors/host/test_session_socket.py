"""The session host's socket: when each client message began to arrive (a response's server
time starts at its create's first bytes, actors.core.timings)."""

from __future__ import annotations

import asyncio
import socket
import time

from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode
from websockets.server import ServerProtocol

from actors.host.websocket import WebSocket


def test_a_message_arrives_with_its_first_bytes_and_a_ping_before_it_does_not_count():
    async def main() -> list[tuple[float, float, str]]:  # times after the frame's first write, s
        got: list[tuple[float, float, str]] = []  # (arrival, read, message)

        def received(message: str | bytes, arrived: float) -> None:
            got.append((arrived, time.perf_counter(), message))

        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(  # a socket handed over, as on a session host
            lambda: WebSocket(
                ServerProtocol(),
                lambda ws, request: ws.protocol.accept(request),
                lambda ws: ws.receive(received),
                ping_interval=None,
                ping_timeout=None,
            ),
            host_side,
        )
        async with connect("ws://host/v1/responses", sock=client_side, compression=None) as ws:
            await ws.ping()  # a control frame alone: no message begins
            await asyncio.sleep(0.03)
            frame = Frame(Opcode.TEXT, b'{"type":"response.create"}' * 4000).serialize(
                mask=True, extensions=[]
            )
            sent_at = time.perf_counter()
            ws.transport.write(frame[:1000])
            await asyncio.sleep(0.03)  # the rest of the frame comes 30 ms later
            ws.transport.write(frame[1000:])
            await ws.send("two")
            await ws.send("three")
            async with asyncio.timeout(5):
                while len(got) < 3:
                    await asyncio.sleep(0.005)
            return [(arrived - sent_at, read - sent_at, message) for arrived, read, message in got]

    (first, first_read, big), (second, _, two), (third, _, three) = asyncio.run(main())
    assert big.startswith('{"type"') and (two, three) == ("two", "three")
    assert 0 <= first < 0.01, "the first bytes, not the ping before them nor the rest 30 ms later"
    assert first_read >= 0.03
    assert first + 0.025 <= second <= third, "the later messages came with or after the frame's rest"
