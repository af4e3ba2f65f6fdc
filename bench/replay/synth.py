"""Re-synthesised requests of a recorded session: text at the recorded sizes, and each
step's scripted turn (``metadata["emulator.turn"]``, docs/replay.md) so the emulated model
answers with the recorded output shape.  Text is real English cl100k tokens, seeded by the
session and the item, so every transport sends the same conversation.
"""

from __future__ import annotations

import json
import random
from typing import Any

from ..texts import prose_text
from .shape import InputShape, SessionShape, StepShape

METADATA_VALUE_LIMIT = 512  # characters, per metadata value (the create's metadata)
# The create's metadata key of a scripted turn (docs/replay.md, "Scripted scenarios"):
# tests/bench/test_replay_formats.py checks it is the emulator's.
TURN_KEY = "emulator.turn"
_ROLES = {"user": "user", "developer": "developer", "system": "system", "compaction_summary": "user"}


def text(n_tokens: int, *seed: object) -> str:
    """About ``n_tokens`` tokens of English (exactly ``n_tokens`` before decoding; a cut
    word may re-encode one token apart)."""
    return prose_text(random.Random(":".join(map(str, seed))), n_tokens)


def tools(session: SessionShape) -> list[dict[str, Any]]:
    """A function tool per name the session called; their descriptions share the
    definitions' inferred size.  Arguments are one string, as the scripted turns send."""
    if not session.tools:
        return []
    each = session.tool_definition_tokens // len(session.tools)
    return [
        {
            "type": "function",
            "name": name,
            "description": text(each, session.label, "tool", name),
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
        }
        for name in session.tools
    ]


def base(session: SessionShape, model: str) -> dict[str, Any]:
    """The fields every request of the session carries."""
    body: dict[str, Any] = {"model": model, "tools": tools(session)}
    if session.instructions_tokens:
        body["instructions"] = text(session.instructions_tokens, session.label, "instructions")
    return body


def input_item(
    session: SessionShape, step: StepShape, i: int, item: InputShape, call_ids: dict[tuple[int, int], str]
) -> dict[str, Any] | None:
    """The request item for a recorded input; ``None`` for a tool output whose call the
    replay did not make."""
    body = text(item.tokens, session.label, step.index, i)
    if item.kind == "tool_output":
        call_id = call_ids.get(item.answers) if item.answers else None
        if call_id is None:
            return None
        return {"type": "function_call_output", "call_id": call_id, "output": body}
    return {"role": _ROLES.get(item.kind, "user"), "content": [{"type": "input_text", "text": body or "."}]}


def turn_script(step: StepShape) -> tuple[dict[str, Any], int]:
    """The scripted turn of a step, and how many of its calls did not fit in one metadata
    value (they are left out).  A step that recorded neither text nor calls answers with
    one token of text (a response needs an output)."""
    turn: dict[str, Any] = {}
    if step.reasoning_tokens:
        turn["reasoning_tokens"] = step.reasoning_tokens
    if step.text_tokens or not step.calls:
        turn["text_tokens"] = max(1, step.text_tokens)
    calls = [{"name": c.name, "arguments_tokens": c.argument_tokens} for c in step.calls]
    dropped = 0
    while True:
        if calls:
            turn["calls"] = calls
        if len(encode_turn(turn)) <= METADATA_VALUE_LIMIT or not calls:
            return turn, dropped
        calls, dropped = calls[:-1], dropped + 1
        if not calls:
            turn.pop("calls")
            turn.setdefault("text_tokens", 1)


def encode_turn(turn: dict[str, Any]) -> str:
    return json.dumps(turn, separators=(",", ":"))


def metadata(turn: dict[str, Any], timings_key: str) -> dict[str, str]:
    return {TURN_KEY: encode_turn(turn), timings_key: "1"}
