"""Finding session logs and reading them into shapes: files or folders (``*.jsonl`` under
them), each file's format detected from its first records (a Codex rollout or a Claude
Code log).  A file of another format, or one that cannot be read, is a :class:`LogError`
naming it and the line; a malformed line inside a known file is skipped and reported the
same way, and the rest of the file is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import claude, codex
from .shape import SessionShape, Skip, build

_SNIFF_LINES = 20


@dataclass(frozen=True)
class LogError:
    """A problem with a file (``line`` 0: the whole file) or one of its lines."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: {self.message}"


def find_logs(paths: Iterable[Path]) -> tuple[list[Path], list[LogError]]:
    """The files named, and the ``*.jsonl`` files under the folders named (sorted)."""
    files: list[Path] = []
    errors: list[LogError] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                errors.append(LogError(path, 0, "no *.jsonl files in this folder"))
            files += found
        elif path.is_file():
            files.append(path)
        else:
            errors.append(LogError(path, 0, "no such file or folder"))
    return files, errors


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, start=1):
            if text.strip():
                yield number, text


def _parse(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def detect(path: Path) -> codex.CodexReader | claude.ClaudeReader | LogError:
    """A reader for the file's format, judged on its first JSON objects."""
    try:
        seen = 0
        for _number, text in _lines(path):
            obj = _parse(text)
            if obj is None:
                continue
            if codex.looks_like(obj):
                return codex.CodexReader()
            if claude.looks_like(obj):
                return claude.ClaudeReader()
            seen += 1
            if seen >= _SNIFF_LINES:
                break
        first = next(_lines(path), None)
    except OSError as exc:
        return LogError(path, 0, f"cannot read: {exc.strerror or exc}")
    if first is None:
        return LogError(path, 0, "empty file")
    return LogError(
        path,
        first[0],
        "not a Codex rollout nor a Claude Code log "
        "(no {timestamp, type, payload} record, no Claude Code message line)",
    )


def read_session(path: Path) -> tuple[SessionShape | None, list[LogError]]:
    """The shape of one log, and the problems met (``None`` if it is not a known log)."""
    reader = detect(path)
    if isinstance(reader, LogError):
        return None, [reader]
    errors: list[LogError] = []

    def records():
        for number, text in _lines(path):
            obj = _parse(text)
            if obj is None:
                errors.append(LogError(path, number, "malformed line (not a JSON object): skipped"))
                yield Skip(number, "malformed", "not a JSON object")
                continue
            yield from reader.feed(number, obj)

    steps, skipped = build(records())
    if not steps:
        errors.append(LogError(path, 0, f"a {reader.format} log with no model responses: nothing to replay"))
        return None, errors
    session = SessionShape(
        label=path.name,
        format=reader.format,
        model=reader.model,
        steps=steps,
        skipped=skipped,
        tools=sorted({c.name for s in steps for c in s.calls}),
    )
    # What the first prompt holds beyond its items is the instructions and the tool
    # definitions (neither format records the definitions).
    first = steps[0].recorded
    beyond = max(0, first.input_tokens - sum(i.tokens for i in steps[0].inputs)) if first else None
    if reader.instructions_tokens is not None:
        session.instructions_tokens, session.instructions_source = reader.instructions_tokens, "recorded"
        session.tool_definition_tokens = max(0, (beyond or 0) - reader.instructions_tokens)
    elif beyond is not None:
        session.instructions_tokens, session.instructions_source = beyond, "inferred"
    return session, errors


def read_sessions(paths: Iterable[Path]) -> tuple[list[SessionShape], list[LogError]]:
    files, errors = find_logs(paths)
    sessions = []
    for path in files:
        session, problems = read_session(path)
        errors += problems
        if session is not None:
            sessions.append(session)
    return sessions, errors
