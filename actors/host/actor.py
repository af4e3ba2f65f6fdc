"""The session host actor.

One ``SessionHost`` actor owns the state of the connections assigned to it — up to
``connections_per_actor`` of them (1024 by default; the gateway's pool packs them,
serve/pool.py).  It terminates those WebSockets itself (the gateway
hands the accepted socket over, see :mod:`actors.host.server`), so client frames reach the
session core without a Ray hop; the one hop per turn is the model call through the
inference seam (:mod:`actors.backend`; plus, with the opt-in what-if services on, one call to
each of them before it: docs/whatif.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import Protocol

import ray
from starlette.types import ASGIApp

from inference import allocator, collector, priority, tokenizer
from store import StoreConfig, StoreWriter, open_writer, redis_password
from store.connection_states import ContinuityStore

from ..backend import InferenceClient
from ..backend.model_router import ModelRouter, model_formats
from ..backend.ray_serve import ServeInference
from ..config import SessionConfig
from ..core.cache_budget import CacheBudget
from ..core.lanes import HostBudget
from ..core.prepare import SharedParts
from ..core.prompt_parts import PromptParts
from ..core.session import Session
from ..logs import LogSettings
from ..logs import configure as configure_logs
from .connection import Connection
from .continuity import HostContinuity
from .drain import DrainPlan
from .handoff import Ended, Handoff, HandoffReceiver, Link, Outcome, SocketKind, StateGone, handoff_path
from .host_metrics import HostMetrics, PhaseMetrics, refresh_s
from .http import HttpServer
from .lifecycle import close_taken_over
from .limits import raise_open_files
from .loop_watch import LoopWatch
from .resume import ResumeRegistry
from .server import Served, SocketServer
from .terminal_writes import Checkpoint

log = logging.getLogger(__name__)


class HttpAppFactory(Protocol):
    """Builds the ASGI app of HTTP mode on a host from the host's own store writer, inference
    client, model ids and metrics (the gateway passes it in)."""

    def __call__(
        self,
        *,
        store: StoreWriter,
        inference: InferenceClient,
        model_ids: Callable[[], list[str]],
        observe: Callable[[str, dict[str, float]], None] | None,
        on_refused: Callable[[int], None] | None,
    ) -> ASGIApp: ...


@ray.remote(num_cpus=0)
class SessionHost:
    """Named by the gateway's pool: a resume token names the host holding the state.

    Sockets arrive over handoff links (:mod:`.handoff`), WebSockets and HTTP connections
    alike; the host reports each socket's end on the link it came by.  No Ray call per
    connection: the gateway calls the actor only to start, warm and drain it."""

    def __init__(
        self,
        config: SessionConfig,
        store: StoreConfig,
        name: str,
        http_app: HttpAppFactory | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        if logs is not None:  # the gateway's (actors/logs.py)
            configure_logs(logs)
        allocator.tune()  # each turn's prompt ids and echoing frames: buffers of hundreds of KB
        raise_open_files(config.open_files)  # a descriptor per held connection
        priority.prefer(config.nice)  # its event loop ahead of the node's other processes for a core
        self._name = name
        self._config = config
        self._store_config = store
        self._store: StoreWriter | None = None
        self._serve = ServeInference(config)
        self._inference = ModelRouter.of(self._serve, config)  # the real models' engines too
        self._formats = model_formats(config)
        self._models: list[str] = []
        self._sockets: SocketServer | None = None  # once ready: it needs the store's continuity
        self._receiver = HandoffReceiver(handoff_path(name), self._on_socket)
        self._metrics = PhaseMetrics(config.phase_sample_every)
        self._host_metrics = HostMetrics(name)
        self._gauges: asyncio.Task[None] | None = None  # its held gauges set again, once ready
        self._websockets = 0  # being served now
        self._http_app = http_app
        self._http: HttpServer | None = None
        self._cache: HostBudget = CacheBudget(config.host_max_cached_tokens)  # shared by its connections
        self._prompt_parts: SharedParts = PromptParts()  # instructions and tools, rendered once a host
        # Each response's loop_lag timing, and young collections held while the loop is
        # behind; runs while WebSockets are open.
        self._loop_watch = LoopWatch(pacing=collector.BurstPacing())
        self._draining: asyncio.Task[None] | None = None
        self._continuity: HostContinuity | None = None  # resume on any node (a Redis store)

    async def ready(self) -> str:
        """Warm up before a connection is assigned; returns the handoff path.

        The first calls through a fresh handle and loading the tokenizer cost up to a
        second (docs/architecture.md): they are paid here, not on a client's first turn."""
        self._models = await self._inference.warm()
        tokenizer.encode("warm up")
        self._store = await open_writer(
            self._store_config,
            self._name,
            on_failure=self._host_metrics.store_write_failed,
            observer=self._host_metrics.store_replication,
        )
        if self._http_app is not None:
            self._http = HttpServer(
                self._http_app(
                    store=self._store,
                    inference=self._inference,
                    model_ids=lambda: list(self._models),
                    observe=self._metrics.observe,
                    on_refused=self._host_metrics.refused,
                )
            )
        registry = ResumeRegistry(self._config.resume_grace_s)
        continuity: HostContinuity | None = None
        if self._config.resume_grace_s > 0 and self._store_config.backend == "redis":
            continuity = HostContinuity(
                ContinuityStore(
                    self._store_config.redis_url,
                    self._store_config.key_prefix,
                    ttl_s=self._config.resume_grace_s,
                    cluster=self._store_config.redis_cluster,
                    password=redis_password(self._store_config),
                ),
                self._name,
                self._config.resume_grace_s,
                functools.partial(close_taken_over, registry),
            )
            continuity.start()
        self._continuity = continuity
        self._sockets = SocketServer(
            self._config,
            self._name,
            self._new_session,
            self._connect,
            registry=registry,
            continuity=continuity,
        )
        self._receiver.start()
        self._gauges = asyncio.get_running_loop().create_task(self._hold_gauges())
        collector.freeze_startup()  # a full collection under load walks only the connections' objects
        collector.serving()  # and collections come as rarely as its connections' garbage allows
        return self._receiver.path

    async def _hold_gauges(self) -> None:
        """The host's gauges stay exported while their values hold (``HeldGauge``)."""
        period_s = refresh_s()
        while True:
            await asyncio.sleep(period_s)
            self._host_metrics.refresh()

    def _new_session(self, conn_id: str, owner: str, append_mode: bool) -> Session:
        return Session(
            self._config,
            self._models,
            session_key=conn_id,
            owner=owner,
            append_mode=append_mode,
            clock=time.time,
            cache=self._cache,
            formats=self._formats,
            check_metadata=self._inference.check_metadata,
            prompt_parts=self._prompt_parts,
            loop_lag=self._loop_watch.worst_since,
        )

    def _connect(self, session: Session, checkpoint: Checkpoint | None) -> Connection:
        assert self._store is not None
        return Connection(session, self._inference, self._store, self._metrics.observe, checkpoint=checkpoint)

    async def _on_socket(self, sock: socket.socket, handoff: Handoff, link: Link) -> None:
        """Serve one handed-over socket; report its end (and, for a connection state it
        parked, when that is gone) on ``link``."""
        if handoff.kind is SocketKind.HTTP:
            try:
                if self._http is None:
                    sock.close()
                else:
                    await self._http.serve(sock, keep_alive=handoff.keep_alive)
            finally:
                link.notify(Ended(handoff.sock_id, Outcome.CLOSED))
            return
        assert self._sockets is not None  # sockets arrive once ready
        served = Served(Outcome.REFUSED, None)
        self._count_websockets(+1)
        try:
            served = await self._sockets.serve(sock, handoff)
        except Exception:
            log.exception("serving a WebSocket failed")
            sock.close()
        finally:
            outcome = served.outcome
            self._count_websockets(-1)
            link.notify(Ended(handoff.sock_id, outcome))
            # The client no longer waits on us: make its stored responses and ledger durable.
            assert self._store is not None
            await self._store.flush()
            if self._sockets.idle:
                allocator.release()  # what its connections freed goes back to the OS
        if served.created is not None and outcome.keeps_slot:  # the state this socket brought (or took) here
            await asyncio.shield(served.created.gone)
            link.notify(StateGone(handoff.conn_id))

    def _count_websockets(self, delta: int) -> None:
        self._websockets += delta
        if self._websockets > 0:
            self._loop_watch.start()
        else:
            self._loop_watch.stop()
        self._host_metrics.connections(self._websockets)

    async def stats(self) -> dict[str, str | int | bool]:
        """What the Ray dashboard cannot show by itself (docs/operations.md)."""
        return {
            "name": self._name,
            "websockets": self._websockets,
            "idle": self._sockets is None or self._sockets.idle,
            "direct_calls": self._serve.direct_calls,
        }

    def __repr__(self) -> str:  # Ray's log prefix and the dashboard's actor "Repr"
        return f"SessionHost({self._name})"

    async def drain(self, plan: DrainPlan | float) -> None:
        """Shutdown: take no more sockets, finish responses and HTTP requests in flight
        within the plan's budget (a number: that many seconds), close the WebSockets with
        1012 in the plan's batches (:mod:`.drain`), write what is pending to the store.
        Called again while draining (a node's deadline learnt later), the stricter plan
        wins; each call returns when the drain is done."""
        if self._draining is not None:
            if self._sockets is not None:
                await self._sockets.drain(plan)
            await asyncio.shield(self._draining)
            return
        self._draining = asyncio.get_running_loop().create_task(self._drain(plan))
        await asyncio.shield(self._draining)

    async def _drain(self, plan: DrainPlan | float) -> None:
        budget = plan if isinstance(plan, int | float) else plan.budget_s
        self._receiver.close()
        await asyncio.gather(
            *([self._sockets.drain(plan)] if self._sockets is not None else []),
            *([self._http.drain(budget)] if self._http is not None else []),
        )
        self._serve.close()
        if self._continuity is not None:
            await self._continuity.close()
        if self._store is not None:
            await self._store.close()
