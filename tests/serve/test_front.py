"""The gateway front decides, from a peeked request head, who serves a connection."""

from __future__ import annotations

import pytest

from serve.front import is_responses_upgrade


def head(request_line: str, *headers: str) -> bytes:
    return "\r\n".join([request_line, "Host: x", *headers, "", ""]).encode()


@pytest.mark.parametrize("raw, upgrade", [
    (head("GET /v1/responses HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade"), True),
    (head("GET /v1/responses/ HTTP/1.1", "upgrade: WebSocket"), True),
    (head("GET /v1/responses?api-version=1 HTTP/1.1", "Upgrade: websocket"), True),
    (head("GET /v1/responses HTTP/1.1"), False),  # plain GET: HTTP app
    (head("POST /v1/responses HTTP/1.1", "Upgrade: websocket"), False),
    (head("GET /v1/other HTTP/1.1", "Upgrade: websocket"), False),
    (head("GET /v1/responses/resp_1 HTTP/1.1", "Upgrade: websocket"), False),
    (b"garbage", False),
])
def test_only_websocket_upgrades_of_the_responses_path_are_handed_off(raw, upgrade):
    assert is_responses_upgrade(raw) is upgrade


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_closed_front_leaves_the_shared_port_to_the_other_listener(loop_kind):
    """Two gateways share a port (SO_REUSEPORT), as in a redeploy; once the old front is
    closed, every new connection reaches the new one.  (Under uvloop, which Ray's actors
    run, closing the listener under a pending accept used to leave it listening: it took
    a share of the connections and reset them.)"""
    import asyncio

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

            return Front(listener, uvicorn.Config(lambda *a: None, lifespan="off"), handoff, handoff_http,
                         OriginPolicy(LOOPBACK_ORIGINS))

        old_listener = bind_socket("127.0.0.1", 0)
        port = old_listener.getsockname()[1]
        old, new = front(old_listener, "old"), front(bind_socket("127.0.0.1", port), "new")
        running = [asyncio.create_task(old.run()), asyncio.create_task(new.run())]
        await asyncio.sleep(0.05)
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
