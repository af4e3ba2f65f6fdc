"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``, archived and
sub-agent rollouts alike): one ``{timestamp, type, payload}`` object per line.

Record types read:

- ``session_meta``: the base instructions' size (``base_instructions.text`` or
  ``instructions``); sub-agent rollouts carry the same record;
- ``turn_context``: the model;
- ``response_item``: ``message`` (a user/developer/system message is input, an assistant's
  is output text), ``reasoning`` (encrypted: its size is the token count's reasoning tokens),
  ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` (a call: its arguments' or
  freeform input's size), ``function_call_output`` / ``custom_tool_call_output`` (a tool
  result: its size, and the duration the tool recorded — ``Wall time: X seconds`` or
  ``metadata.duration_seconds``); hosted and client-side items (``web_search_call``,
  ``ghost_snapshot``, ``compaction``) are skipped, with why;
- ``event_msg``: ``token_count`` (``info.last_token_usage``: input, cached input, output and
  reasoning tokens of the response just finished); the others repeat response items;
- ``compacted``: a compaction: a new chain whose first input is the summary (``message``)
  and the ``replacement_history``.

Any other record type is skipped (and counted), never an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from .shape import Call, Compaction, Input, Reasoning, Record, Skip, Text, ToolOutput, Usage, tokens

RECORD_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted"})
_WALL_TIME = re.compile(r"Wall time: ([0-9]+(?:\.[0-9]+)?) seconds")
_OUTPUTS = {"function_call_output", "custom_tool_call_output"}
_NOT_REPLAYED = {
    "web_search_call": "a hosted tool the server does not run",
    "ghost_snapshot": "client-side snapshot, never sent to the model",
    "compaction": "opaque compaction item (its compacted record starts the new chain)",
    "compaction_summary": "opaque compaction item (its compacted record starts the new chain)",
}


def looks_like(obj: dict[str, Any]) -> bool:
    return obj.get("type") in RECORD_TYPES and "payload" in obj


def timestamp(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def content_text(content: Any) -> str:
    """The text of a message's content (a string or parts with ``text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def output_text_and_duration(output: Any) -> tuple[str, float | None, str | None]:
    """A tool output's text and the duration the tool recorded in it, if any."""
    if isinstance(output, dict):  # {"content": ..., "success": ...}
        output = output.get("content", "")
    text = content_text(output)
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
            seconds = data["metadata"].get("duration_seconds")
            if isinstance(seconds, (int, float)):
                return text, float(seconds), "metadata.duration_seconds"
    match = _WALL_TIME.search(text)
    if match:
        return text, float(match.group(1)), "wall_time"
    return text, None, None


class CodexReader:
    """Records of one rollout, fed line by line (``meta`` collects the session facts)."""

    format = "codex"

    def __init__(self) -> None:
        self.model: str | None = None
        self.instructions_tokens: int | None = None
        self._last_total: Any = None

    def feed(self, line: int, obj: dict[str, Any]) -> Iterator[Record]:
        kind, payload, t = obj.get("type"), obj.get("payload"), timestamp(obj.get("timestamp"))
        if not isinstance(payload, dict):
            yield Skip(line, str(kind), "no payload object")
        elif kind == "session_meta":
            base = payload.get("base_instructions")
            text = base.get("text") if isinstance(base, dict) else payload.get("instructions")
            if isinstance(text, str) and text:
                self.instructions_tokens = tokens(text)
        elif kind == "turn_context":
            if isinstance(payload.get("model"), str):
                self.model = payload["model"]
        elif kind == "response_item":
            yield from self._item(line, payload, t)
        elif kind == "event_msg":
            if payload.get("type") == "token_count":
                yield from self._token_count(line, payload)
        elif kind == "compacted":
            yield Compaction(line, t)
            size = tokens(str(payload.get("message", "")))
            for item in payload.get("replacement_history") or []:
                if isinstance(item, dict):
                    size += tokens(content_text(item.get("content"))) + tokens(str(item.get("arguments", "")))
            yield Input(line, "compaction_summary", size, t)
        else:
            yield Skip(line, str(kind), "record type not known to this reader")

    def _item(self, line: int, item: dict[str, Any], t: float | None) -> Iterator[Record]:
        kind = item.get("type")
        if kind == "message":
            text = tokens(content_text(item.get("content")))
            if item.get("role") == "assistant":
                yield Text(line, text, t=t)
            else:
                yield Input(line, str(item.get("role", "user")), text, t)
        elif kind == "reasoning":
            yield Reasoning(line, None, t=t)
        elif kind == "function_call":
            yield Call(
                line,
                str(item.get("call_id")),
                str(item.get("name")),
                "function",
                tokens(str(item.get("arguments", ""))),
                t=t,
            )
        elif kind == "custom_tool_call":
            yield Call(
                line,
                str(item.get("call_id")),
                str(item.get("name")),
                "custom",
                tokens(str(item.get("input", ""))),
                t=t,
            )
        elif kind == "local_shell_call":
            yield Call(
                line,
                str(item.get("call_id") or item.get("id")),
                "local_shell",
                "function",
                tokens(json.dumps(item.get("action", {}))),
                t=t,
            )
        elif kind in _OUTPUTS:
            output, duration, source = output_text_and_duration(item.get("output"))
            yield ToolOutput(line, str(item.get("call_id")), tokens(output), duration, source, t)
        else:
            yield Skip(line, f"response_item.{kind}", _NOT_REPLAYED.get(str(kind), "item type not replayed"))

    def _token_count(self, line: int, payload: dict[str, Any]) -> Iterator[Record]:
        info = payload.get("info")
        if not isinstance(info, dict) or not isinstance(info.get("last_token_usage"), dict):
            return
        total = info.get("total_token_usage")
        if total is not None and total == self._last_total:  # repeated (a rate-limit update)
            return
        self._last_total = total
        u = info["last_token_usage"]
        yield Usage(
            line,
            int(u.get("input_tokens", 0)),
            int(u.get("cached_input_tokens", 0)),
            int(u.get("output_tokens", 0)),
            int(u.get("reasoning_output_tokens", 0)),
        )
