"""Web pages on the HTTP app (serve/cors.py): every request's ``Origin`` is checked — not only
a connection's first, which is all the gateway's front sees — refusals are counted, and an
allowed page gets CORS headers and answered preflights.  The app's requests here share one
keep-alive connection (one ASGI app, as a session host serves a handed-over connection)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from starlette.testclient import TestClient

from actors.host.http import HttpServer
from serve.app import build_app
from serve.origins import LOOPBACK_ORIGINS, OriginPolicy

PAGE = "http://localhost:5173"
EVIL = "https://evil.example"


async def no_models() -> list[dict]:
    return []


def app(refused: list[int]):
    return build_app(no_models, origins=OriginPolicy(LOOPBACK_ORIGINS), on_refused=refused.append)


def test_a_foreign_page_is_refused_and_counted_and_an_allowed_page_gets_cors_headers():
    refused: list[int] = []
    with TestClient(app(refused)) as client:
        plain = client.get("/v1/models")
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
        page = client.get("/v1/models", headers={"Origin": PAGE})
        assert page.status_code == 200
        assert page.headers["access-control-allow-origin"] == PAGE and "Origin" in page.headers["vary"]
        evil = client.get("/v1/models", headers={"Origin": EVIL})
        assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in evil.headers
        # An error answer to an allowed page carries the headers too (the page can read it).
        missing = client.get("/v1/models/nope", headers={"Origin": PAGE})
        assert missing.status_code == 404 and missing.headers["access-control-allow-origin"] == PAGE
    assert refused == [403]


def test_a_preflight_from_an_allowed_page_is_answered_and_from_a_foreign_page_refused():
    refused: list[int] = []
    asked = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    with TestClient(app(refused)) as client:
        ok = client.options("/v1/responses", headers={"Origin": PAGE, **asked})
        assert ok.status_code == 204
        assert ok.headers["access-control-allow-origin"] == PAGE
        assert set(ok.headers["access-control-allow-methods"].replace(" ", "").split(",")) >= {
            "GET",
            "POST",
            "DELETE",
        }
        assert ok.headers["access-control-allow-headers"] == "authorization,content-type"
        assert int(ok.headers["access-control-max-age"]) > 0
        bare = client.options(
            "/v1/responses", headers={"Origin": PAGE, "Access-Control-Request-Method": "GET"}
        )
        assert "Authorization" in bare.headers["access-control-allow-headers"]
        evil = client.options("/v1/responses", headers={"Origin": EVIL, **asked})
        assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    assert refused == [403]


@pytest.mark.parametrize("first_origin", [None, PAGE])
def test_every_request_of_a_keep_alive_connection_is_checked(first_origin):
    """A session host serving a handed-over connection (actors.host.http): the connection's
    first request passed the gateway's check; a later one from a foreign page is refused."""
    refused: list[int] = []
    server = HttpServer(app(refused))

    async def main() -> list[bytes]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        serving = asyncio.create_task(server.serve(ours))
        reader, writer = await asyncio.open_connection(sock=theirs)
        answers = []
        for origin in (first_origin, EVIL, first_origin):
            line = f"Origin: {origin}\r\n" if origin else ""
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{line}\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            answers.append(head.split(b" ")[1])
        writer.close()
        await serving
        return answers

    assert asyncio.run(main()) == [b"200", b"403", b"200"]
    assert refused == [403]
