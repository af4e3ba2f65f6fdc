"""The token budget of cached conversation contexts: per connection, and per session host.

A session caches each lane's latest context (its rendered token ids and items) so a
continuation processes only what is new.  Two bounds keep that memory in check:
``max_cached_tokens`` per connection, and ``host_max_cached_tokens`` over every connection a
host holds — so packing many connections into one host cannot multiply the per-connection
worst case.  Past either bound the least recently updated lanes are evicted (their next
``store:false`` continuation fails with ``previous_response_not_found``, docs/protocol.md
§4), never the lane just updated.  A host shares one :class:`CacheBudget` between its
sessions; a session without a host (HTTP mode, unit tests) has its own.  Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol


class CachedLane(Protocol):
    latest: Any  # a ContextEntry (with .tokens), or None once evicted


class CacheBudget:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.total = 0
        # By lane (LRU first): (id of its owner, tokens).  Owners are keyed by identity (a
        # connection's lane table need not be hashable).
        self._lanes: OrderedDict[CachedLane, tuple[int, int]] = OrderedDict()
        self._owned: dict[int, int] = {}  # tokens per owner
        self.evictions = 0

    def update(self, owner: object, lane: CachedLane, tokens: int, owner_max: int) -> None:
        """``lane`` (of ``owner``) now caches ``tokens``; evict other lanes, least recently
        updated first: the owner's own past ``owner_max``, then anyone's past the budget."""
        self.drop(lane)
        key = id(owner)
        self._lanes[lane] = (key, tokens)
        self.total += tokens
        self._owned[key] = self._owned.get(key, 0) + tokens
        if self._owned[key] > owner_max:
            self._evict(lambda o: o == key, lambda: self._owned.get(key, 0) > owner_max, keep=lane)
        if self.total > self.max_tokens:
            self._evict(lambda o: True, lambda: self.total > self.max_tokens, keep=lane)

    def drop(self, lane: CachedLane) -> None:
        """``lane`` caches nothing any more (evicted by its session, or closed)."""
        entry = self._lanes.pop(lane, None)
        if entry is not None:
            owner, tokens = entry
            self.total -= tokens
            left = self._owned[owner] - tokens
            if left:
                self._owned[owner] = left
            else:
                del self._owned[owner]

    def forget(self, owner: object) -> None:
        """The connection's state is gone: its lanes no longer count."""
        key = id(owner)
        for lane in [lane for lane, (o, _) in self._lanes.items() if o == key]:
            self.drop(lane)

    def owned(self, owner: object) -> int:
        return self._owned.get(id(owner), 0)

    def _evict(self, mine: Any, over: Any, *, keep: CachedLane) -> None:
        for lane, (owner, _) in list(self._lanes.items()):
            if not over():
                return
            if lane is keep or not mine(owner):
                continue
            self.drop(lane)
            lane.latest = None
            self.evictions += 1
