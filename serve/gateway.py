"""Ray Serve deployment of the gateway: the only module of ``serve/`` importing Ray besides
the composition root.

A ``Gateway`` replica listens on the configured port itself (``SO_REUSEPORT``: replicas on
one node share it) rather than behind Serve's HTTP proxy.  WebSocket upgrades are handed to
session actors started on the same node (a file descriptor cannot cross nodes); HTTP is
served in-process.  docs/architecture.md has the measurements behind this choice.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections import Counter

import ray
import uvicorn
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.actor import PhaseMetrics, ServeInference, SessionHost
from actors.errors import APIError, TooManyConnections
from actors.protocol import http_error_body
from actors.socket_server import send_socket
from actors.store import open_store
from actors.store_writer import StoreWriter

from .app import build_app
from .auth import KeyRing
from .config import AppConfig
from .front import Front, bind_socket, refuse, request_headers, wants_append_mode
from .http_api import add_http_routes
from .pool import ActorPool, Lease

log = logging.getLogger(__name__)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class Gateway:
    async def __init__(self, config: dict, inference: DeploymentHandle) -> None:
        cfg = AppConfig.model_validate(config)
        self._models: list[dict] = await inference.models.remote()
        self._keys = KeyRing(cfg.server.api_keys)
        self._limits = cfg.server
        self._open: Counter[str] = Counter()  # open WebSockets per owner
        self._store = StoreWriter(open_store(cfg.store))
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._pool = ActorPool(
            create=lambda: SessionHost.options(num_cpus=0, scheduling_strategy=here).remote(
                cfg.session, cfg.store),
            kill=lambda actor: ray.kill(actor, no_restart=True),
            per_actor=cfg.session.connections_per_actor,
            warm=cfg.session.warm_actors,
            prefix=uuid.uuid4().hex[:12],
        )
        await self._pool.warm_up()
        self._connections: set[asyncio.Task[None]] = set()
        app = build_app(self._list_models)
        add_http_routes(app, session_config=cfg.session, keys=self._keys, store=self._store,
                        inference=ServeInference(cfg.session),
                        model_ids=lambda: [m["id"] for m in self._models],
                        observe=PhaseMetrics().observe)
        http = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                              timeout_keep_alive=30)
        self._front = Front(bind_socket(cfg.server.host, cfg.server.port), http, self._handoff)
        self._serving = asyncio.get_running_loop().create_task(self._front.run())

    async def _list_models(self) -> list[dict]:
        return self._models

    async def _handoff(self, sock: socket.socket, head: bytes) -> None:
        headers = request_headers(head)
        try:
            owner = self._keys.owner(headers)
            self._admit_connection(owner)
        except APIError as exc:
            refuse(sock, *http_error_body(exc))  # 401/429/503 on the upgrade: no socket opens
            return
        try:
            lease = await self._pool.acquire()
            send_socket(lease.host.handoff_path, lease.conn_id, owner, wants_append_mode(head, headers), sock)
        except BaseException:
            self._open[owner] -= 1
            raise
        finally:
            sock.close()  # the actor holds its own copy now (or the client sees a closed socket)
        task = asyncio.get_running_loop().create_task(self._run(lease, owner))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def _admit_connection(self, owner: str) -> None:
        limits = self._limits
        if sum(self._open.values()) >= limits.max_connections:
            raise TooManyConnections("The server is at its connection limit; retry later.", per_key=False)
        if self._open[owner] >= limits.max_connections_per_key:
            raise TooManyConnections(
                f"Too many open WebSocket connections for this API key ({limits.max_connections_per_key}).",
                per_key=True)
        self._open[owner] += 1

    async def _run(self, lease: Lease, owner: str) -> None:
        dead = False
        try:
            await lease.host.actor.serve.remote(lease.conn_id)
        except Exception:  # noqa: BLE001 - the actor died; its connection is gone with it
            log.exception("session actor failed")
            dead = True
        finally:
            self._pool.release(lease, dead=dead)
            self._open[owner] -= 1

    async def check_health(self) -> None:
        if self._serving.done():
            raise RuntimeError("gateway listener stopped")

    async def __del__(self) -> None:
        self._front.close()
        await self._store.close()  # pending stored responses and ledger lines are written
        self._pool.shutdown()
