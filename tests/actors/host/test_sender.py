"""What leaves a WebSocket (actors.host.sender): the figures stage runs only for a client that
asked for its figures; the deflate policy its upgrade negotiates with."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from actors.config import SessionConfig
from actors.core.session import Session
from actors.host.connection import Connection
from actors.host.sender import Sender, accepts_deflate, deflate_extensions
from actors.host.websocket import WebSocket
from store.writer import StoreWriter
from tests.actors.host.test_connection import MODEL, GatedStore, ScriptedInference, create


@pytest.mark.parametrize("observed", [False, True], ids=["no-histogram", "histogram"])
@pytest.mark.parametrize(("asked", "taken"), [(False, 1), (True, 2)], ids=["not-asked", "asked"])
def test_a_terminal_frame_is_restamped_only_when_its_client_asked_for_the_figures(observed, asked, taken):
    """The observer seam (actors.host.figures) on a real socket: a response's figures are taken
    once as it finishes; again (the restamp, and the splice of the fragmented frame) only when
    its client asked for them — not because the host records them in its histogram, which
    gets the figures taken at the finish."""

    async def main() -> tuple[int, list[dict[str, float]], dict, dict[str, float] | None]:
        takes: list[float] = []  # PhaseTimer.report asks the loop's lag once each time it takes them
        session = Session(
            SessionConfig(),
            [MODEL],
            session_key="s",
            clock=lambda: 0.0,
            loop_lag=lambda since: takes.append(since) or 0.0,
        )
        gated = GatedStore()
        gated.gate.set()
        writer = StoreWriter(gated)
        recorded: list[dict[str, float]] = []
        conn = Connection(
            session,
            ScriptedInference(),
            writer,
            observe=(lambda t, ms: recorded.append(ms)) if observed else None,
        )
        loop = asyncio.get_running_loop()
        sending: list[asyncio.Task[None]] = []

        async def accept(ws: WebSocket, request: Request) -> Response:
            return ws.protocol.accept(request)

        def on_open(ws: WebSocket) -> None:
            ws.receive(conn.feed)
            sending.append(loop.create_task(Sender(ws, conn).run()))

        host_side, client_side = socket.socketpair()
        await loop.connect_accepted_socket(
            lambda: WebSocket(ServerProtocol(), accept, on_open, ping_interval=None, ping_timeout=None),
            host_side,
        )
        try:
            async with connect("ws://host/v1/responses", sock=client_side, compression=None) as ws:
                await ws.send(create(store=False, metadata={"responses_ws.timings": "1"} if asked else {}))
                while (event := json.loads(await asyncio.wait_for(ws.recv(), 10)))[
                    "type"
                ] != "response.completed":
                    pass
                figures = event["response"]["metadata"].get("responses_ws.timings")
                return len(takes), recorded, event, json.loads(figures) if figures else None
        finally:
            await conn.close()
            await asyncio.gather(*sending, return_exceptions=True)
            await writer.close()

    takes, recorded, event, sent = asyncio.run(main())
    assert takes == taken, "taken again as the frame leaves only for a client that asked"
    assert event["response"]["status"] == "completed"
    assert (sent is not None) is asked and (not asked or sent["api_overhead"] >= 0.0)
    assert len(recorded) == (1 if observed else 0) and all("api_overhead" in ms for ms in recorded)


def test_auto_refuses_deflate_from_the_loopback_and_always_or_never_decide_alone():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            assert accepts_deflate("auto", server) is False, "a loopback peer: sent as they are"
            assert accepts_deflate("always", server) is True
            assert accepts_deflate("never", server) is False
            assert deflate_extensions(SessionConfig(deflate="auto"), server) == []
            [factory] = deflate_extensions(SessionConfig(deflate="always"), server)
            assert factory.name == "permessage-deflate"
    a, b = socket.socketpair()  # not an IP socket: no peer address to judge by
    with a, b:
        assert accepts_deflate("auto", a) is True
