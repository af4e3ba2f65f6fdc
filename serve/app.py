"""The gateway's HTTP app: ``/healthz`` and ``/v1/models`` (HTTP mode's routes are added
by :mod:`serve.http_api`).

WebSocket upgrades of ``/v1/responses`` never reach this app: :mod:`serve.front` hands them
to session actors before any HTTP parsing happens here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.errors import ModelNotFound
from actors.protocol import http_error_body

from .cors import OriginGuard
from .origins import OriginPolicy

log = logging.getLogger(__name__)


class ServerErrors:
    """Unexpected exceptions become a 500 OpenAI error body (``server_error``, the text is
    not leaked) and the keep-alive connection stays open.  (A Starlette handler for
    ``Exception`` would answer too, but then re-raise, and uvicorn closes the connection.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise  # a response is under way: nothing more can be said
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            status, body = http_error_body(exc)
            await JSONResponse(body, status_code=status)(scope, receive, send)


def build_app(
    list_models: Callable[[], Awaitable[list[dict]]],
    *,
    origins: OriginPolicy | None = None,
    on_refused: Callable[[int], None] | None = None,
) -> FastAPI:
    """The app; with ``origins``, every request's ``Origin`` is checked and allowed pages get
    CORS headers (serve/cors.py), refusals reported to ``on_refused``."""
    app = FastAPI(title="responses-ws", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(ServerErrors)
    if origins is not None:  # outermost: refusals and server errors alike get its headers
        app.add_middleware(OriginGuard, policy=origins, on_refused=on_refused)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": await list_models()}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> Any:
        for entry in await list_models():
            if entry["id"] == model_id:
                return entry
        status, body = http_error_body(ModelNotFound(model_id))
        return JSONResponse(body, status_code=status)

    return app
