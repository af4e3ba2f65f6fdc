"""The JSON of the echoed ``instructions`` and ``tools`` (tens of KB a coding agent resends
with every create), kept once a process for every encoder in it
(:class:`~actors.protocol.events.EventEncoder`): after a reconnect storm a session host's
connections all echo the same text and the same prepared tool list (shared by the host,
:mod:`actors.core.prompt_parts`), so each distinct value is encoded once a host, not once a
connection.

A text is kept by its content (a dict lookup hashes it once and compares it: microseconds,
against tens of microseconds to encode it); any other value (a tool list) by its identity,
the entry holding it so its id stays its own: echoed values are never changed once built
(``Tools.echoed``, actors.core.prepare).  Values whose JSON is short are encoded each time;
the least recently used go past ``max_chars`` of JSON.  Pure, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pydantic_core import to_json

DEFAULT_MAX_CHARS = 1_000_000  # of JSON kept: ~30 distinct 30 KB echoes (a storm needs one text and one list)
MIN_CHARS = 256  # shorter JSON is encoded each time (keeping it would cost more than it saves)


class EchoJSON:
    """``value`` → its JSON text (as :func:`pydantic_core.to_json` writes it), kept while
    the value is among the most recently used."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._max_chars = max_chars
        self._chars = 0
        # a text: by itself; anything else: by id, with the value held (its id stays its own)
        self._entries: OrderedDict[str | int, tuple[Any, str]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def json(self, value: Any) -> str:
        key: str | int = value if isinstance(value, str) else id(value)
        kept = self._entries.get(key)
        if kept is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return kept[1]
        text = to_json(value).decode()
        if len(text) < MIN_CHARS or len(text) > self._max_chars:
            return text
        self.misses += 1
        self._entries[key] = (value, text)
        self._chars += len(text)
        while self._chars > self._max_chars:
            _, (_, old) = self._entries.popitem(last=False)
            self._chars -= len(old)
        return text


PROCESS_ECHOES = EchoJSON()
"""The process's: every :class:`~actors.protocol.events.EventEncoder` not given its own."""
