"""A draining session host answers every socket that still reaches it: sockets the gateway
sent before its drain began arrive (the links are read on), and an upgrade on one is
refused 503 with ``Retry-After`` rather than opened and closed at once; a host that lags
answers late rather than not at all."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import uuid
from typing import Any

from actors.config import SessionConfig
from actors.host.handoff import Handoff, HandoffReceiver, Link, Outcome, handoff_path
from actors.host.server import SocketServer
from actors.host.websocket import CLOSE_TIMEOUT_S
from tests.support.waiting import MovableClockLoop, run_with_movable_clock, until


def upgrade_request() -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def read_to_eof(client: socket.socket) -> bytes:
    """What the client reads until the host half-closes the socket (a refused upgrade's
    answer ends with the host's EOF); the client does not close its end."""
    client.settimeout(5)
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    return answer


async def refused_and_cut_off(
    loop: MovableClockLoop, client: socket.socket, serving: asyncio.Task[Any]
) -> bytes:
    """The refused upgrade's answer as the client reads it; then the host's close timeout
    passes on the loop's clock (no wall time) and the host cuts off the client, which never
    closed its end: ``serving`` ends."""
    answer = await loop.run_in_executor(None, read_to_eof, client)
    assert not serving.done()  # the host waits for the client to close its end
    await loop.advance(CLOSE_TIMEOUT_S, turns=10)
    await asyncio.wait_for(serving, 5)
    return answer


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    return client, server


def test_sockets_sent_before_the_drain_still_arrive_after_the_receiver_closes():
    async def main() -> list[str]:
        arrived: list[str] = []

        async def on_socket(sock: socket.socket, handoff: Handoff, link: Link) -> None:
            arrived.append(handoff.sock_id)
            sock.close()

        receiver = HandoffReceiver(handoff_path(f"test-{uuid.uuid4().hex}"), on_socket)
        receiver.start()
        link = Link.connect(receiver.path)
        pairs = [socket.socketpair() for _ in range(3)]
        await link.send(Handoff("s0"), pairs[0][0].fileno())
        await until(lambda: arrived == ["s0"], 5, "the host to take the link (its first socket)")
        receiver.close()  # the drain begins: no more links
        for i, (mine, _) in enumerate(pairs[1:], start=1):
            await link.send(Handoff(f"s{i}"), mine.fileno())
        await until(lambda: len(arrived) == 3, 5, "the sockets sent after the receiver closed")
        try:
            Link.connect(receiver.path)
            raise AssertionError("a closed receiver took a new link")
        except OSError:
            pass
        link.close()
        for a, b in pairs:
            a.close()
            b.close()
        return arrived

    assert asyncio.run(main()) == ["s0", "s1", "s2"]


def test_an_upgrade_that_reaches_a_draining_host_is_refused_503_with_retry_after():
    def unused(*args: object) -> object:
        raise AssertionError("a refused upgrade starts no session")

    async def main(loop: MovableClockLoop) -> tuple[Outcome, bytes]:
        server = SocketServer(SessionConfig(), "host", unused, unused)  # type: ignore[arg-type]
        await server.drain(1.0)  # nothing open: it returns at once, draining
        client, sock = tcp_pair()
        client.sendall(upgrade_request())
        serving = loop.create_task(server.serve(sock, Handoff("s1", conn_id="c1", owner="o")))
        answer = await refused_and_cut_off(loop, client, serving)
        sock.close()  # the gateway's copy closes on the host's Ended notice
        client.close()
        return serving.result().outcome, answer

    outcome, answer = run_with_movable_clock(main)
    assert outcome is Outcome.REFUSED
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert b"\r\nRetry-After: 1\r\n" in answer and b'"code": "server_shutting_down"' in answer, answer


class LaggingLoop(MovableClockLoop):
    """A host's loop that lags behind (:meth:`advance`), counting the sockets it has taken."""

    accepted = 0  # sockets taken by a protocol (connect_accepted_socket)

    async def connect_accepted_socket(self, *args: Any, **kwargs: Any) -> Any:
        taken = await super().connect_accepted_socket(*args, **kwargs)
        self.accepted += 1
        return taken


def test_a_host_that_lags_past_websockets_opening_timeout_still_answers_the_upgrade():
    """The ramp's ``InvalidMessage`` (docs/scaling.md): a host whose loop lagged more than
    websockets' 10 s opening-handshake timeout between taking a socket and reading its
    request closed it unanswered.  The gateway hands a socket over with its complete head
    received, so the host waits for nothing from the client and sets no such timeout."""

    def unused(*args: object) -> object:
        raise AssertionError("a refused upgrade starts no session")

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, LaggingLoop)
        server = SocketServer(SessionConfig(), "host", unused, unused)  # type: ignore[arg-type]
        await server.drain(1.0)  # its answer (503) needs no session
        client, sock = tcp_pair()
        serving = loop.create_task(server.serve(sock, Handoff("s1", conn_id="c1", owner="o")))
        await until(lambda: loop.accepted, 5, "the host to take the socket")  # its request not read yet
        await loop.advance(11.0, turns=10)  # what fell due in those 11 s runs, and what it starts
        client.sendall(upgrade_request())
        answer = await refused_and_cut_off(loop, client, serving)
        sock.close()
        client.close()
        return answer

    with asyncio.Runner(loop_factory=LaggingLoop) as runner:
        answer = runner.run(main())
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
