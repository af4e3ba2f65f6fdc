"""The opt-in what-if services (``session.whatif``, docs/whatif.md) as the one hook before each
model call (:class:`~actors.backend.BeforeCall`): the request passes the hop, then the safety
model reads it, each a timed phase of the response.

What a call is charged follows the keyword classifier's rule (:mod:`actors.core.safety`), so the
services cost the same per processed token on every transport: a call reads the tokens of
its conversation no earlier call read (:attr:`~actors.backend.ModelCall.unread_tokens` — a
continued conversation's latest output and new input, a rebuilt or resent one all of it),
and the classifier reads up to ``window_tokens`` of what came before again, as context.
Like the keyword classifier, the services read the conversation's items, not the
per-request instructions and tool definitions; the hop forwards what the classifier reads
except the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.emulator.whatif import WhatIfConfig

from . import ModelCall


@dataclass(frozen=True, slots=True)
class Charge:
    """Tokens each enabled service processes before a model call (``None``: service off)."""

    hop_tokens: int | None
    safety_tokens: int | None


def charge(config: WhatIfConfig, call: ModelCall) -> Charge | None:
    """What ``call`` costs each service; ``None`` when both are off."""
    if not config.enabled:
        return None
    new = call.unread_tokens
    window = min(config.safety_model.window_tokens, call.conversation_tokens - new)
    return Charge(
        hop_tokens=new if config.hop.enabled else None,
        safety_tokens=new + window if config.safety_model.enabled else None,
    )


class Services(Protocol):
    """The services' calls (their Serve deployments: :class:`actors.backend.ray_serve.ServeServices`)."""

    async def forward(self, tokens: int) -> None: ...

    async def classify(self, tokens: int) -> None: ...


class WhatIfServices:
    """The hook: charge the call, then call each enabled service, hop first."""

    def __init__(self, config: WhatIfConfig, services: Services) -> None:
        self._config = config
        self._services = services

    async def __call__(self, call: ModelCall) -> None:
        cost = charge(self._config, call)
        if cost is None:
            return
        if cost.hop_tokens is not None:
            with call.timer.service("hop"):
                await self._services.forward(cost.hop_tokens)
        if cost.safety_tokens is not None:
            with call.timer.service("safety_model"):
                await self._services.classify(cost.safety_tokens)
