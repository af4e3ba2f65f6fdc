"""WebSocket subprotocol negotiation on the upgrade (docs/protocol.md §1.2).

Some clients offer the subprotocol ``openai-beta.responses.v1`` and expect it echoed in
``Sec-WebSocket-Protocol`` (a browser fails the connection otherwise).  The server selects
it when it is offered, and only then; an upgrade that offers no subprotocol, or only others,
is accepted without one.
"""

from __future__ import annotations

from collections.abc import Sequence

from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

RESPONSES_SUBPROTOCOL = Subprotocol("openai-beta.responses.v1")


def select_subprotocol(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """The subprotocol to echo: ours if the client offered it, else none (never a refusal)."""
    return RESPONSES_SUBPROTOCOL if RESPONSES_SUBPROTOCOL in offered else None
