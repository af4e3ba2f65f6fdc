"""The inference seam over Ray Serve: the emulator's deployment (``inference.emulator.deployment``)
and, when on, the what-if services' deployments (``inference.emulator.whatif_deployment``), reached
through ``DeploymentHandle``s by name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping

from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from inference.channel import Endpoint
from inference.emulator.whatif import HopConfig, SafetyModelConfig
from inference.routing import routes_of
from inference.types import InferenceEvent, InferenceRequest

from ..config import SessionConfig
from . import BeforeCall, EventStream
from .direct import DirectCalls
from .emulator_metadata import check_emulator_metadata
from .whatif_hook import WhatIfServices


class ServeInference:
    """:class:`~actors.backend.InferenceClient` over the inference deployment's handle; its
    ``before_call`` is the what-if services when ``session.whatif`` turns any on.  With
    ``session.direct_inference`` (the default) a connection's calls stream over a direct
    channel to its pinned replica (:mod:`.direct`): those after its first, and its first too
    when the host holds a channel to the replica the deployment's router in this process
    would pick for it (its :class:`~inference.routing.Routes`, :meth:`_pick`)."""

    def __init__(self, config: SessionConfig) -> None:
        handle = serve.get_deployment_handle(config.inference_deployment, app_name=config.inference_app)
        self._generate = handle.options(stream=True, method_name="generate")
        self._handle = handle
        self._services = ServeServices(config)
        self.before_call: BeforeCall | None = (
            WhatIfServices(config.whatif, self._services) if config.whatif.enabled else None
        )
        self._app = config.inference_app
        self._direct = (
            DirectCalls(self._via_serve, self._endpoint, time.monotonic, self._pick)
            if config.direct_inference
            else None
        )

    async def warm(self) -> list[str]:
        """Pay the first-call costs of both handle paths (~100–300 ms) before any client
        does, with a prefill-only request outside any session; returns the model ids."""
        models = [m["id"] for m in await self._handle.models.remote()]
        probe = InferenceRequest(request_id="warm-up", model=models[0], prompt_token_ids=[], generate=False)
        async for _ in self.stream(probe):
            pass
        await self._services.warm()
        await self._open_channels()
        return models

    async def _open_channels(self) -> None:
        """Open the direct channel to each replica running now, so that a storm of first
        calls finds them open (:meth:`_pick` sends those to them): each through a key of
        the host's own pinned to that replica (``warm-up:<replica>``)."""
        routes = routes_of(self._app)
        if self._direct is None or routes is None:
            return
        opening = []
        for replica in routes.live:
            key = f"warm-up:{replica}"
            routes.pin(key, replica)
            task = self._direct.open(key, replica)
            if task is not None:
                opening.append(task)
        await asyncio.gather(*opening)

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        check_emulator_metadata(metadata)

    def stream(self, request: InferenceRequest) -> EventStream:
        return self._via_serve(request) if self._direct is None else self._direct.stream(request)

    def _pick(self, request: InferenceRequest) -> str | None:
        """The replica the inference deployment's router in this process (made by the
        handle's first call) would send ``request`` to, its key pinned there; ``None`` before
        the router has heard of any replica."""
        routes = routes_of(self._app)
        return None if routes is None else routes.first_call(request)

    async def _endpoint(self, session_key: str) -> Endpoint:
        """The channel endpoint of the replica ``session_key`` is pinned to (the router
        sends the ask where the key's calls go)."""
        return await self._handle.options(session_id=session_key).channel.remote()

    @property
    def direct_calls(self) -> int:
        """Calls made over a direct channel so far."""
        return 0 if self._direct is None else self._direct.direct_calls

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()

    async def _via_serve(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        """One streaming call through Serve.  A request with a ``session_key`` carries it as Serve's
        ``session_id``, which the inference deployment's router pins to one replica
        (prefix-cache locality, ``inference.emulator.deployment.SessionAffinityRouter``)."""
        generate = self._generate
        if request.session_key:
            generate = generate.options(session_id=request.session_key)  # shares the router
        response = generate.remote(request)
        assert isinstance(response, DeploymentResponseGenerator)  # the handle streams
        try:
            async for chunk in response:
                yield chunk
        finally:
            response.cancel()  # no-op when finished; frees the batch slot when cut short


class ServeServices:
    """:class:`~actors.backend.whatif_hook.Services` over the what-if deployments that are on."""

    def __init__(self, config: SessionConfig) -> None:
        def handle(c: HopConfig | SafetyModelConfig) -> DeploymentHandle | None:
            return (
                serve.get_deployment_handle(c.deployment, app_name=config.inference_app)
                if c.enabled
                else None
            )

        self._hop, self._safety = handle(config.whatif.hop), handle(config.whatif.safety_model)

    async def warm(self) -> None:
        for service in (self._hop, self._safety):
            if service is not None:
                await service.stats.remote()

    async def forward(self, tokens: int) -> None:
        assert self._hop is not None
        await self._hop.forward.remote(tokens)

    async def classify(self, tokens: int) -> None:
        assert self._safety is not None
        await self._safety.classify.remote(tokens)
