"""The gateway front decides, from a peeked request head, who serves a connection."""

from __future__ import annotations

import logging

import pytest

from serve.front import is_responses_upgrade
from tests.support.waiting import until


def head(request_line: str, *headers: str) -> bytes:
    return "\r\n".join([request_line, "Host: x", *headers, "", ""]).encode()


@pytest.mark.parametrize(
    "raw, upgrade",
    [
        (head("GET /v1/responses HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade"), True),
        (head("GET /v1/responses/ HTTP/1.1", "upgrade: WebSocket"), True),
        (head("GET /v1/responses?api-version=1 HTTP/1.1", "Upgrade: websocket"), True),
        (head("GET /v1/responses HTTP/1.1"), False),  # plain GET: HTTP app
        (head("POST /v1/responses HTTP/1.1", "Upgrade: websocket"), False),
        (head("GET /v1/other HTTP/1.1", "Upgrade: websocket"), False),
        (head("GET /v1/responses/resp_1 HTTP/1.1", "Upgrade: websocket"), False),
        (b"garbage", False),
    ],
)
def test_only_websocket_upgrades_of_the_responses_path_are_handed_off(raw, upgrade):
    assert is_responses_upgrade(raw) is upgrade


@pytest.mark.parametrize("sharing", ["one socket", "reuseport group"])
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_closed_front_leaves_the_shared_port_to_the_other_listener(loop_kind, sharing):
    """Two gateways share a port, as in a redeploy: one listening socket passed on
    (serve/port_claim.py), or two in the port's SO_REUSEPORT group (a replica that binds
    while none can pass it); once the old front is closed, every new connection reaches the
    new one.  (Under uvloop, which Ray's actors run, closing the listener under a pending
    accept used to leave it listening: it took a share of the connections and reset them.)"""
    import asyncio
    import os
    import socket

    import uvicorn

    from serve.front import Front, bind_socket
    from serve.origins import LOOPBACK_ORIGINS, OriginPolicy

    async def main():
        served = []

        def front(listener, name):
            async def handoff(sock, head):
                served.append(name)
                loop = asyncio.get_running_loop()
                await loop.sock_recv(sock, 65536)  # the peeked head: unread input would reset on close
                await loop.sock_sendall(sock, name.encode())
                sock.close()

            async def handoff_http(sock):
                return False

            return Front(
                listener,
                uvicorn.Config(lambda *a: None, lifespan="off"),
                handoff,
                handoff_http,
                OriginPolicy(LOOPBACK_ORIGINS),
            )

        old_listener = bind_socket("127.0.0.1", 0)
        port = old_listener.getsockname()[1]
        new_listener = (
            socket.socket(fileno=os.dup(old_listener.fileno()))
            if sharing == "one socket"
            else bind_socket("127.0.0.1", port)
        )
        old, new = front(old_listener, "old"), front(new_listener, "new")
        running = [asyncio.create_task(old.run()), asyncio.create_task(new.run())]
        await asyncio.sleep(0)  # one loop turn: both accept loops wait in accept(), as a close meets them
        old.close()

        async def one():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head("GET /v1/responses HTTP/1.1", "Upgrade: websocket"))
            try:
                return await asyncio.wait_for(reader.read(), 5)
            except OSError as exc:
                return repr(exc)
            finally:
                writer.close()

        answers = await asyncio.gather(*(one() for _ in range(200)))
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        return answers, served

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        answers, served = uvloop.run(main())
    else:
        answers, served = asyncio.run(main())
    assert set(answers) == {b"new"} and set(served) == {"new"}, {a: answers.count(a) for a in set(answers)}


def upgrade_head() -> bytes:
    return head("GET /v1/responses HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade")


def idle_front(listener, refused: list[int], **options):
    """A front whose handoffs fail the test: only its own answers are expected."""
    import uvicorn

    from serve.front import Front
    from serve.origins import LOOPBACK_ORIGINS, OriginPolicy

    async def handoff(sock, head):
        raise AssertionError("handed over")

    async def handoff_http(sock):
        raise AssertionError("handed over")

    return Front(
        listener,
        uvicorn.Config(lambda *a: None, lifespan="off"),
        handoff,
        handoff_http,
        OriginPolicy(LOOPBACK_ORIGINS),
        on_refused=refused.append,
        **options,
    )


