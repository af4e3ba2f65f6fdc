"""The per-replica prefix (KV) cache: chained hashes of token blocks, bounded, LRU.

Like vLLM's automatic prefix caching, the KV cache is addressed by content: a prompt is
cut into blocks of ``block_tokens`` token ids; block ``i``'s key is
``hash((key[i-1], bytes of block i))``, so a key names the block *and everything before
it*.  A lookup walks the prompt's blocks from the start and stops at the first block not
in the cache; what it found is reused (no prefill for it).  Only full blocks are cached,
and at most ``len(prompt) - 1`` tokens are reused (the last prompt token is always
computed, since the model needs its logits to produce the first output token).

Blocks are shared between sessions (two conversations with the same system prompt share
its blocks).  The cache holds at most ``capacity_blocks`` blocks; the least recently used
go first.  A chain is refreshed tail-first, so within a chain the root is the most recent
and eviction removes a cold conversation's *end* before its beginning (an evicted root
would orphan everything after it, since matching stops at the first miss).

The least recently used order is kept without touching every block of a chain on each use:
a chain is always used from its root, so a block is never less recent than the blocks after
it, and the least recent block is always the end of a chain (a block no held block chains
on).  So a use of a chain stamps only its last block; a block whose every successor is gone
inherits the latest stamp among them, and eviction takes the end block with the oldest
stamp (a heap).  The order is the one refreshing each chain's blocks tail first would give
(``tests/inference/emulator/test_prefix_cache.py`` checks it against that model), at a cost per use
that does not grow with the conversation.

Simplification: blocks that running requests are using are not pinned against eviction
(a real engine reference-counts them); with a capacity far above one batch this only
matters under extreme pressure, where it makes the emulator evict slightly early.

Keys use Python's ``hash`` of ``(int, bytes)``: 64 bits, salted per process, which is fine
because a cache never leaves its replica.

``reported_cached_tokens`` is the separate question of what ``usage`` reports.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

CACHING_MIN_TOKENS = 1024
CACHING_STEP_TOKENS = 128
# A held block's state is one int: its stamp, then its successors' count (``_COUNT_BITS``),
# then its parent's key (``_KEY_BITS``, offset to be non-negative).
_NO_PARENT = -1  # a chain's first block's parent: ``hash`` never returns -1, so no block's key
_KEY_BITS = 64  # a key is a 64-bit signed ``hash``
_KEY_OFFSET = 1 << (_KEY_BITS - 1)
_KEY_MASK = (1 << _KEY_BITS) - 1
_COUNT_BITS = 32  # a block's successors (blocks chaining on it)
_COUNT_MASK = (1 << _COUNT_BITS) - 1
_ONE_SUCCESSOR = 1 << _KEY_BITS
_STAMP_SHIFT = _KEY_BITS + _COUNT_BITS
_LOW_MASK = (1 << _STAMP_SHIFT) - 1


def _entry(stamp: int, key: int) -> int:
    """An end block's heap entry: one int ordered as ``(stamp, key)`` (an int, not a tuple,
    so the heap's entries are nothing the collector tracks either)."""
    return stamp << _KEY_BITS | (key + _KEY_OFFSET)


def reported_cached_tokens(reused_tokens: int) -> int:
    """``usage.input_tokens_details.cached_tokens`` for ``reused_tokens`` of reused KV.

    OpenAI's prompt-caching rule: caching applies from 1024 prompt tokens, and cache hits
    are reported in 128-token steps (1024, 1152, 1280, ...).  Implemented as: round the
    reused prefix *down* to a multiple of 128; report it if that is at least 1024, else 0.
    (A prompt shorter than 1024 tokens cannot reuse 1024, so it always reports 0.)  The
    reported value never exceeds what was really reused; the difference is still saved
    time-to-first-token, just not billed as cached.
    """
    stepped = reused_tokens // CACHING_STEP_TOKENS * CACHING_STEP_TOKENS
    return stepped if stepped >= CACHING_MIN_TOKENS else 0


