"""The ``instructions`` and ``tools`` a session host's connections resend with every create,
kept as parsed (:class:`Recurring`): :func:`~actors.protocol.requests.parse_client_event`
takes a create's resent ones from it instead of parsing and validating them again."""

from __future__ import annotations

import json
import re
import secrets

from ..errors import APIError
from .requests import Tool, flat, load_json_object
from .wire_types import JSONObject


class Recurring:
    """The ``instructions`` and ``tools`` a session host's connections resend with every
    create (a coding agent's several thousand words and its tool definitions, alike on every
    socket of one app), kept as parsed.

    A create whose ``instructions`` equal a kept text gets the kept string (one object:
    hashed once, compared by identity downstream).  Tools are recognised by their bytes: a
    text frame that holds the exact text of a kept ``"tools":[…]`` member is parsed with that
    member replaced by a stub naming a value of this process's own (:attr:`_stub`), and if
    the stub is then the create's ``tools``, the kept validated tools (the same list for
    every such create: prepared once a host by identity, :mod:`actors.core.prompt_parts`)
    are its tools, neither parsed nor validated again; else the frame is parsed as it is.
    Exact text, not equal values: ``1`` and ``1.0``, or keys in another order, echo
    differently.  A tools member is learnt from a create that had none kept, its span found
    and checked the same way.  The ``size`` most recent distinct values of each are kept;
    kept values are never changed.  Pure."""

    def __init__(self, size: int = 8, min_chars: int = 256, max_chars: int = 1_000_000) -> None:
        self._size = size
        self._min_chars = min_chars  # a shorter text or tools member is not worth keeping
        self._max_chars = max_chars  # nor a longer one, nor one looked for in a longer frame
        self._texts: list[str] = []  # most recent first
        self._tools: list[tuple[str, list[Tool]]] = []  # ('"tools":[…]' as sent, validated)
        self._mark = f"\x00tools {secrets.token_hex(8)}"  # no client spells it
        self._stub = '"tools":' + json.dumps(self._mark)
        self.hits = 0

    def text(self, value: str) -> str:
        """The kept string equal to ``value`` (kept now if it is new and long)."""
        if not self._min_chars <= len(value) <= self._max_chars:
            return value
        for i, kept in enumerate(self._texts):
            if kept == value:
                if i:
                    self._texts.insert(0, self._texts.pop(i))
                self.hits += 1
                return kept
        self._texts.insert(0, value)
        del self._texts[self._size :]
        return value

    def stubbed(self, data: str) -> tuple[JSONObject, list[Tool]] | None:
        """``data`` parsed with a kept tools member stubbed out, and that member's tools —
        if ``data`` holds one and it is the create's ``tools``; else ``None``."""
        for i, (member, validated) in enumerate(self._tools):
            at = _find(data, member)
            if at < 0:
                continue
            raw = self._parsed(data, at, len(member))
            if raw is None:
                return None
            if i:
                self._tools.insert(0, self._tools.pop(i))
            self.hits += 1
            return raw, validated
        return None

    def learn(self, data: str, validated: list[Tool]) -> None:
        """Keep ``data``'s top-level tools member (its exact text), whose tools ``validated``
        are, if it is long enough to be worth it."""
        if len(data) > 4 * self._max_chars:
            return
        for found in _TOOLS_KEY.finditer(data):
            try:
                _, end = _SCANNER.raw_decode(data, found.end())
            except ValueError:
                continue
            if not self._min_chars <= end - found.start() <= self._max_chars:
                continue
            if self._parsed(data, found.start(), end - found.start()) is not None:
                self._tools.insert(0, (data[found.start() : end], validated))
                del self._tools[self._size :]
                return

    def _parsed(self, data: str, at: int, length: int) -> JSONObject | None:
        """``data`` parsed with ``[at, at + length)`` stubbed, if the stub is then the
        create's ``tools`` (the span was its whole tools member)."""
        try:
            raw = load_json_object(data[:at] + self._stub + data[at + length :])
        except APIError:
            return None
        raw = flat(raw)
        return raw if raw.get("tools") == self._mark else None


def _find(data: str, member: str) -> int:
    """Where ``member`` starts in ``data`` (-1: nowhere): its first characters looked for,
    then the whole compared there (a long needle is several times slower to look for)."""
    head = member[:_HEAD]
    at = data.find(head)
    while at >= 0 and not data.startswith(member, at):
        at = data.find(head, at + 1)
    return at


_HEAD = 48
_TOOLS_KEY = re.compile(r'"tools"\s*:\s*')
_SCANNER = json.JSONDecoder()
