"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``, sub-agent
logs ``agent-*.jsonl`` alike): one object per line, ``type`` ``user`` / ``assistant`` /
``system`` / ``summary`` / ….

Read:

- ``assistant``: one model response per ``message.id`` (a log line per content block):
  ``thinking`` (its size; a redacted or empty one is sized from the usage), ``text``,
  ``tool_use`` (a call: its ``input`` as JSON); ``message.usage``: ``input_tokens`` +
  ``cache_creation_input_tokens`` + ``cache_read_input_tokens`` is the prompt,
  ``cache_read_input_tokens`` the cached part; API-error notices (model ``<synthetic>``)
  are skipped;
- ``user``: text (a string or ``text`` blocks) is input, ``tool_result`` blocks are tool
  results; a tool's duration is ``toolUseResult.durationMs`` when recorded, else the time
  from its ``tool_use`` line to its result's line (which includes any approval wait);
  ``isCompactSummary`` marks the summary that opens a new chain;
- ``system`` with ``subtype: compact_boundary``: a compaction.

Sidechain lines inside a main log (a sub-agent's conversation) are skipped, as are
metadata lines (``summary``, ``file-history-snapshot``, ``queue-operation``, …).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .codex import content_text, timestamp
from .shape import Call, Compaction, Input, Reasoning, Record, Skip, Text, ToolOutput, Usage, tokens

LINE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "file-history-snapshot", "queue-operation", "progress"}
)
_METADATA = LINE_TYPES - {"user", "assistant", "system"}


def looks_like(obj: dict[str, Any]) -> bool:
    return obj.get("type") in LINE_TYPES and (
        "sessionId" in obj or "uuid" in obj or "leafUuid" in obj or "messageId" in obj
    )


class ClaudeReader:
    format = "claude"

    def __init__(self) -> None:
        self.model: str | None = None
        self.instructions_tokens: int | None = None  # not recorded: inferred from the usage
        self._sidechain: bool | None = None  # the log's own kind, from its first message
        self._call_times: dict[str, float] = {}

    def feed(self, line: int, obj: dict[str, Any]) -> Iterator[Record]:
        kind = obj.get("type")
        if kind in _METADATA:
            yield Skip(line, str(kind), "log metadata, not part of the conversation")
            return
        if kind not in ("user", "assistant", "system"):
            yield Skip(line, str(kind), "line type not known to this reader")
            return
        side = bool(obj.get("isSidechain"))
        if self._sidechain is None and kind != "system":
            self._sidechain = side
        if side and self._sidechain is False:
            yield Skip(line, str(kind), "a sub-agent's line in the main log (replay its own log)")
            return
        t = timestamp(obj.get("timestamp"))
        if kind == "system":
            if obj.get("subtype") == "compact_boundary":
                yield Compaction(line, t)
            else:
                yield Skip(line, f"system.{obj.get('subtype')}", "client notice, not sent as a message")
            return
        message = obj.get("message")
        if not isinstance(message, dict):
            yield Skip(line, str(kind), "no message object")
        elif kind == "assistant":
            yield from self._assistant(line, message, t)
        else:
            yield from self._user(line, obj, message, t)

    def _assistant(self, line: int, message: dict[str, Any], t: float | None) -> Iterator[Record]:
        if message.get("model") == "<synthetic>":
            yield Skip(line, "assistant", "an API error notice written by the client, not a model response")
            return
        self.model = message.get("model") or self.model
        rid = str(message.get("id") or f"line-{line}")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind in ("thinking", "redacted_thinking"):
                text = block.get("thinking") or ""
                yield Reasoning(line, tokens(text) if text else None, rid, t)
            elif kind == "text":
                yield Text(line, tokens(str(block.get("text", ""))), rid, t)
            elif kind == "tool_use":
                call_id = str(block.get("id"))
                if t is not None:
                    self._call_times[call_id] = t
                yield Call(
                    line,
                    call_id,
                    str(block.get("name")),
                    "function",
                    tokens(json.dumps(block.get("input", {}))),
                    rid,
                    t,
                )
            else:
                yield Skip(line, f"assistant.{kind}", "content block not replayed")
        usage = message.get("usage")
        if isinstance(usage, dict):
            cached = int(usage.get("cache_read_input_tokens") or 0)
            prompt = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
            yield Usage(line, prompt + cached, cached, int(usage.get("output_tokens") or 0), None, rid)

    def _user(
        self, line: int, obj: dict[str, Any], message: dict[str, Any], t: float | None
    ) -> Iterator[Record]:
        content = message.get("content")
        kind = "compaction_summary" if obj.get("isCompactSummary") else "user"
        if isinstance(content, str):
            yield Input(line, kind, tokens(content), t)
            return
        result = obj.get("toolUseResult")
        recorded = result.get("durationMs") if isinstance(result, dict) else None
        for block in content or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                call_id = str(block.get("tool_use_id"))
                if isinstance(recorded, (int, float)):
                    duration, source = recorded / 1000.0, "durationMs"
                elif t is not None and call_id in self._call_times:
                    duration, source = max(0.0, t - self._call_times[call_id]), "timestamps"
                else:
                    duration, source = None, None
                yield ToolOutput(
                    line, call_id, tokens(content_text(block.get("content"))), duration, source, t
                )
            elif block.get("type") == "text":
                yield Input(line, kind, tokens(str(block.get("text", ""))), t)
            else:
                yield Skip(line, f"user.{block.get('type')}", "content block not replayed (no text)")
