"""Ray Serve deployment of the gateway: the only module of ``serve/`` importing Ray besides
the composition root.

A ``Gateway`` replica listens on the configured port itself (``SO_REUSEPORT``: replicas on
one node share it) rather than behind Serve's HTTP proxy.  WebSocket upgrades are handed to
session actors started on the same node (a file descriptor cannot cross nodes); HTTP is
served in-process.  docs/architecture.md has the measurements behind this choice.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import uuid
from collections import Counter
from typing import Any

import ray
import uvicorn
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.host.actor import PhaseMetrics, ServeInference, SessionHost
from actors.errors import (
    APIError,
    InvalidResumeToken,
    ServerError,
    ServerShuttingDown,
    TooManyConnections,
)
from actors.protocol import http_error_body
from actors.host.resume import RESUME_HEADER, parse_token
from actors.host.handoff import Handoff, handoff_path, send_socket
from store import open_store
from store.writer import StoreWriter

from .app import build_app
from .auth import KeyRing
from .config import AppConfig
from .front import (
    Front,
    bind_socket,
    close_websocket,
    refuse,
    request_headers,
    wants_append_mode,
)
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
        self._prefix = uuid.uuid4().hex[:12]
        self._sock_ids = itertools.count()
        self._draining = False
        self._pool = ActorPool(
            create=lambda name: SessionHost.options(name=name, num_cpus=0, scheduling_strategy=here).remote(
                cfg.session, cfg.store, name),
            kill=lambda actor: ray.kill(actor, no_restart=True),
            per_actor=cfg.session.connections_per_actor,
            warm=cfg.session.warm_actors,
            prefix=f"rws-{self._prefix}",
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
        token = headers.get(RESUME_HEADER)
        try:
            owner = self._keys.owner(headers)
            if self._draining:
                raise ServerShuttingDown()
            resume = parse_token(token) if token is not None else None
            self._admit_connection(owner)
        except APIError as exc:
            await refuse(sock, *http_error_body(exc))  # 400/401/429/503 on the upgrade: no socket opens
            return
        lease: Lease | None = None
        try:
            if resume is None:
                lease = await self._pool.acquire()
                actor, path, conn_id, secret = lease.host.actor, lease.host.handoff_path, lease.conn_id, None
            else:
                name, conn_id, secret = resume
                actor, path = await self._resume_target(name)
            sock_id = f"{self._prefix}-s{next(self._sock_ids)}"
            send_socket(path, Handoff(sock_id, conn_id, owner, wants_append_mode(head, headers), secret), sock)
        except Exception as exc:  # noqa: BLE001 - the actor is gone (or on another node)
            self._open[owner] -= 1
            if lease is not None:
                self._pool.release(lease, dead=True)
            log.warning("handing a socket over failed: %r", exc)
            await refuse(sock, *http_error_body(InvalidResumeToken() if resume else ServerError()))
            return
        # We keep our copy of the socket while the actor serves it: should the actor die,
        # the client still gets a clean close (1011) rather than a dead TCP connection.
        task = asyncio.get_running_loop().create_task(self._watch(actor, sock_id, conn_id, owner, sock, lease))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _resume_target(self, actor_name: str) -> tuple[Any, str]:
        """The actor a resume token names (any gateway on its node can reach it).  The
        lookup is a blocking call to Ray's control store: off the event loop."""
        try:
            return await asyncio.to_thread(ray.get_actor, actor_name), handoff_path(actor_name)
        except ValueError:
            raise InvalidResumeToken() from None

    def _admit_connection(self, owner: str) -> None:
        limits = self._limits
        if sum(self._open.values()) >= limits.max_connections:
            raise TooManyConnections("The server is at its connection limit; retry later.", per_key=False)
        if self._open[owner] >= limits.max_connections_per_key:
            raise TooManyConnections(
                f"Too many open WebSocket connections for this API key ({limits.max_connections_per_key}).",
                per_key=True)
        self._open[owner] += 1

    async def _watch(self, actor: Any, sock_id: str, conn_id: str, owner: str, sock: socket.socket,
                     lease: Lease | None) -> None:
        """Follow one handed-over socket until it ends.  The lease (the actor's slot) is
        held by the socket that created the connection state, until that state is gone —
        which for a parked or resumed state is later than the socket's end."""
        outcome, dead = "closed", False
        try:
            outcome = await actor.serve.remote(sock_id)
        except Exception:  # noqa: BLE001 - the actor died, with the connection's state
            log.warning("session actor died while serving a connection")
            dead = True
            close_websocket(sock, 1011, "session ended by a server fault")
        finally:
            sock.close()
            self._open[owner] -= 1
        if lease is None:
            return
        if outcome in ("parked", "moved") and not dead:
            try:
                await actor.wait_gone.remote(conn_id)
            except Exception:  # noqa: BLE001
                dead = True
        self._pool.release(lease, dead=dead)

    async def stats(self) -> dict[str, Any]:
        """Open sockets and the session-actor pool (no keys, no ids): for operators and
        the fault-injection tests."""
        return {"open_connections": sum(self._open.values()), "draining": self._draining,
                **self._pool.stats()}

    async def check_health(self) -> None:
        if self._serving.done():
            raise RuntimeError("gateway listener stopped")

    async def __del__(self) -> None:
        """Graceful shutdown (Serve calls this on delete, redeploy and scale-down): take no
        new connections (other replicas on the node still do), let HTTP requests and
        WebSocket responses in flight finish for up to ``server.drain_timeout_s``, close
        the sockets with 1001, write everything pending to the store."""
        self._draining = True
        self._front.close()
        timeout = self._limits.drain_timeout_s
        log.info("draining: no new connections; up to %.0f s for work in flight", timeout)
        await asyncio.gather(self._front.drain_http(timeout),
                             *(host.actor.drain.remote(timeout) for host in self._pool.hosts()),
                             return_exceptions=True)
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        await self._store.close()  # pending stored responses and ledger lines are written
        self._pool.shutdown()
