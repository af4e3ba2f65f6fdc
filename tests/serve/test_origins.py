"""The origin policy (serve/origins.py): which ``Origin`` headers an allow-list admits, how
config entries are checked, and the gateway front refusing a page with 403 on real sockets
(the handoffs behind it are the test's)."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.config import load_app_config
from serve.origins import LOOPBACK_ORIGINS, OriginPolicy

DEFAULT = OriginPolicy(LOOPBACK_ORIGINS)


@pytest.mark.parametrize(
    "origin, allowed",
    [
        (None, True),  # no Origin: an SDK, a CLI, curl
        ("http://localhost:5173", True),
        ("http://127.0.0.1:8765", True),
        ("https://localhost", True),
        ("http://[::1]:3000", True),
        ("HTTP://LOCALHOST:3000", True),
        ("https://evil.example", False),
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.evil.example:8765", False),
        ("http://evil.example:8765", False),  # DNS rebinding to 127.0.0.1 keeps the page's own origin
        ("null", False),  # a file:// page or a sandboxed frame
        ("chrome-extension://abcdef", False),
        ("", False),
        ("http://localhost:99999", False),
    ],
)
def test_the_default_admits_pages_of_this_machine_only(origin, allowed):
    assert DEFAULT.allows(origin) is allowed


def test_entries_are_origins_with_a_port_any_port_or_star():
    policy = OriginPolicy(
        ["https://app.example.com", "http://dev.example.com:3000", "http://tools.example.com:*"]
    )
    assert policy.allows("https://app.example.com") and policy.allows("https://app.example.com:443")
    assert not policy.allows("http://app.example.com") and not policy.allows("https://app.example.com:8443")
    assert policy.allows("http://dev.example.com:3000") and not policy.allows("http://dev.example.com:3001")
    assert policy.allows("http://tools.example.com:1") and policy.allows("http://tools.example.com")
    assert not policy.allows("http://localhost:3000")  # a list replaces the default
    assert OriginPolicy(["*"]).allows("null") and OriginPolicy(["*"]).allows("https://anything.example")
    assert not OriginPolicy([]).allows("http://localhost:3000") and OriginPolicy([]).allows(None)


def test_config_sets_the_list_and_rejects_entries_that_are_not_origins():
    cfg = load_app_config(None, environ={}, sets=["server.allowed_origins=[https://app.example.com, '*']"])
    assert cfg.server.allowed_origins == ("https://app.example.com", "*")
    assert load_app_config(None, environ={}).server.allowed_origins == LOOPBACK_ORIGINS
    for bad in ("app.example.com", "https://app.example.com/path", "ftp://x", "https://x:port"):
        with pytest.raises(ValueError, match="allowed_origins"):
            load_app_config(None, environ={}, sets=[f"server.allowed_origins=[{bad!r}]"])


def request(path: str, *headers: str, method: str = "GET") -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode()


UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
)


def test_the_front_refuses_a_page_outside_the_list_and_hands_the_others_over():
    import uvicorn

    from serve.front import Front, bind_socket

    async def main():
        handed = []

        async def handoff(sock, head):
            handed.append("websocket")
            loop = asyncio.get_running_loop()
            await loop.sock_recv(sock, 65536)
            await loop.sock_sendall(sock, b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
            sock.close()

        async def handoff_http(sock):
            handed.append("http")
            loop = asyncio.get_running_loop()
            await loop.sock_recv(sock, 65536)
            await loop.sock_sendall(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            sock.close()
            return True

        listener = bind_socket("127.0.0.1", 0)
        port = listener.getsockname()[1]
        front = Front(
            listener,
            uvicorn.Config(lambda *a: None, lifespan="off"),
            handoff,
            handoff_http,
            OriginPolicy(["https://app.example.com"]),
        )
        running = asyncio.create_task(front.run())

        async def send(raw: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

        answers = [
            await send(raw)
            for raw in (
                request("/v1/responses", *UPGRADE, "Origin: http://localhost:3000"),
                request("/v1/responses", *UPGRADE, "Origin: https://app.example.com"),
                request("/v1/responses", *UPGRADE),
                request("/v1/responses", "Origin: https://evil.example", "Content-Length: 0", method="POST"),
                request("/v1/responses", "Content-Length: 0", method="POST"),
            )
        ]
        front.close()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return answers, handed

    answers, handed = asyncio.run(main())
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [
        b"HTTP/1.1 403 Forbidden",
        b"HTTP/1.1 101 Switching Protocols",
        b"HTTP/1.1 101 Switching Protocols",
        b"HTTP/1.1 403 Forbidden",
        b"HTTP/1.1 200 OK",
    ]
    assert handed == ["websocket", "websocket", "http"]
    error = json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "origin_not_allowed" and error["type"] == "invalid_request_error"
    assert "http://localhost:3000" in error["message"]


def test_the_snippets_of_docs_operations_md_mean_what_it_says(tmp_path):
    """The YAML, --set and environment forms docs/operations.md shows, verbatim."""
    path = tmp_path / "c.yaml"
    path.write_text('server:\n  allowed_origins: ["https://app.example.com", "http://localhost:*"]\n')
    wanted = ("https://app.example.com", "http://localhost:*")
    assert load_app_config(path, environ={}).server.allowed_origins == wanted
    assert (
        load_app_config(
            None, environ={}, sets=['server.allowed_origins=[https://app.example.com, "http://localhost:*"]']
        ).server.allowed_origins
        == wanted
    )
    assert load_app_config(
        None, environ={"RESPONSES_WS_SERVER__ALLOWED_ORIGINS": '["*"]'}
    ).server.allowed_origins == ("*",)