class Records(logging.Handler):
    """The messages logged to it."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def answer_of(reader, writer, data: bytes | None = None) -> bytes:
    """What the server sends until it closes; the error's repr if it resets."""
    import asyncio

    try:
        if data is not None:
            writer.write(data)
        return await asyncio.wait_for(reader.read(), 5)
    except OSError as exc:
        return repr(exc).encode()
    finally:
        writer.close()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_closing_front_answers_every_connection_it_holds_503_with_retry_after(loop_kind):
    """Connections the kernel queued for the listener (not yet accepted) and connections
    accepted and still waiting for their request head are answered 503
    ``server_shutting_down`` with ``Retry-After`` when the front closes for a drain; before,
    the first were reset by the listener's close and the second by cancelling their dispatch."""
    import asyncio

    from serve.front import bind_socket

    async def main():
        refused: list[int] = []
        listener = bind_socket("127.0.0.1", 0)
        port = listener.getsockname()[1]
        front = idle_front(listener, refused)
        running = asyncio.create_task(front.run())
        waiting = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        await until(lambda: front.dispatching == 5, 5, "the five to be accepted")  # waiting for a head
        running.cancel()  # nothing accepts from now on: these queue in the kernel
        await asyncio.gather(running, return_exceptions=True)
        queued = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for _, writer in queued:
            writer.write(upgrade_head())
            await writer.drain()  # the head is in the kernel's buffer on the front's side
        front.close()
        answers = await asyncio.gather(
            *(answer_of(r, w, upgrade_head()) for r, w in waiting), *(answer_of(r, w) for r, w in queued)
        )
        await front.drain_http(5)
        return answers, refused

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        answers, refused = uvloop.run(main())
    else:
        answers, refused = asyncio.run(main())
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert b"\r\nRetry-After: 1\r\n" in answer and b'"code": "server_shutting_down"' in answer, answer
    assert refused == [503] * 25


def test_a_connection_that_sends_no_request_head_is_answered_408_not_dropped():
    import asyncio

    from serve.front import bind_socket

    async def main():
        refused: list[int] = []
        listener = bind_socket("127.0.0.1", 0)
        front = idle_front(listener, refused, head_timeout_s=0.2)
        running = asyncio.create_task(front.run())
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        answer = await answer_of(reader, writer)
        running.cancel()
        front.close()
        return answer, refused

    answer, refused = asyncio.run(main())
    assert (
        answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b'"code": "request_timeout"' in answer
    ), answer
    assert refused == [408]


def _limit_leaving(free: int) -> int:
    """An open-file soft limit that leaves this process ``free`` more descriptors."""
    import os

    used = {int(fd) for fd in os.listdir("/proc/self/fd")}
    n, left = 0, free
    while True:
        if n not in used:
            left -= 1
            if left < 0:
                return n
        n += 1


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_front_out_of_descriptors_keeps_accepting_once_some_are_freed(loop_kind):
    """The gateway keeps a descriptor per held connection; at its open-file limit accept()
    fails with EMFILE.  The front waits and accepts again (the connections wait in the
    kernel's queue) instead of its accept loop ending — which took the listener, and with
    the replica restarted every held connection, down."""
    import asyncio
    import resource
    import socket

    import uvicorn

    from serve.front import Front, bind_socket
    from serve.origins import LOOPBACK_ORIGINS, OriginPolicy

    async def main():
        held: list[socket.socket] = []

        async def handoff(sock, head):
            held.append(sock)  # kept, as the gateway keeps its copy of a held connection

        async def handoff_http(sock):
            raise AssertionError("handed over")

        listener = bind_socket("127.0.0.1", 0)
        port = listener.getsockname()[1]
        front = Front(
            listener,
            uvicorn.Config(lambda *a: None, lifespan="off"),
            handoff,
            handoff_http,
            OriginPolicy(LOOPBACK_ORIGINS),
        )
        clients = []
        for _ in range(12):  # queued in the kernel before the front accepts any
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(upgrade_head())
            clients.append(c)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (_limit_leaving(4), hard))
        failures = Records()
        logging.getLogger("serve.front").addHandler(failures)
        try:
            running = asyncio.create_task(front.run())
            # accept() meets EMFILE: the front says so, and waits to try again (or, the bug,
            # its accept loop ends).
            await until(
                lambda: (failures.messages and front.dispatching == 0) or running.done(),
                10,
                "accept() to meet the limit, the sockets taken before it handed over",
            )
            at_limit = len(held)
            alive = not running.done()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            logging.getLogger("serve.front").removeHandler(failures)
        if alive:  # descriptors to spare again: the queued rest are taken
            await until(lambda: len(held) == len(clients), 10, "the queued rest to be taken")
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        front.close()
        for s in [*held, *clients]:
            s.close()
        return at_limit, alive, len(held)

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        at_limit, alive, handed = uvloop.run(main())
    else:
        at_limit, alive, handed = asyncio.run(main())
    assert at_limit < 12, "the limit did not bite: the test proves nothing"
    assert alive, "the accept loop ended at the open-file limit"
    assert handed == 12
