"""The session actor: the only module of ``actors/`` that imports Ray.

One ``SessionHost`` actor owns the state of the connections assigned to it — exactly one by
default (``connections_per_actor``).  The socket holder (the gateway) calls ``open``,
``feed`` (awaited in order: async actors run concurrent calls out of order), iterates the
streaming ``frames`` generator, and calls ``close`` on disconnect, which cancels generation.
Inference is a Serve deployment reached through a streaming ``DeploymentHandle``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection

import ray
from ray import serve

from inference.types import InferenceEvent, InferenceRequest

from .config import SessionConfig
from .connection import Connection
from .session import Session


class ServeInference:
    """:class:`~actors.connection.InferenceClient` over a Serve deployment handle."""

    def __init__(self, config: SessionConfig) -> None:
        handle = serve.get_deployment_handle(config.inference_deployment, app_name=config.inference_app)
        self._generate = handle.options(stream=True, method_name="generate")
        self._handle = handle

    async def warm(self) -> list[dict]:
        # The first call through a fresh handle costs ~100 ms (design.md §3): pay it before
        # a connection is assigned, and learn the model ids at the same time.
        return await self._handle.models.remote()

    async def stream(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        async for chunk in self._generate.remote(request):
            yield chunk


@ray.remote(num_cpus=0)
class SessionHost:
    def __init__(self, config: SessionConfig) -> None:
        self._config = config
        self._inference = ServeInference(config)
        self._models: Collection[str] = ()
        self._connections: dict[str, Connection] = {}

    async def ready(self) -> int:
        """Warm the inference handle; returns how many connections this actor may still take."""
        self._models = [m["id"] for m in await self._inference.warm()]
        return self._config.connections_per_actor - len(self._connections)

    async def open(self, conn_id: str) -> None:
        session = Session(self._config, self._models, session_key=conn_id, clock=time.time)
        self._connections[conn_id] = Connection(session, self._inference)

    async def feed(self, conn_id: str, data: str | bytes) -> None:
        conn = self._connections.get(conn_id)
        if conn is not None:
            conn.feed(data)

    async def frames(self, conn_id: str) -> AsyncIterator[list[str]]:
        conn = self._connections.get(conn_id)
        if conn is None:
            return
        async for batch in conn.frames():
            yield batch

    async def close(self, conn_id: str) -> int:
        """Drop the connection and cancel its generations; returns connections still hosted."""
        conn = self._connections.pop(conn_id, None)
        if conn is not None:
            await conn.close()
        return len(self._connections)
