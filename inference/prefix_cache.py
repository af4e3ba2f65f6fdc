"""The per-replica prefix (KV) cache, first version: one entry per session.

Maps ``session_key`` to the token ids the KV cache holds for that session after its last
request (prompt + rendered output).  A new request reuses the longest common prefix of its
prompt and that entry.  Bounded LRU over sessions; entries are ``array("I")`` (4 bytes a
token rather than ~36 for a tuple of ints), since a long agent session holds 100k+ tokens.  Issue 3 replaces this with chained
hashes of token blocks shared across sessions (design.md §4).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

_BLOCK = 512  # compare in C-speed slices, then scan the first mismatching block


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two sequences of the same type (slices of
    both must compare element-wise: two tuples, two lists or two arrays)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: the new prompt extends the cached tokens
        return n
    start = 0
    while a[start : start + _BLOCK] == b[start : start + _BLOCK]:
        start += _BLOCK
    i = start
    while a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Bounded LRU of per-session token sequences; ``capacity == 0`` disables caching."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, array[int]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.cached_tokens_total = 0
        self.prompt_tokens_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self, session_key: str) -> tuple[int, ...] | None:
        """The session's cached tokens, without touching LRU order or counters."""
        entry = self._entries.get(session_key)
        return None if entry is None else tuple(entry)

    def lookup(self, session_key: str | None, prompt: Sequence[int]) -> int:
        """Tokens of ``prompt`` already in the cache: the common prefix with the session's
        entry; 0 for ``session_key is None`` or a miss.  A hit refreshes the entry's LRU
        position.  Counts a hit when at least one token is reused."""
        cached = 0
        entry = self._entries.get(session_key) if session_key is not None else None
        if entry is not None:
            self._entries.move_to_end(session_key)  # type: ignore[arg-type]
            cached = common_prefix_len(entry, array("I", prompt))
        if cached:
            self.hits += 1
        else:
            self.misses += 1
        self.cached_tokens_total += cached
        self.prompt_tokens_total += len(prompt)
        return cached

    def store(self, session_key: str | None, tokens: Sequence[int]) -> None:
        """Record what the KV cache holds for the session (no-op for ``None``), evicting
        the least recently used sessions beyond capacity."""
        if session_key is None or self._capacity == 0:
            return
        self._entries[session_key] = array("I", tokens)
        self._entries.move_to_end(session_key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
            self.evictions += 1

    def stats(self) -> dict[str, int | float]:
        lookups = self.hits + self.misses
        return {
            "sessions": len(self._entries),
            "capacity": self._capacity,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "cached_tokens_total": self.cached_tokens_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "hit_rate": self.hits / lookups if lookups else 0.0,
        }
