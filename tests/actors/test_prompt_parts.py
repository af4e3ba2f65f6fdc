"""A session host's shared renderings of instructions and tools (actors.core.prompt_parts)."""

from __future__ import annotations

import json

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame
from actors.core.prepare import SharedParts
from actors.core.prompt_parts import PromptParts
from actors.core.session import Session
from tests.actors.test_session import MODEL, TOOL
from tests.support.session_driver import handled


def _first_turn(parts: SharedParts | None, instructions: str, tools: list[dict]):
    s = Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 1.0, prompt_parts=parts)
    frame = {
        "type": "response.create",
        "model": MODEL,
        "input": "hi",
        "instructions": instructions,
        "tools": tools,
    }
    return handled(s, ClientFrame(json.dumps(frame)))


def test_connections_of_a_host_render_a_shared_system_prompt_once_and_send_the_same_prompt():
    parts: SharedParts = PromptParts()
    text = "Be careful and thorough. " * 400
    alone = _first_turn(None, text, [TOOL])
    shared = [_first_turn(parts, text, [TOOL]) for _ in range(3)]
    assert (parts.instructions.misses, parts.instructions.hits) == (1, 2)
    assert (parts.tools.misses, parts.tools.hits) == (1, 2)
    (turn,) = alone.start
    for fx in shared:
        (other,) = fx.start
        assert other.request.prompt_token_ids == turn.request.prompt_token_ids
        assert other.request.tools == turn.request.tools
        assert fx.events[0].response.tools == alone.events[0].response.tools
    _first_turn(parts, text + " And brief.", [TOOL, {**TOOL, "name": "list_dir"}])
    assert (parts.instructions.misses, parts.tools.misses) == (2, 2), "other content: rendered"


def test_a_bad_tool_list_is_refused_every_time_and_never_kept():
    parts: SharedParts = PromptParts()
    bad = [TOOL, TOOL]  # a duplicate name
    for _ in range(2):
        (err,) = [e.model_dump() for e in _first_turn(parts, "x", bad).events]
        assert err["type"] == "error" and err["status"] == 400
    assert len(parts.tools) == 0 and parts.tools.misses == 2


def test_the_cache_is_bounded_by_the_size_of_its_keys_least_recently_used_first():
    parts: SharedParts = PromptParts(max_chars=2 * 3000)
    texts = [c * 1000 for c in "abcd"]
    for text in texts[:3]:
        _first_turn(parts, text, [])
    assert len(parts.instructions) == 3
    _first_turn(parts, texts[0], [])  # used again: now the most recent
    _first_turn(parts, texts[3], [])
    assert len(parts.instructions) == 3
    _first_turn(parts, texts[1], [])
    assert parts.instructions.misses == 5, "b was the least recently used: rendered again"


def test_tool_lists_share_a_rendering_exactly_when_their_content_is_the_same():
    """The shared key is the tools' content with its types and order: ``true`` is not ``1``,
    nor ``1`` ``1.0``, and keys in another order echo in another order."""
    parts: SharedParts = PromptParts()
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    tool = {**TOOL, "parameters": schema, "strict": True}
    variants = [
        tool,
        {**tool, "parameters": {**schema, "properties": {"n": {"type": "integer", "minimum": 1.0}}}},
        {**tool, "parameters": {"properties": schema["properties"], "type": "object"}},
        {**tool, "x_extra": 1},
        {**tool, "x_extra": True},
    ]
    for variant in variants:
        _first_turn(parts, "x", [variant])
    _first_turn(parts, "x", [json.loads(json.dumps(tool))])
    assert (parts.tools.misses, parts.tools.hits) == (5, 1)
