"""The session host actor: the only module of ``actors/`` that imports Ray.

One ``SessionHost`` actor owns the state of the connections assigned to it — exactly one by
default (``connections_per_actor``).  It terminates those WebSockets itself (the gateway
hands the accepted socket over, see :mod:`actors.host.server`), so client frames reach the
session core without a Ray hop; the one hop per turn is the streaming call to the inference
deployment through a Serve ``DeploymentHandle``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import AsyncIterator

import ray
from ray import serve
from ray.util import metrics

from inference import tokenizer
from inference.types import InferenceEvent, InferenceRequest

from ..config import SessionConfig
from .connection import Connection
from ..session import Session
from .server import SocketServer
from store import StoreConfig, StoreWriter, open_store


def release_free_heap() -> None:
    """Give the heap a finished connection freed back to the OS.  glibc keeps freed memory
    in its arenas, so an actor reused for connection after connection otherwise grows by
    1–2 MiB per heavy connection (docs/reliability.md, memory per connection)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


class ServeInference:
    """:class:`~actors.host.connection.InferenceClient` over a Serve deployment handle."""

    def __init__(self, config: SessionConfig) -> None:
        handle = serve.get_deployment_handle(config.inference_deployment, app_name=config.inference_app)
        self._generate = handle.options(stream=True, method_name="generate")
        self._handle = handle

    async def warm(self) -> list[str]:
        """Pay the first-call costs of both handle paths (~100–300 ms) before any client
        does, with a prefill-only request outside any session; returns the model ids."""
        models = [m["id"] for m in await self._handle.models.remote()]
        probe = InferenceRequest(request_id="warm-up", model=models[0], prompt_token_ids=[], generate=False)
        async for _ in self.stream(probe):
            pass
        return models

    async def stream(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        """One streaming call.  A request with a ``session_key`` carries it as Serve's
        ``session_id``, which the inference deployment's router pins to one replica
        (prefix-cache locality, ``inference.deployment.SessionAffinityRouter``)."""
        generate = self._generate
        if request.session_key:
            generate = generate.options(session_id=request.session_key)  # shares the router
        response = generate.remote(request)
        try:
            async for chunk in response:
                yield chunk
        finally:
            response.cancel()  # no-op when finished; frees the batch slot when cut short


class PhaseMetrics:
    """Ray metrics of per-response server time: one histogram by transport and phase."""

    BOUNDARIES = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000]

    def __init__(self) -> None:
        self._hist = metrics.Histogram(
            "responses_ws_phase_ms", description="Server time per response by phase (ms)",
            boundaries=self.BOUNDARIES, tag_keys=("transport", "phase"))

    def observe(self, transport: str, report: dict[str, float]) -> None:
        for phase, ms in report.items():
            self._hist.observe(ms, tags={"transport": transport, "phase": phase})


@ray.remote(num_cpus=0)
class SessionHost:
    """Named by the gateway's pool: a resume token names the actor holding the state."""

    def __init__(self, config: SessionConfig, store: StoreConfig, name: str) -> None:
        self._config = config
        self._store_config = store
        self._store: StoreWriter | None = None
        self._inference = ServeInference(config)
        self._models: list[str] = []
        self._sockets = SocketServer(config, name, self._new_session, self._connect)
        self._metrics = PhaseMetrics()

    async def ready(self) -> str:
        """Warm up before a connection is assigned; returns the handoff socket's path.

        The first calls through a fresh handle and loading the tokenizer cost up to a
        second: they are paid here, not on a client's first turn."""
        self._models = await self._inference.warm()
        tokenizer.encode("warm up")
        self._store = StoreWriter(open_store(self._store_config))
        self._sockets.start()
        return self._sockets.path

    def _new_session(self, conn_id: str, owner: str, append_mode: bool) -> Session:
        return Session(self._config, self._models, session_key=conn_id, owner=owner,
                       append_mode=append_mode, clock=time.time)

    def _connect(self, session: Session) -> Connection:
        assert self._store is not None
        return Connection(session, self._inference, self._store, self._metrics.observe)

    async def serve(self, sock_id: str) -> str:
        """Run the handed-over WebSocket ``sock_id`` until it closes, then make its stored
        responses and ledger lines durable (the client no longer waits on us).  Returns
        what became of the connection state (:class:`~actors.host.server.SocketServer`)."""
        try:
            return await self._sockets.serve(sock_id)
        finally:
            assert self._store is not None
            await self._store.flush()
            if self._sockets.idle:
                release_free_heap()

    async def wait_gone(self, conn_id: str) -> None:
        """Returns when the parked state of ``conn_id`` is resumed-and-closed or expired."""
        await self._sockets.wait_gone(conn_id)

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: finish responses in flight (up to ``timeout_s``), close the sockets
        with 1001, write what is pending to the store."""
        await self._sockets.drain(timeout_s)
        if self._store is not None:
            await self._store.close()
