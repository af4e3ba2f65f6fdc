"""The gateway's HTTP app: ``/healthz`` and ``/v1/models`` (HTTP mode's routes are added
by :mod:`serve.http_api`).

WebSocket upgrades of ``/v1/responses`` never reach this app: :mod:`serve.front` hands them
to session actors before any HTTP parsing happens here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from actors.errors import ModelNotFound
from actors.protocol import http_error_body


def build_app(list_models: Callable[[], Awaitable[list[dict]]]) -> FastAPI:
    app = FastAPI(title="responses-ws", docs_url=None, redoc_url=None, openapi_url=None)

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
