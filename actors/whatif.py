"""What the opt-in what-if services (``session.whatif``, docs/whatif.md) charge a model call.

Pure: the session decides per model call how many tokens each service processes, and the
driver (:mod:`actors.host.connection`) makes the calls.  The rule is the keyword
classifier's (:mod:`actors.safety`), so the services cost the same per processed token on
every transport:

* a conversation continued from a state the connection carries (a WebSocket lane's cached
  response) reads only the tokens no request has read yet — the parent's output and the
  new input — and the classifier reads up to ``window_tokens`` of what came before again,
  as context;
* a conversation rebuilt from a stored record (HTTP ``previous_response_id``, a WebSocket
  cache miss) or resent whole (HTTP without ``previous_response_id``) carries nothing: every
  token of it is read again.

Like the keyword classifier, the services read the conversation's items, not the per-request
instructions and tool definitions; the hop forwards what the classifier reads except the
window.  The latest response's output is read by the next request that continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.whatif import WhatIfConfig

from .context import ContextEntry


@dataclass(frozen=True, slots=True)
class Charge:
    """Tokens each enabled service processes before a model call (``None``: service off)."""

    hop_tokens: int | None
    safety_tokens: int | None


def _charge(config: WhatIfConfig, new: int, before: int) -> Charge | None:
    """``new`` tokens not read yet, after ``before`` tokens already read."""
    if not config.enabled:
        return None
    window = min(config.safety_model.window_tokens, before)
    return Charge(hop_tokens=new if config.hop.enabled else None,
                  safety_tokens=new + window if config.safety_model.enabled else None)


def turn_charge(config: WhatIfConfig, parent: ContextEntry | None, input_tokens: int) -> Charge | None:
    """A response's first model call: its parent's unread tokens plus its input."""
    if parent is None:
        return _charge(config, input_tokens, 0)
    return _charge(config, parent.fresh_tokens + input_tokens, len(parent.tokens) - parent.fresh_tokens)


def resume_charge(config: WhatIfConfig, before: int, after: int) -> Charge | None:
    """An append-mode response's next model call: the conversation grew from ``before`` to
    ``after`` tokens (the paused call's output and the appended tool results)."""
    return _charge(config, after - before, before)


class WhatIfClient(Protocol):
    """The services as the driver calls them (:class:`actors.host.actor.ServeInference`)."""

    async def forward(self, tokens: int) -> None: ...

    async def classify(self, tokens: int) -> None: ...
