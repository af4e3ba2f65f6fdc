"""Ray Serve deployments of the server side: the only module of ``serve/`` importing Ray.

``Gateway`` replicas terminate client sockets themselves: each runs uvicorn on the configured
port (``SO_REUSEPORT``, so several replicas on one node share it) instead of going through
Serve's HTTP proxy, which would add a proxy hop per frame and cap frames at 16 MiB
(docs/architecture.md has the measurements behind this choice).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import ray
import uvicorn
from ray import serve
from ray.serve.handle import DeploymentHandle

from actors.actor import SessionHost

from .app import build_app
from .config import AppConfig
from .pool import ActorPool

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class Gateway:
    async def __init__(self, config: dict, inference: DeploymentHandle) -> None:
        self._config = cfg = AppConfig.model_validate(config)
        self._inference = inference
        self._models: list[dict] | None = None
        session_cfg = cfg.session
        self._pool = ActorPool(
            create=lambda: SessionHost.options(num_cpus=0).remote(session_cfg),
            kill=lambda actor: ray.kill(actor, no_restart=True),
            per_actor=session_cfg.connections_per_actor,
            warm=session_cfg.warm_actors,
            prefix=uuid.uuid4().hex[:12],
        )
        await self._pool.warm_up()
        app = build_app(cfg, self._pool, self._list_models)
        server = cfg.server
        self._server = uvicorn.Server(uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            ws="websockets-sansio",
            ws_max_size=server.max_frame_bytes,
            ws_ping_interval=server.ping_interval_s,
            ws_ping_timeout=server.ping_timeout_s,
            ws_per_message_deflate=True,
            timeout_graceful_shutdown=5,
        ))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        sock = bind_socket(server.host, server.port)
        self._serving = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))

    async def _list_models(self) -> list[dict]:
        if self._models is None:
            self._models = await self._inference.models.remote()
        return self._models

    async def check_health(self) -> None:
        if self._serving.done():
            raise RuntimeError("gateway server stopped")

    async def __del__(self) -> None:
        self._server.should_exit = True
        self._pool.shutdown()
