"""The recording relay (tests/support/wiretap.py) against a real websockets server and client,
compression on: it passes every byte through and reads both directions' messages and the
close codes, and whose side ended the stream."""

from __future__ import annotations

import asyncio
import json

import websockets

from tests.support.waiting import until
from tests.support.wiretap import Wiretap


async def exchange(url: str) -> None:
    async with websockets.connect(url, compression="deflate") as ws:
        for i in range(3):
            await ws.send(json.dumps({"type": "response.create", "n": i, "pad": "x" * 300 * i}))
            assert json.loads(await ws.recv()) == {"type": "response.completed", "n": i}
        try:
            await ws.recv()
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None and exc.rcvd.code == 1012


def test_the_wiretap_reads_compressed_messages_both_ways_and_the_close_code():
    async def handler(ws: websockets.ServerConnection) -> None:
        for _ in range(3):
            n = json.loads(await ws.recv())["n"]
            await ws.send(json.dumps({"type": "response.completed", "n": n}))
        await ws.close(1012, "service restart")

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            with Wiretap("127.0.0.1", port) as tap:
                await exchange(tap.url.replace("http", "ws"))
                await until(
                    lambda: tap.connections and tap.connections[0].client_close_code, 5, "the close's echo"
                )
                (conn,) = tap.connections
                assert conn.upgraded and conn.request.startswith("GET / ")
                assert [m["n"] for _, m in conn.creates()] == [0, 1, 2]
                assert [e["n"] for _, e in conn.events("response.completed")] == [0, 1, 2]
                assert conn.close_code == 1012 and conn.client_close_code == 1012  # its echo
                assert conn.ended_by == "server"

    asyncio.run(main())


def test_the_wiretap_tells_a_client_that_drops_its_socket_from_a_server_close():
    async def handler(ws: websockets.ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "error", "error": {"code": "server_shutting_down"}}))
        await ws.wait_closed()

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            with Wiretap("127.0.0.1", port) as tap:
                ws = await websockets.connect(tap.url.replace("http", "ws"))
                await ws.send(json.dumps({"type": "response.create"}))
                await ws.recv()
                ws.transport.abort()  # no close frame: the TCP stream just ends
                await until(
                    lambda: tap.connections and tap.connections[0].close_code, 5, "the tap to see the end"
                )
                (conn,) = tap.connections
                assert (conn.close_code, conn.client_close_code, conn.ended_by) == (1006, None, "client")

    asyncio.run(main())
