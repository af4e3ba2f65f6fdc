"""What the lab's clients (bench/transports.py's agent turns, bench/runner's loops, the probes)
put in a conversation's creates and read back from its answers, whatever the transport.

- How each transport continues a conversation (:data:`STORE_BY_TRANSPORT`, :data:`RESENDS`):
  ``ws`` and ``http-chained`` send the new items with ``previous_response_id``
  (``http-chained`` with ``store: true``: the server loads the stored conversation);
  ``http-full`` resends the whole conversation each turn (:func:`output_as_input`),
  ``store: false``.
- The server's phase timings, asked for with ``metadata[TIMINGS_KEY] = "1"`` and read from
  the Response (:func:`server_timings`, :func:`model_seconds`).
"""

from __future__ import annotations

import json
from typing import Any

# ``store`` each transport's creates carry: the server loads http-chained's conversation from the
# store, http-full resends it; ws's is the caller's (None: a client's choice, False by default)
STORE_BY_TRANSPORT: dict[str, bool | None] = {"ws": None, "http-chained": True, "http-full": False}
RESENDS = frozenset({"http-full"})  # transports that resend the whole conversation every turn

TIMINGS_KEY = "responses_ws.timings"
INFERENCE_PHASES = ("queue", "prefill", "decode")


def store_for(transport: str, chosen: bool = False) -> bool:
    """The ``store`` flag of ``transport``'s creates (``chosen``: the caller's, where it may choose)."""
    fixed = STORE_BY_TRANSPORT[transport]
    return chosen if fixed is None else fixed


def output_as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as input items, for a full-conversation resend."""
    items: list[dict[str, Any]] = []
    for o in output:
        if o.get("type") == "function_call":
            items.append(
                {
                    "type": "function_call",
                    "call_id": o["call_id"],
                    "name": o["name"],
                    "arguments": o["arguments"],
                }
            )
        elif o.get("type") == "message":
            text = "".join(c.get("text", "") for c in o.get("content", []))
            items.append({"role": "assistant", "content": [{"type": "output_text", "text": text}]})
    return items


def server_timings(response: dict[str, Any] | None) -> dict[str, float] | None:
    """The server's phase timings (``metadata["responses_ws.timings"]``, a JSON string of
    milliseconds), or ``None`` when the server does not report them."""
    raw = ((response or {}).get("metadata") or {}).get(TIMINGS_KEY)
    if not raw or raw == "1":
        return None
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}


def model_seconds(server: dict[str, float] | None) -> float | None:
    """Seconds of emulated model time (queue + prefill + decode) in server timings."""
    if not server:
        return None
    return sum(server.get(p, 0.0) for p in INFERENCE_PHASES) / 1000.0