def as_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as 4-byte unsigned ints, as blocks are hashed."""
    if isinstance(tokens, array) and tokens.typecode == "I":
        return tokens.tobytes()
    return array("I", tokens).tobytes()


def block_keys(
    tokens: Sequence[int], block_tokens: int, known: Sequence[int] = (), root: int = 0, end: int | None = None
) -> list[int]:
    """The chained keys of every *full* block of ``tokens`` (of its first ``end`` tokens, if
    given); the first block chains on ``root`` (the engine roots chains at the model, so
    models never share KV).

    ``known`` may hold the keys of a prefix of those blocks already computed (e.g. by the
    lookup of the same prompt); only the blocks after it are hashed, and only their tokens
    are read.
    """
    n = (len(tokens) if end is None else min(end, len(tokens))) // block_tokens
    keys = list(known[:n])
    if len(keys) < n:
        start = len(keys) * block_tokens
        keys += chain_keys(tokens[start : n * block_tokens], block_tokens, keys[-1] if keys else root)
    return keys


def chain_keys(tokens: Sequence[int], block_tokens: int, prev: int) -> list[int]:
    """The keys of the full blocks of ``tokens``, chained on ``prev`` (the key of the block
    before them, or a chain's root)."""
    data = as_bytes(tokens)
    step = block_tokens * 4
    keys = []
    for i in range(len(data) // step):
        prev = hash((prev, data[i * step : (i + 1) * step]))
        keys.append(prev)
    return keys


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup found: ``reused_tokens`` of the prompt are in the cache.  ``keys``
    are the prompt's block keys computed on the way (for a later ``insert``)."""

    reused_tokens: int
    hit_blocks: int
    miss_blocks: int
    keys: tuple[int, ...]


class PrefixCache:
    """Bounded LRU of block keys; ``capacity_blocks == 0`` disables caching."""

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        self._capacity = capacity_blocks
        self._block = block_tokens
        # A held block's state, one int keyed by the block's key (see ``_NO_PARENT``): the block
        # before it in its chain, how many held blocks chain on it, and its stamp (see the
        # module doc).  Ints only: the collector does not track such a dict, so a replica
        # holding tens of thousands of blocks, evicting as many as it adds, gives it nothing
        # to walk (objects per block would pile up in its youngest generation unseen, each
        # eviction's free offsetting an insert's allocation in its count, then be walked
        # all at once on the event loop).
        self._state: dict[int, int] = {}
        self._ends: list[int] = []  # end blocks as ``_entry(stamp, key)``, a heap; stale entries skipped
        self._stamp = 0
        self.lookups = 0
        self.hit_blocks = 0
        self.miss_blocks = 0
        self.evicted_blocks = 0
        self.reused_tokens_total = 0
        self.prompt_tokens_total = 0

    @property
    def block_tokens(self) -> int:
        return self._block

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._state)

    def __contains__(self, key: object) -> bool:
        """Whether the block of this key (:func:`block_keys`) is held."""
        return key in self._state

    def lookup(self, prompt: Sequence[int], root: int = 0, known: Sequence[int] = ()) -> Lookup:
        """Reuse the longest cached block prefix of ``prompt`` (see module doc); ``known``:
        the block keys of a prefix of it, already computed.

        Hit blocks become the most recently used.  Blocks counted as misses are the full
        blocks of the matchable part (the first ``len(prompt) - 1`` tokens) after the first
        miss: the ones this request must prefill and will add."""
        matchable = max(0, len(prompt) - 1)
        keys = block_keys(prompt, self._block, known, root, end=matchable) if self._capacity else []
        hits = self._held(keys)
        if hits:
            self._use(keys[hits - 1])
        self.lookups += 1
        self.hit_blocks += hits
        self.miss_blocks += len(keys) - hits
        reused = hits * self._block
        self.reused_tokens_total += reused
        self.prompt_tokens_total += len(prompt)
        return Lookup(reused, hits, len(keys) - hits, tuple(keys))

    def insert(self, tokens: Sequence[int], known: Sequence[int] = (), root: int = 0) -> int:
        """Hold the KV of every full block of ``tokens`` (``known``: keys already computed
        for a prefix of them); returns the number of blocks evicted to make room."""
        if not self._capacity:
            return 0
        return self.insert_keys(block_keys(tokens, self._block, known, root))

    def insert_keys(self, keys: Sequence[int]) -> int:
        """:meth:`insert` of blocks by their keys (:func:`block_keys`)."""
        if not self._capacity:
            return 0
        state = self._state
        held = self._held(keys)
        if held == len(keys):
            if keys:
                self._use(keys[-1])
            return 0
        new = keys[held:]
        parent = keys[held - 1] if held else _NO_PARENT
        if held:
            state[parent] += _ONE_SUCCESSOR
        for key in new:
            state[key] = _ONE_SUCCESSOR | (parent + _KEY_OFFSET)
            parent = key
        state[parent] -= _ONE_SUCCESSOR
        self._use(parent)
        evicted = len(state) - self._capacity
        if evicted <= 0:
            return 0
        ends = self._ends
        for _ in range(evicted):  # the least recently used blocks: the end blocks with the oldest stamps
            while True:
                entry = heapq.heappop(ends)
                key = (entry & _KEY_MASK) - _KEY_OFFSET
                value = state.get(key)
                # held, with no successor and the stamp it had when pushed
                if value is not None and value >> _KEY_BITS == (entry >> _KEY_BITS) << _COUNT_BITS:
                    break
            del state[key]
            parent = (value & _KEY_MASK) - _KEY_OFFSET
            if parent != _NO_PARENT:
                up = state[parent] - _ONE_SUCCESSOR
                if up >> _STAMP_SHIFT < entry >> _KEY_BITS:  # it inherits the newer stamp
                    up = (entry >> _KEY_BITS) << _STAMP_SHIFT | (up & _LOW_MASK)
                state[parent] = up
                if not (up >> _KEY_BITS) & _COUNT_MASK:
                    self._push_end(parent)
                    ends = self._ends  # a rebuild replaces it
        self.evicted_blocks += evicted
        return evicted

    def _use(self, key: int) -> None:
        """A chain up to ``key`` was used: it is the most recent (its blocks before ``key``
        through their stamps' inheritance, module doc)."""
        self._stamp += 1
        value = self._state[key]
        self._state[key] = self._stamp << _STAMP_SHIFT | (value & _LOW_MASK)
        if not (value >> _KEY_BITS) & _COUNT_MASK:
            self._push_end(key)

    def _push_end(self, key: int) -> None:
        state = self._state
        heapq.heappush(self._ends, _entry(state[key] >> _STAMP_SHIFT, key))
        if len(self._ends) > 2 * len(state) + 64:  # stale entries: rebuild from the ends held
            self._ends = [
                _entry(v >> _STAMP_SHIFT, k) for k, v in state.items() if not (v >> _KEY_BITS) & _COUNT_MASK
            ]
            heapq.heapify(self._ends)

    def _held(self, keys: Sequence[int]) -> int:
        """How many of a chain's ``keys``, from its start, are held.  Held blocks are closed
        under prefixes (a chain is refreshed and added tail first, so a block is never less
        recent than the blocks after it, and the least recent go first), which makes it a
        binary search, not a walk of the whole conversation's blocks."""
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in self._state:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def contains_prefix(self, tokens: Sequence[int], root: int = 0) -> int:
        """Tokens of ``tokens`` (full blocks, from the start) held, without touching LRU
        order or counters (for tests and diagnostics)."""
        held = 0
        for key in block_keys(tokens, self._block, root=root):
            if key not in self._state:
                break
            held += self._block
        return held

    def stats(self) -> dict[str, int | float]:
        blocks = self.hit_blocks + self.miss_blocks
        return {
            "block_tokens": self._block,
            "blocks": len(self._state),
            "capacity_blocks": self._capacity,
            "lookups": self.lookups,
            "hit_blocks": self.hit_blocks,
            "miss_blocks": self.miss_blocks,
            "evicted_blocks": self.evicted_blocks,
            "reused_tokens_total": self.reused_tokens_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "block_hit_rate": self.hit_blocks / blocks if blocks else 0.0,
        }
