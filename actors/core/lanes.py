"""A connection's lanes (docs/protocol.md §4): responses on one lane run one at a time (a
lane is busy while one of its requests is, :mod:`actors.core.request_queue`), and each lane caches its
latest response's conversation — within a bound on the tokens all the lanes cache together,
and within the host's budget over all its connections (:class:`~actors.core.cache_budget.CacheBudget`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from ..errors import StreamLimitReached
from .cache_budget import CacheBudget
from .context import ContextEntry
from .turn import Eviction, LaneOwner


@dataclass(slots=True, eq=False)
class Lane:
    name: str | None
    latest: ContextEntry | None = None


# The host-wide budget: lanes counted by the lane tables that own them.
HostBudget: TypeAlias = CacheBudget["Lanes", Lane]


class Lanes(Mapping[str | None, Lane]):
    """The lanes by ``stream_id`` (``None``: the default lane, always present), of the
    session ``owner`` (whom another connection's eviction of one of them is sent to)."""

    def __init__(
        self,
        owner: LaneOwner,
        *,
        max_named: int,
        max_cached_tokens: int,
        budget: HostBudget | None = None,
    ) -> None:
        self.owner = owner
        self._lanes: dict[str | None, Lane] = {None: Lane(None)}
        self._max_named = max_named
        self._max_cached_tokens = max_cached_tokens
        # The host's budget, shared by its connections; a connection alone has its own.
        self._budget: HostBudget = budget if budget is not None else CacheBudget(max_cached_tokens)

    def __getitem__(self, name: str | None) -> Lane:
        return self._lanes[name]

    def __iter__(self) -> Iterator[str | None]:
        return iter(self._lanes)

    def __len__(self) -> int:
        return len(self._lanes)

    def admit(self, name: str | None) -> None:
        """:class:`StreamLimitReached` if ``name`` would be one named lane too many."""
        if name is not None and name not in self._lanes and len(self._lanes) - 1 >= self._max_named:
            raise StreamLimitReached(self._max_named)

    def open(self, name: str | None) -> Lane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(name)
        return lane

    def find(self, response_id: str) -> tuple[str | None, ContextEntry] | None:
        """The lane whose latest response is ``response_id``, and that response's entry."""
        for name, lane in self._lanes.items():
            if lane.latest is not None and lane.latest.response_id == response_id:
                return name, lane.latest
        return None

    def evict(self, name: str | None) -> None:
        lane = self._lanes[name]
        self._budget.drop(lane)
        lane.latest = None

    def evicted(self, name: str | None, response_id: str) -> None:
        """The host's budget evicted lane ``name`` for another connection (it no longer
        counts); cleared unless it has moved on from ``response_id`` since."""
        lane = self._lanes.get(name)
        if lane is not None and lane.latest is not None and lane.latest.response_id == response_id:
            lane.latest = None

    def remember(self, name: str | None, entry: ContextEntry) -> list[Eviction]:
        """``entry`` is the lane's latest response now.  The lanes' cached tokens stay under
        ``max_cached_tokens``, and the host's under its budget: other lanes' entries go, least
        recently updated first (a later continuation from an evicted store:false response
        fails with previous_response_not_found).  This connection's are cleared now; other
        connections' are returned, for their sessions to clear."""
        keep = self._lanes[name]
        keep.latest = entry
        others: list[Eviction] = []
        for owner, lane in self._budget.update(self, keep, len(entry.tokens), self._max_cached_tokens):
            if owner is self:
                lane.latest = None
            elif lane.latest is not None:
                others.append(Eviction(owner.owner, lane.name, lane.latest.response_id))
        return others

    def release(self) -> None:
        """The connection's state is gone: its cached tokens no longer count."""
        self._budget.forget(self)
