"""The gateway's Ray Serve deployment: it listens on the port, peeks at each request head and
hands the socket to a session host on its node.

A ``Gateway`` replica listens itself (replicas of one application on a node share one
listening socket, no other server may join: serve/port_claim.py), not behind Serve's HTTP
proxy.  WebSocket upgrades and HTTP-mode connections go to session hosts on the same node
(a file descriptor cannot cross nodes) over one handoff link per host, with no Ray call per
connection; health checks and the model list are answered here.  Where a socket goes is
serve/socket_routing.py; what the gateway holds per connection, and the limits,
serve/admission.py; the replica's drain, serve/replica_drain.py; the host pool,
serve/pool.py.  This class starts and stops the hosts, reads their links and wires the
pieces to Ray.  docs/architecture.md and
docs/scaling.md have the measurements behind this design.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import socket
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import ray
import uvicorn
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.backend.model_router import ModelRouter, model_entries
from actors.backend.ray_serve import ServeInference
from actors.errors import InvalidResumeToken
from actors.host.actor import PhaseMetrics, SessionHost
from actors.host.drain import DrainPlan
from actors.host.handoff import Ended, Link, Outcome, StateGone, handoff_path
from actors.host.limits import connection_budget, raise_open_files
from actors.logs import configure as configure_logs
from inference import collector
from inference.serve_autoscaling import CONNECTIONS, HTTP_IN_FLIGHT, ReportsLoad
from store import open_writer, replay

from .admission import Admission
from .app import build_app
from .auth import KeyRing
from .config import AppConfig
from .front import Front, bind_socket, close_websocket
from .gateway_metrics import GatewayMetrics
from .health import Probes, Readiness, add_readiness_route
from .http_api import add_http_routes, host_app
from .origins import OriginPolicy
from .pool import ActorPool, policy_from
from .port_claim import PortClaim
from .port_claim import claim as claim_port
from .ray_drain import NodeDrain, check_ray_version, current_node_id
from .replica_drain import Begun, ReplicaDrain, watch
from .socket_routing import SocketRouter

log = logging.getLogger(__name__)


@dataclass(eq=False)
class HostHandle:
    """A started session host as the gateway holds it: the actor and the link to it."""

    name: str
    actor: Any
    link: Link
    reader: asyncio.Task[None] | None = None


def _connection_budget(cfg: AppConfig) -> tuple[int, int]:
    """The open-file limit (raised as configured) and the connections it leaves room for: a
    descriptor per held connection (the gateway's copy), so past the limit the gateway could
    not accept; its connection cap is what the limit leaves (503 beyond)."""
    open_files = raise_open_files(cfg.session.open_files)
    max_connections = connection_budget(open_files, cfg.server.max_connections)
    if max_connections < cfg.server.max_connections:
        log.warning(
            "at most %d connections (server.max_connections %d): the open-file limit is %d",
            max_connections,
            cfg.server.max_connections,
            open_files,
        )
    return open_files, max_connections


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class Gateway(ReportsLoad):
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor; mypy allows none
        self, config: dict, inference: DeploymentHandle, **services: DeploymentHandle
    ) -> None:
        # ``services``: the what-if deployments when on and the Ray Serve LLM engines of
        # `serve_llm` models (serve/builder.py); session hosts reach them by name, so they
        # are only held here.
        cfg = AppConfig.model_validate(config)
        self._cfg = cfg
        # The only gateway on its node (one per session node): a stop by Serve (a scale-down)
        # drains the node, so /readyz fails first and the balancer moves away before sockets close.
        self._sole_on_node = cfg.server.gateway_max_replicas_per_node == 1
        open_files, max_connections = _connection_budget(cfg)
        check_ray_version()  # the drain watch reads Ray internals (serve/ray_drain.py)
        self._node_id = current_node_id()
        self._logs = cfg.logs  # the app's loggers, in this process and in its hosts
        configure_logs(self._logs)
        prefix = uuid.uuid4().hex[:12]
        writer = f"gateway-{prefix}"  # its store writer's name, and its degraded-shards gauge's label
        self._metrics = GatewayMetrics(writer)
        self._models: list[dict] = await inference.models.remote() + model_entries(cfg.session)
        self._keys = KeyRing(cfg.server.api_keys)
        # Resume on any node: states kept in the cluster store (actors/host/continuity.py).
        self._any_node = cfg.session.resume_grace_s > 0 and cfg.store.backend == "redis"
        self._foreign: dict[str, Link] = {}  # links to hosts of other gateways (resumes)
        self._store = await open_writer(
            cfg.store,
            writer,
            on_failure=self._metrics.store_write_failed,
            observer=self._metrics.store_replication,
        )
        self._here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._http_app = functools.partial(
            host_app,
            session_config=cfg.session,
            keys=self._keys,
            models=self._models,
            allowed_origins=list(cfg.server.allowed_origins),
        )
        self._init_drain_state()
        self._background: set[asyncio.Task[None]] = set()  # referenced until done (asyncio keeps weak refs)
        await self._init_hosts(cfg, open_files, max_connections, prefix)
        self._start_serving(inference)
        collector.freeze_startup()  # a full collection under load walks only the connections' objects

    def _init_drain_state(self) -> None:
        self._drain = ReplicaDrain()
        self._drain_task: asyncio.Task[None] | None = None
        self._poller = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="drain-watch")

    async def _init_hosts(self, cfg: AppConfig, open_files: int, max_connections: int, prefix: str) -> None:
        """The pool of session hosts on this node and the admission that hands them sockets."""
        self._pool = ActorPool(
            self._start_host,
            self._stop_host,
            policy_from(cfg.session, open_files),  # hosts are Ray workers of this node: the same limit
            prefix=f"rws-{prefix}",
            clock=time.monotonic,
        )
        self._admission: Admission[socket.socket, Link] = Admission(
            self._pool,
            max_connections=max_connections,
            max_connections_per_key=cfg.server.max_connections_per_key,
            prefix=prefix,
        )
        self._router = SocketRouter(
            self._keys,
            self._admission,
            self._pool,
            self._metrics,
            any_node=self._any_node,
            draining=lambda: self._drain.reason,
            link_to=self._link_to,
        )
        await self._pool.warm_up()

    def _start_serving(self, inference: DeploymentHandle) -> None:
        """Readiness, the listener, and the background loops (ticks, the drain watch)."""
        self._readiness = Readiness(
            Probes(
                listening=lambda: not self._serving.done(),
                draining=lambda: self._drain.reason or False,
                inference=inference.models.remote,
                store=self._store.store.probe,
            )
        )
        self._front, self._port_claim = self._listen(self._http_config())
        loop = asyncio.get_running_loop()
        self._serving = loop.create_task(self._front.run())
        self._ticking = loop.create_task(self._tick())
        self._watching = loop.create_task(
            watch(
                self._node_id,
                self._cfg.server.drain_poll_interval_s,
                self._poller,
                node_draining=self.node_draining,
                replica_stopping=lambda: self.begin_drain("Serve is stopping this replica", None, node=False),
                node_interval=self._cfg.server.node_drain_poll_interval_s,
            )
        )

    def _http_config(self) -> uvicorn.Config:
        """The routes served here: readiness, the model list, and HTTP mode for when no host
        is live."""
        cfg = self._cfg
        app = build_app(
            self._list_models,
            origins=OriginPolicy(cfg.server.allowed_origins),
            on_refused=self._metrics.refused,
        )
        add_readiness_route(app, self._readiness)
        add_http_routes(
            app,
            session_config=cfg.session,
            keys=self._keys,
            store=self._store,
            inference=ModelRouter.of(ServeInference(cfg.session), cfg.session),
            model_ids=lambda: [m["id"] for m in self._models],
            observe=PhaseMetrics(cfg.session.phase_sample_every).observe,
        )
        return uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=30
        )

    def _listen(self, http: uvicorn.Config) -> tuple[Front, PortClaim]:
        """The listener, once the port is ours: one server per port, so a process of another
        application on it fails this replica."""
        server = self._cfg.server
        owner = f"{serve.get_replica_context().app_name}@{ray.get_runtime_context().gcs_address}"
        listener, port_claim = claim_port(server.host, server.port, owner, bind_socket)
        front = Front(
            listener,
            http,
            self._router.websocket,
            self._router.http,
            OriginPolicy(server.allowed_origins),
            on_refused=self._metrics.refused,
        )
        return front, port_claim

    async def _list_models(self) -> list[dict]:
        return self._models

    # ------------------------------------------------------------------ hosts
    async def _start_host(self, name: str) -> HostHandle:
        actor = SessionHost.options(  # type: ignore[attr-defined]  # @ray.remote: mypy skips class decorators
            name=name, num_cpus=0, scheduling_strategy=self._here
        ).remote(self._cfg.session, self._cfg.store, name, self._http_app, self._logs)
        try:
            path = await actor.ready.remote()
            handle = HostHandle(name, actor, Link.connect(path))
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        handle.reader = asyncio.get_running_loop().create_task(self._read_link(handle.link, handle))
        return handle

    def _stop_host(self, handle: HostHandle) -> None:
        if handle.reader is not None:
            handle.reader.cancel()
        handle.link.close()
        ray.kill(handle.actor, no_restart=True)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._pool.tick()
            self._metrics.sample(self._admission.open_connections, self._pool)

    # ------------------------------------------------------------------ drains
    async def node_draining(self, deadline: float | None) -> None:
        """Ray marks this node draining, to be killed at ``deadline`` (Unix seconds; ``None``:
        no deadline).  What the drain watch calls on seeing it; tests and harnesses call it
        through the deployment handle too.  /readyz answers 503 from now; sockets close
        after ``server.drain_health_grace_s`` (the balancer notices first), in batches, all
        by the node's deadline less ``server.drain_deadline_margin_s``."""
        remaining = NodeDrain(self._node_id, deadline).remaining_s(time.time())
        await self.begin_drain("the node is draining", remaining, node=True)

    async def begin_drain(self, reason: str, remaining_s: float | None, *, node: bool) -> None:
        """Begin (or tighten) this replica's drain: ``remaining_s`` before the node's
        deadline (``None``: none); ``node``: Ray drains the node (hold /readyz at 503 while
        the balancer notices) rather than Serve stopping this replica (the port's other
        listeners on the node go on: close ours now — after the same hold when this gateway
        is alone on its node, as a scale-down of the session tier is)."""
        plan = DrainPlan.make(
            self._cfg.server.drain, remaining_s=remaining_s, hold=node or self._sole_on_node
        )
        now = time.monotonic()
        cut_off = self._drain.cut_off
        begun = self._drain.begin(reason, plan, now)
        if begun is Begun.BEGAN:
            self._ticking.cancel()  # no new hosts; pool stats stop
            log.warning(
                "draining (%s): /readyz 503, no new connections, %s; responses in flight get up to %.1f s",
                reason,
                f"sockets close after {plan.hold_s:.1f} s" if plan.hold_s else "sockets close now",
                plan.budget_s,
            )
            self._drain_task = asyncio.get_running_loop().create_task(self._drain_hosts(plan))
        elif begun is Begun.SOONER:  # the hosts take the sooner cut-off
            log.warning("drain (%s): cut-off moved %.1f s sooner", reason, cut_off - now - plan.budget_s)
            self._spawn(self._drain_hosts(plan))
        if not node:
            self._spawn(self._close_listener())

    async def _drain_hosts(self, plan: DrainPlan) -> None:
        hosts = list(self._pool.hosts())
        await asyncio.gather(
            *(h.handle.actor.drain.remote(plan.share(len(hosts))) for h in hosts), return_exceptions=True
        )

    async def _close_listener(self) -> None:
        """Stop listening once the hold is over (the balancer has seen /readyz fail): the
        port's other listeners on the node, if any, take new connections."""
        await asyncio.sleep(max(0.0, self._drain.hold_until - time.monotonic()))
        if self._drain.listener_closed:
            return
        self._drain.listener_closed = True
        self._port_claim.close()  # first: no replica that starts now gets the listener from here
        self._front.close()  # the replicas that share the listener go on accepting on it

    async def _read_link(self, link: Link, handle: HostHandle | None) -> None:
        """Notices from a host until its link ends; an end we did not cause means the host
        died, and its sockets get a clean close (1011) from our copies."""
        async for message, extra in link.messages():
            if extra is not None:
                extra.close()
            if isinstance(message, Ended):
                self._ended(message.sock_id, message.outcome)
            elif isinstance(message, StateGone):
                self._admission.gone(message.conn_id, link)
        if self._drain.reason:
            return
        log.warning("a session host died; closing its connections with 1011")
        if self._cfg.store.ledger_mode == "journal":  # committed lines leave no journal
            self._spawn(self._replay_journals())
        host = next((h for h in self._pool.hosts() if h.handle is handle), None)
        for sock in self._admission.host_died(link, host):
            close_websocket(sock, 1011, "session ended by a server fault")
        if host is not None:
            self._pool.host_died(host)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _replay_journals(self) -> None:
        """Commit the ledger journal a dead host left (store/journal.py) once the process is
        gone (reaped), so its clients' completed responses are billed without waiting for
        the next host to start."""
        for delay_s in (1.0, 5.0):
            await asyncio.sleep(delay_s)
            try:
                await replay(self._cfg.store.journal_dir, self._store.store)
            except Exception:
                log.warning("replaying a dead host's ledger journal failed", exc_info=True)

    def _ended(self, sock_id: str, outcome: Outcome) -> None:
        sock = self._admission.ended(sock_id, outcome)
        if sock is not None:
            sock.close()

    # ------------------------------------------------------------------ resumes
    def _link_to(self, name: str) -> Link:
        """The link to the host a resume token names: ours, or one of another gateway on this
        node (any gateway on the node can reach it)."""
        for host in self._pool.hosts():
            if host.name == name:
                return host.handle.link
        link = self._foreign.get(name)
        if link is None or link.closed:
            try:
                link = self._foreign[name] = Link.connect(handoff_path(name))
            except OSError:
                raise InvalidResumeToken() from None
            self._spawn(self._read_link(link, None))
        return link

    def load(self) -> dict[str, float]:
        """This node's connections for the session tier's autoscaling
        (``server.target_connections_per_node``): open WebSockets (a response in flight on
        one is counted as its connection) and HTTP requests being served."""
        http = self._admission.http_connections
        return {CONNECTIONS: self._admission.open_connections + http, HTTP_IN_FLIGHT: http}

    async def stats(self) -> dict[str, Any]:
        """Open sockets and the session-host pool (no keys, no ids): for operators and
        the fault-injection tests."""
        return {
            "open_connections": self._admission.open_connections,
            "draining": self._drain.reason,
            **self._pool.stats(),
        }

    async def check_health(self) -> None:
        await self._readiness.raise_unless_healthy()

    async def __del__(self) -> None:
        """Graceful shutdown (Serve calls this on delete, redeploy and scale-down; the drain
        watch may have begun it already): take no new connections (other replicas on the
        node still do; those accepted already are answered, typed: 503 with
        ``Retry-After``), let HTTP requests and WebSocket responses in flight finish within
        the drain's budget (``server.drain_timeout_s``, less before a node's deadline),
        close the sockets with 1012 (service restart) in batches, write everything pending
        to the store."""
        self._watching.cancel()
        await self.begin_drain("Serve is stopping this replica", None, node=False)
        await self._close_listener()  # after a node drain's hold, if one runs
        timeout = self._cfg.server.drain_timeout_s
        left = max(0.0, self._drain.started + timeout - time.monotonic())
        assert self._drain_task is not None
        await asyncio.gather(self._front.drain_http(left), self._drain_task, return_exceptions=True)
        deadline = time.monotonic() + 5
        while self._admission.open_connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self._store.close()  # pending stored responses and ledger lines are written
        self._pool.shutdown()
        self._poller.shutdown(wait=False)
