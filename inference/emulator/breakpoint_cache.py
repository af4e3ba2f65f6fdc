"""The per-replica prompt cache by breakpoints (the rule of the openai SDK 3.57's
``prompt_cache_options`` and ``prompt_cache_breakpoint``; docs/emulator.md says which
profiles follow it).

The rule, as the SDK's docstrings state it:

- a breakpoint "marks the exact end of a reusable prompt prefix … the boundary is not
  rounded to a token block": an entry holds the prompt's first ``offset`` tokens exactly;
- ``mode`` ``implicit`` (the default): one implicit breakpoint (here: the end of the prompt)
  plus up to the latest three explicit breakpoints are written; ``explicit``: up to the
  latest four explicit breakpoints, and a request with none does not use prompt caching
  (it neither reads nor writes);
- "for cache matching, OpenAI considers up to the latest 80 breakpoints in the
  conversation": the candidates are the latest :data:`MATCH_WINDOW` breakpoint offsets of
  the prompt (its explicit breakpoints, and in implicit mode the ends of the conversation's
  earlier prompts, where their implicit breakpoints were written, and its own end); the
  longest one held is read;
- ``ttl`` ``30m`` (default) or ``12h``, per breakpoint or the request's, is a *minimum*
  lifetime: an entry is kept at least that long after it was last written or read, and
  only then may capacity evict it (the earliest expired first).  When the cache is full of
  entries still in their lifetime, a write is refused (and not reported).

Accounting: an entry *adds* the tokens past the longest prefix this request already had
(its read, or its previous write); usage's ``cache_write_tokens`` is the sum of what the
request's writes added, split by TTL.  The cache holds at most ``capacity_tokens`` added
tokens and ``max_entries`` entries.  (Simplification: evicting an entry frees what it added
even if a longer entry still extends it.)

Keys: an entry's key chains on the prompt's block keys (``prefix_cache.block_keys``, which a
pinned session computes only for blocks it has not seen, ``inference.emulator.prompt_memo``) and
hashes the at most ``block_tokens - 1`` tokens after the last full block: a lookup hashes a
handful of short tails, never the whole prompt.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from inference.types import Breakpoint, CacheMode, CacheTTL

TTL_S: dict[CacheTTL, float] = {"30m": 30 * 60.0, "12h": 12 * 3600.0}
MAX_WRITES = 4  # breakpoints written per request
MAX_EXPLICIT_WITH_IMPLICIT = 3  # explicit ones written beside the implicit one
MATCH_WINDOW = 80  # latest breakpoints considered for matching


@dataclass(frozen=True, slots=True)
class Plan:
    """What one request may read (``candidates``, longest first) and write (``writes``,
    ``(offset, ttl)`` in increasing offset)."""

    candidates: tuple[int, ...]
    writes: tuple[tuple[int, CacheTTL], ...]


def plan(breakpoints: Sequence[Breakpoint], prompt_tokens: int, mode: CacheMode, ttl: CacheTTL) -> Plan:
    """The rule above as a table of offsets.  Breakpoints past the prompt are ignored; two at
    one offset are one, with the longer TTL."""
    explicit: dict[int, CacheTTL] = {}
    earlier: set[int] = set()
    for bp in breakpoints:
        if not 0 < bp.offset <= prompt_tokens:
            continue
        if bp.implicit:
            earlier.add(bp.offset)
            continue
        life = bp.ttl or ttl
        if explicit.get(bp.offset) != "12h":
            explicit[bp.offset] = life
    marks = sorted(explicit)
    if mode == "explicit":
        if not marks:
            return Plan((), ())
        writes = [(o, explicit[o]) for o in marks[-MAX_WRITES:]]
        candidates = set(marks)
    else:
        writes = [(o, explicit[o]) for o in marks[-MAX_EXPLICIT_WITH_IMPLICIT:] if o != prompt_tokens]
        if prompt_tokens:
            writes.append((prompt_tokens, _longer(explicit.get(prompt_tokens), ttl)))
        candidates = set(marks) | earlier | ({prompt_tokens} if prompt_tokens else set())
    latest = sorted(candidates, reverse=True)[:MATCH_WINDOW]
    return Plan(tuple(latest), tuple(writes))


def _longer(a: CacheTTL | None, b: CacheTTL) -> CacheTTL:
    return "12h" if "12h" in (a, b) else "30m"


def prefix_key(data: bytes, offset: int, block_tokens: int, keys: Sequence[int], root: int) -> int:
    """The key of the prompt's first ``offset`` tokens (``data``: its ids, 4 bytes each;
    ``keys``: its block keys chained from ``root``, at least ``offset // block_tokens`` of them)."""
    full = offset // block_tokens
    base = keys[full - 1] if full else root
    return hash(("bp", base, data[full * block_tokens * 4 : offset * 4]))


