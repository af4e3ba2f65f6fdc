"""HTTP mode on a host (actors/host/http.py): a host standing in for the HTTP hosts serves one
request per connection, so the client's next request is routed again (serve/pool.py)."""

from __future__ import annotations

import asyncio
import socket

from actors.host.http import HttpServer


async def hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def two_requests(keep_alive: bool) -> bytes:
    """What the client reads after sending two requests at once: both answers, or (the server
    having closed the connection) what came before the end of the stream."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    listener.close()
    serving = asyncio.ensure_future(HttpServer(hello).serve(accepted, keep_alive=keep_alive))
    loop = asyncio.get_running_loop()
    client.setblocking(False)
    await loop.sock_sendall(client, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n" * 2)
    got = b""
    async with asyncio.timeout(5):
        while got.count(b"ok") < 2 and (chunk := await loop.sock_recv(client, 65536)):
            got += chunk
    client.close()
    await asyncio.wait_for(serving, 5)
    return got


def test_a_host_standing_in_for_the_http_hosts_closes_after_the_first_response():
    kept = asyncio.run(two_requests(keep_alive=True))
    assert kept.count(b"HTTP/1.1 200") == 2 and b"connection: close" not in kept.lower()
    once = asyncio.run(two_requests(keep_alive=False))  # ended by the server: the loop read EOF
    assert once.count(b"HTTP/1.1 200") == 1 and b"connection: close" in once.lower()
