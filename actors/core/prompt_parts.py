"""A session host's cache of the prompt parts its connections share: the instructions' tokens
and the prepared tool definitions, by content, bounded.

A coding agent resends several thousand tokens of instructions and a few dozen tool
definitions with every create; a connection keeps its latest (:class:`~actors.core.prepare.Preparer`),
so a steady turn does not render them again.  A host's connections mostly share them too:
after a reconnect storm every first turn carries the same system prompt.  This cache, one per
session host and handed to each of its WebSocket sessions, renders and validates each
distinct text or tool list once.  Keys are the content itself (the text; the tools' JSON) and
the chat format; the least recently used go past ``max_chars`` of keys.  Values are shared
and never changed (an ``array`` of token ids, a :class:`~actors.core.prepare.Tools`).

The host's parser keeps the instructions and tool lists its connections resend
(``recurring``, :class:`~actors.protocol.Recurring`): every create that resends them carries
the same objects, so a kept text's hash is computed once and a kept tool list is found by
its identity (:meth:`PromptParts.tools_of`) without computing its content key.  Pure.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..protocol import Recurring

DEFAULT_MAX_CHARS = 8_000_000  # of keys: ~100 distinct 8000-word prompts, ~100 MB at most with values
MAX_BY_IDENTITY = 64  # tool lists found by identity (each entry holds its list, so its id stays its own)

V = TypeVar("V")


class _Bounded(Generic[V]):
    def __init__(self, max_chars: int) -> None:
        self._max_chars = max_chars
        self._chars = 0
        self._entries: OrderedDict[tuple[str, str], V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str], make: Callable[[], V]) -> V:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        value = make()  # raises for a definition that fails validation: nothing is kept
        size = len(key[1])
        if size > self._max_chars:
            return value
        self._entries[key] = value
        self._chars += size
        while self._chars > self._max_chars:
            (_, old), _ = self._entries.popitem(last=False)
            self._chars -= len(old)
        return value

    def __len__(self) -> int:
        return len(self._entries)


class PromptParts(Generic[V]):
    """Instructions' tokens and prepared tools (``V``), by chat format and content."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.instructions: _Bounded[array[int]] = _Bounded(max_chars // 2)
        self.tools: _Bounded[V] = _Bounded(max_chars // 2)
        self.recurring = Recurring()
        self._by_identity: dict[tuple[int, str], tuple[Sequence[object], V]] = {}

    def tools_of(self, tools: Sequence[object], fmt: str, key: Callable[[], str], make: Callable[[], V]) -> V:
        """``tools`` prepared in chat format ``fmt``: found by the list's identity (a list
        the parser kept comes with every create that resends it), else by its content key
        (``key()``) in :attr:`tools`, else made there."""
        found = self._by_identity.get((id(tools), fmt))
        if found is not None and found[0] is tools:
            self.tools.hits += 1
            return found[1]
        value = self.tools.get((fmt, key()), make)
        if len(self._by_identity) >= MAX_BY_IDENTITY:
            self._by_identity.clear()
        self._by_identity[(id(tools), fmt)] = (tools, value)
        return value