@dataclass(slots=True)
class _Entry:
    tokens: int
    ttl_s: float
    expires: float
    added: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's reads and writes: ``read`` tokens came from the cache; ``written``
    tokens were added, as ``(ttl_30m, ttl_12h)``."""

    read: int
    written: tuple[int, int]


class BreakpointCache:
    """Entries keyed by :func:`prefix_key`, bounded (see the module doc); ``now`` is the
    injected clock's reading, passed in by the caller."""

    def __init__(self, capacity_tokens: int, max_entries: int = 65_536) -> None:
        self._capacity = capacity_tokens
        self._max_entries = max_entries
        self._entries: dict[int, _Entry] = {}
        self._expiry: list[tuple[float, int]] = []  # (expires, key), stale ones skipped
        self._held = 0
        self.reads = 0
        self.read_tokens = 0
        self.written_tokens = 0
        self.refused_writes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_tokens(self) -> int:
        return self._held

    def serve(
        self, candidates: Sequence[tuple[int, int]], writes: Sequence[tuple[int, int, CacheTTL]], now: float
    ) -> Outcome:
        """Read the longest held of ``candidates`` (``(offset, key)``, longest first), then
        write ``writes`` (``(offset, key, ttl)``, increasing offset).  Capacity 0: off."""
        if not self._capacity:
            return Outcome(0, (0, 0))
        read = 0
        for offset, key in candidates:
            entry = self._entries.get(key)
            if entry is not None and entry.tokens == offset:
                read = offset
                self._touch(key, entry, entry.ttl_s, now)
                break
        self.reads += 1
        self.read_tokens += read
        have = read
        written = [0, 0]
        for offset, key, ttl in writes:
            added = self._write(key, offset, TTL_S[ttl], have, now)
            if added is None:
                continue
            written[ttl == "12h"] += added
            have = max(have, offset)
        self.written_tokens += written[0] + written[1]
        return Outcome(read, (written[0], written[1]))

    def _touch(self, key: int, entry: _Entry, ttl_s: float, now: float) -> None:
        entry.ttl_s = max(entry.ttl_s, ttl_s)
        expires = max(entry.expires, now + entry.ttl_s)
        if expires != entry.expires:
            entry.expires = expires
            self._push(expires, key)

    def _write(self, key: int, offset: int, ttl_s: float, have: int, now: float) -> int | None:
        """Tokens added by writing the entry (0: it was held, and is refreshed); ``None``:
        refused, the cache is full of entries still in their lifetime."""
        entry = self._entries.get(key)
        if entry is not None and entry.tokens == offset:
            self._touch(key, entry, ttl_s, now)
            return 0
        added = max(0, offset - have)
        if added > self._capacity or not self._make_room(added, now):
            self.refused_writes += 1
            return None
        self._entries[key] = _Entry(offset, ttl_s, now + ttl_s, added)
        self._held += added
        self._push(now + ttl_s, key)
        return added

    def _make_room(self, added: int, now: float) -> bool:
        while self._held + added > self._capacity or len(self._entries) >= self._max_entries:
            if not self._expiry or self._expiry[0][0] > now:
                return False
            expires, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            if entry is None or entry.expires != expires:
                continue  # stale: refreshed or gone since
            del self._entries[key]
            self._held -= entry.added
            self.evicted += 1
        return True

    def _push(self, expires: float, key: int) -> None:
        heapq.heappush(self._expiry, (expires, key))
        if len(self._expiry) > 2 * len(self._entries) + 64:  # drop stale records: bounded
            self._expiry = [(e.expires, k) for k, e in self._entries.items()]
            heapq.heapify(self._expiry)

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "held_tokens": self._held,
            "capacity_tokens": self._capacity,
            "reads": self.reads,
            "read_tokens": self.read_tokens,
            "written_tokens": self.written_tokens,
            "refused_writes": self.refused_writes,
            "evicted_entries": self.evicted,
        }
