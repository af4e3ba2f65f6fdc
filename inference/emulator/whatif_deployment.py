"""The what-if services as Ray Serve deployments (opt-in, docs/whatif.md).

Each replica holds one cost model of :mod:`inference.emulator.whatif` on the real monotonic clock and
really waits; ``num_cpus=0`` (they only sleep).  Callers send a token count, not the text:
what is emulated is the service's time, and shipping the text through Ray would add a cost
the hosted service does not have.  The app builder in ``serve/`` binds them with
:func:`whatif_options`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ray import serve

from inference.emulator.pacing import AsyncioSleeper, MonotonicClock
from inference.emulator.whatif import Hop, HopConfig, SafetyModel, SafetyModelConfig, ServiceReply

RECENT = 256  # token counts of the latest calls a replica keeps for stats()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class WhatIfSafetyModel:
    def __init__(self, config: dict) -> None:
        clock = MonotonicClock()
        self._model = SafetyModel(SafetyModelConfig.model_validate(config), clock, AsyncioSleeper(clock))
        self._recent: deque[int] = deque(maxlen=RECENT)

    async def classify(self, tokens: int) -> ServiceReply:
        self._recent.append(tokens)
        return await self._model.classify(tokens)

    async def stats(self) -> dict[str, Any]:
        return {"calls": self._model.calls, "tokens": self._model.tokens, "recent": list(self._recent)}


@serve.deployment(ray_actor_options={"num_cpus": 0})
class WhatIfHop:
    def __init__(self, config: dict) -> None:
        clock = MonotonicClock()
        self._hop = Hop(HopConfig.model_validate(config), clock, AsyncioSleeper(clock))
        self._recent: deque[int] = deque(maxlen=RECENT)

    async def forward(self, tokens: int) -> ServiceReply:
        self._recent.append(tokens)
        return await self._hop.forward(tokens)

    async def stats(self) -> dict[str, Any]:
        return {"calls": self._hop.calls, "tokens": self._hop.tokens, "recent": list(self._recent)}


def whatif_options(config: SafetyModelConfig | HopConfig) -> dict[str, Any]:
    """Options for ``.options(...)``: the deployment's name, replicas, ``num_cpus=0``."""
    return {
        "name": config.deployment,
        "num_replicas": config.replicas,
        "max_ongoing_requests": config.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": 0},
    }
