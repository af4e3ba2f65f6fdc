"""The token budget of cached conversation contexts: per connection, and per session host.

A session caches each lane's latest context (its rendered token ids and items) so a
continuation processes only what is new.  Two bounds keep that memory in check:
``max_cached_tokens`` per connection, and ``host_max_cached_tokens`` over every connection a
host holds — so packing many connections into one host cannot multiply the per-connection
worst case.  Past either bound the least recently updated lanes are evicted (their next
``store:false`` continuation fails with ``previous_response_not_found``, docs/protocol.md
§4), never the lane just updated.  A host shares one :class:`CacheBudget` between its
sessions; a session without a host (HTTP mode, unit tests) has its own.  Pure: no I/O, and
it changes no lane: :meth:`CacheBudget.update` stops counting the lanes it evicts and returns
them, and each lane's owner clears its own (another connection's through an effect,
:class:`~actors.core.turn.Eviction`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Owner = TypeVar("Owner")
Lane = TypeVar("Lane", bound=Hashable)


class CacheBudget(Generic[Owner, Lane]):
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.total = 0
        # By lane (LRU first): (id of its owner, tokens).  Owners are keyed by identity (a
        # connection's lane table need not be hashable).
        self._lanes: OrderedDict[Lane, tuple[int, int]] = OrderedDict()
        self._owned: dict[int, int] = {}  # tokens per owner
        self._owners: dict[int, tuple[Owner, int]] = {}  # by identity: it, and its lanes counted
        self.evictions = 0

    def update(self, owner: Owner, lane: Lane, tokens: int, owner_max: int) -> list[tuple[Owner, Lane]]:
        """``lane`` (of ``owner``) now caches ``tokens``; evict other lanes, least recently
        updated first: the owner's own past ``owner_max``, then anyone's past the budget.
        Returns the evicted lanes with their owners, who must clear them (they no longer count)."""
        self.drop(lane)
        key = id(owner)
        self._lanes[lane] = (key, tokens)
        self._owners[key] = (owner, self._owners.get(key, (owner, 0))[1] + 1)
        self.total += tokens
        self._owned[key] = self._owned.get(key, 0) + tokens
        evicted: list[tuple[Owner, Lane]] = []
        if self._owned[key] > owner_max:
            evicted += self._evict(lambda o: o == key, lambda: self._owned.get(key, 0) > owner_max, keep=lane)
        if self.total > self.max_tokens:
            evicted += self._evict(lambda o: True, lambda: self.total > self.max_tokens, keep=lane)
        return evicted

    def drop(self, lane: Lane) -> None:
        """``lane`` caches nothing any more (evicted by its session, or closed)."""
        entry = self._lanes.pop(lane, None)
        if entry is not None:
            owner, tokens = entry
            self.total -= tokens
            left = self._owned.get(owner, 0) - tokens
            if left:
                self._owned[owner] = left
            else:
                self._owned.pop(owner, None)
            held, lanes = self._owners[owner]
            if lanes > 1:
                self._owners[owner] = (held, lanes - 1)
            else:
                del self._owners[owner]

    def forget(self, owner: object) -> None:
        """The connection's state is gone: its lanes no longer count."""
        key = id(owner)
        for lane in [lane for lane, (o, _) in self._lanes.items() if o == key]:
            self.drop(lane)

    def owned(self, owner: object) -> int:
        return self._owned.get(id(owner), 0)

    def _evict(
        self, mine: Callable[[int], bool], over: Callable[[], bool], *, keep: Lane
    ) -> list[tuple[Owner, Lane]]:
        evicted: list[tuple[Owner, Lane]] = []
        for lane, (key, _) in list(self._lanes.items()):
            if not over():
                break
            if lane is keep or not mine(key):
                continue
            evicted.append((self._owners[key][0], lane))
            self.drop(lane)
            self.evictions += 1
        return evicted
