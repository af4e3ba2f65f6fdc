"""The Ray Serve deployment wrapping ``Engine`` — the only module of ``inference`` that
imports Ray.

Each replica holds one engine (its own prefix cache), using the real monotonic clock.
Callers stream a response with::

    handle.options(stream=True, method_name="generate").remote(request)

and receive ``list[InferenceEvent]`` items (a few ms of tokens each, design.md §3).  The
app builder in ``serve/`` binds this deployment (this module never calls ``.bind()``) and
sets ``num_replicas`` from ``InferenceConfig.replicas``.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from inference import policy
from inference.engine import Engine
from inference.pacing import AsyncioSleeper, MonotonicClock
from inference.profiles import InferenceConfig
from inference.types import InferenceEvent, InferenceRequest


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
class InferenceDeployment:
    """Emulated inference replica: ``generate`` (streaming), ``models`` and ``stats``."""

    def __init__(self, config: InferenceConfig | dict[str, Any]) -> None:
        self._config = (
            config if isinstance(config, InferenceConfig) else InferenceConfig.model_validate(config)
        )
        clock = MonotonicClock()
        self._engine = Engine(self._config, clock, AsyncioSleeper(clock))
        self._created = int(time.time())
        # Load the tokenizer and the policy's corpus now (~0.2 s), not on the first request.
        policy.text_answer(1, random.Random(0))

    async def generate(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        """Stream one response; see ``Engine.generate``.  Errors (``ModelNotFound``,
        ``UnknownToolChoice``) are raised, never yielded."""
        async for chunk in self._engine.generate(request):
            yield chunk

    async def models(self) -> list[dict[str, Any]]:
        """The served models as OpenAI ``GET /v1/models`` entries."""
        return [
            {"id": p.id, "object": "model", "created": self._created, "owned_by": p.owned_by}
            for p in self._config.profiles
        ]

    async def stats(self) -> dict[str, Any]:
        """This replica's counters (requests, tokens, prefix-cache hit rate)."""
        return {"replica": _replica_tag(), **self._engine.stats()}


def _replica_tag() -> str | None:
    try:
        return serve.get_replica_context().replica_tag
    except Exception:  # RayServeException outside a replica (e.g. a unit test)
        return None
