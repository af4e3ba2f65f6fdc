"""The ``instructions`` and ``tools`` a session host's connections resend with every create,
kept as parsed (:class:`Recurring`): :func:`~actors.protocol.requests.parse_client_event`
takes a create's resent ones from it instead of parsing and validating them again."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence

from ..errors import APIError
from .requests import Tool, flat, load_json_object
from .wire_types import JSONObject


class Recurring:
    """The ``instructions`` and ``tools`` a session host's connections resend with every
    create (a coding agent's several thousand words and its tool definitions, alike on every
    socket of one app), kept as parsed.

    A create whose ``instructions`` equal a kept text gets the kept string (one object:
    hashed once, compared by identity downstream).  Both are recognised by their bytes too:
    a text frame that holds the exact text of a kept ``"tools":[…]`` or ``"instructions":"…"``
    member is parsed with that member replaced by a stub naming a value of this process's own
    (:attr:`_mark`), and if each stub is then the create's ``tools`` or ``instructions``, the
    kept validated tools (the same list for every such create: prepared once a host by
    identity, :mod:`actors.core.prompt_parts`) are its tools, and the kept string its
    instructions, neither parsed nor validated again (a 4000-word text's JSON string is most
    of a create's parse: 21 of 28 µs); else the frame is parsed as it is.  Exact text, not
    equal values: ``1`` and ``1.0``, or keys in another order, echo differently.  A tools
    member is learnt from a create that had none kept, an instructions member from a create
    whose text is kept already (its second sighting), its span found and checked the same
    way.  The ``size`` most recent distinct values of each are kept; kept values are never
    changed.  Pure."""

    def __init__(self, size: int = 8, min_chars: int = 256, max_chars: int = 1_000_000) -> None:
        self._size = size
        self._min_chars = min_chars  # a shorter text or tools member is not worth keeping
        self._max_chars = max_chars  # nor a longer one, nor one looked for in a longer frame
        self._texts: list[str] = []  # most recent first
        self._tools: list[tuple[str, list[Tool]]] = []  # ('"tools":[…]' as sent, validated)
        self._members: list[tuple[str, str]] = []  # ('"instructions":"…"' as sent, the kept text)
        self._mark = f"\x00kept {secrets.token_hex(8)}"  # no client spells it
        self._stub = json.dumps(self._mark)
        self.hits = 0

    def text(self, value: str) -> str:
        """The kept string equal to ``value`` (kept now if it is new and long)."""
        if not self._min_chars <= len(value) <= self._max_chars:
            return value
        for i, kept in enumerate(self._texts):
            if kept is value or kept == value:
                if i:
                    self._texts.insert(0, self._texts.pop(i))
                if kept is not value:
                    self.hits += 1
                return kept
        self._texts.insert(0, value)
        del self._texts[self._size :]
        return value

    def stubbed(self, data: str) -> tuple[JSONObject, list[Tool] | None] | None:
        """``data`` parsed with its kept tools and instructions members stubbed out (its
        ``instructions`` then the kept string), and the kept tools (``None``: no tools member
        kept) — if ``data`` holds one of them and each is the create's own; else ``None``."""
        text = _found(data, self._members)
        # The tools member is not inside the instructions': past them if they come first.
        tools = _found(data, self._tools, 0 if text is None else text[0] + len(self._members[text[1]][0]))
        if tools is None and text is not None:
            tools = _found(data, self._tools, 0, text[0])
        if tools is None and text is None:
            return None
        spans = []
        if tools is not None:
            spans.append((tools[0], len(self._tools[tools[1]][0]), "tools"))
        if text is not None:
            spans.append((text[0], len(self._members[text[1]][0]), "instructions"))
        raw = self._parsed(data, spans)
        if raw is None:
            return None
        validated = None
        if tools is not None:
            self._tools.insert(0, self._tools.pop(tools[1]))
            validated = raw["tools"] = self._tools[0][1]
            self.hits += 1
        if text is not None:
            self._members.insert(0, self._members.pop(text[1]))
            raw["instructions"] = self.text(self._members[0][1])
            self.hits += 1
        return raw, validated

    def learn(self, data: str, validated: list[Tool]) -> None:
        """Keep ``data``'s top-level tools member (its exact text), whose tools ``validated``
        are, if it is long enough to be worth it."""
        member = self._member(data, _TOOLS_KEY)
        if member is not None:
            self._tools.insert(0, (member, validated))
            del self._tools[self._size :]

    def learn_text(self, data: str, kept: str) -> None:
        """Keep ``data``'s top-level instructions member (its exact text), whose value is
        ``kept``, if ``kept`` is a kept text (seen before) whose member is not kept yet."""
        if len(data) > 4 * self._max_chars or not any(t is kept for t in self._texts):
            return
        if any(v is kept for _, v in self._members):
            return
        member = self._member(data, _INSTRUCTIONS_KEY)
        if member is not None:
            self._members.insert(0, (member, kept))
            del self._members[self._size :]

    def _member(self, data: str, key: re.Pattern[str]) -> str | None:
        """The exact text of ``data``'s top-level member named by ``key`` (found, its value
        scanned, checked by stubbing it out), if long enough to be worth keeping."""
        if len(data) > 4 * self._max_chars:
            return None
        field = key.pattern[1 : key.pattern.index('"', 1)]
        for found in key.finditer(data):
            try:
                _, end = _SCANNER.raw_decode(data, found.end())
            except ValueError:
                continue
            if not self._min_chars <= end - found.start() <= self._max_chars:
                continue
            if self._parsed(data, [(found.start(), end - found.start(), field)]) is not None:
                return data[found.start() : end]
        return None

    def _parsed(self, data: str, spans: Sequence[tuple[int, int, str]]) -> JSONObject | None:
        """``data`` parsed with each ``(at, length, field)`` span stubbed as ``"field":
        mark``, if each stub is then the create's ``field`` (the span was its whole member)."""
        parts: list[str] = []
        pos = 0
        for at, length, field in sorted(spans):
            if at < pos:
                return None  # overlapping: not two members
            parts += (data[pos:at], f'"{field}":', self._stub)
            pos = at + length
        parts.append(data[pos:])
        try:
            raw = load_json_object("".join(parts))
        except APIError:
            return None
        raw = flat(raw)
        return raw if all(raw.get(field) == self._mark for _, _, field in spans) else None


def _found(
    data: str, kept: Sequence[tuple[str, object]], start: int = 0, end: int | None = None
) -> tuple[int, int] | None:
    """Where the first of the ``kept`` members that ``data[start:end]`` holds starts, and its
    index."""
    for i, (member, _) in enumerate(kept):
        at = _find(data, member, start, len(data) if end is None else end)
        if at >= 0:
            return at, i
    return None


def _find(data: str, member: str, start: int = 0, end: int | None = None) -> int:
    """Where ``member`` starts in ``data[start:end]`` (-1: nowhere): its first characters
    looked for, then the whole compared there (a long needle is several times slower to look
    for)."""
    end = len(data) if end is None else end
    head = member[:_HEAD]
    at = data.find(head, start, end)
    while at >= 0 and not data.startswith(member, at, end):
        at = data.find(head, at + 1, end)
    return at


_HEAD = 48
_TOOLS_KEY = re.compile(r'"tools"\s*:\s*')
_INSTRUCTIONS_KEY = re.compile(r'"instructions"\s*:\s*')
_SCANNER = json.JSONDecoder()
