"""``serve.app.ServerErrors``: an unexpected exception in an HTTP route answers the generic
500 body (``server_error``, its text not sent) and is not raised on, which would make the
server close the keep-alive connection."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from serve.app import ServerErrors


def test_an_unexpected_exception_answers_the_generic_500_and_is_not_raised_on() -> None:
    app = FastAPI()
    app.add_middleware(ServerErrors)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("internal detail /srv/app.py")

    async def main() -> httpx.Response:
        # ASGITransport raises what the app raises: a re-raise after answering fails here
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/boom")

    r = asyncio.run(main())
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert "internal detail" not in r.text and "/srv" not in r.text
