"""The gateway's ASGI app: ``/healthz``, ``/v1/models`` and WebSocket mode on ``/v1/responses``.

The gateway only pumps bytes: each client frame goes to the connection's session actor
(awaited in order), and the actor's frame batches come back through one long-lived Ray
streaming call per connection (spec §1; docs/architecture.md explains the hot path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from actors.errors import ConnectionLimitReached, ModelNotFound
from actors.protocol import encode, error_event, http_error_body

from .config import AppConfig
from .pool import ActorPool

log = logging.getLogger(__name__)

_CLOSE = object()


def build_app(config: AppConfig, pool: ActorPool, list_models: Callable[[], Awaitable[list[dict]]]) -> FastAPI:
    app = FastAPI(title="responses-ws", docs_url=None, redoc_url=None, openapi_url=None)
    lifetime = config.server.connection_lifetime_s

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

    @app.websocket("/v1/responses")
    async def responses_socket(ws: WebSocket) -> None:
        await ws.accept()
        lease = await pool.acquire()
        actor, conn_id = lease.actor, lease.conn_id
        outbox: asyncio.Queue[Any] = asyncio.Queue()

        async def pump_frames() -> None:
            async for ref in actor.frames.remote(conn_id):
                outbox.put_nowait(await ref)

        async def send_loop() -> None:
            while True:
                batch = await outbox.get()
                if batch is _CLOSE:
                    await ws.close(1000)
                    return
                for frame in batch:
                    await ws.send_text(frame)

        async def expire() -> None:
            await asyncio.sleep(lifetime)
            outbox.put_nowait([encode(error_event(ConnectionLimitReached(lifetime / 60)))])
            outbox.put_nowait(_CLOSE)

        tasks = [asyncio.create_task(t()) for t in (pump_frames, send_loop, expire)]
        sender = tasks[1]
        try:
            while not sender.done():
                receive = asyncio.create_task(ws.receive())
                await asyncio.wait({receive, sender}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                    break
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                await actor.feed.remote(conn_id, data)
        except WebSocketDisconnect:
            pass
        except Exception:  # noqa: BLE001
            log.exception("connection %s failed", conn_id)
        finally:
            for task in tasks:
                task.cancel()
            # Closing in the actor cancels any running generation, freeing its batch slot.
            await pool.release(lease)
            with contextlib.suppress(Exception):
                await ws.close(1011)

    return app
