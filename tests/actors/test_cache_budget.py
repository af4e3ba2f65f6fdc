"""Cached-context budgets: per connection and per host, least recently updated lanes first.
The budget changes no lane: it returns the lanes it stopped counting, with their owners."""

from __future__ import annotations

from actors.core.cache_budget import CacheBudget


class Lane:
    pass


def test_a_connection_past_its_own_bound_loses_its_least_recently_updated_lanes_never_the_current_one():
    budget: CacheBudget[str, Lane] = CacheBudget(max_tokens=10_000)
    a, b, c = Lane(), Lane(), Lane()
    assert budget.update("conn", a, 400, owner_max=1000) == []
    assert budget.update("conn", b, 400, owner_max=1000) == []
    assert budget.update("conn", c, 400, owner_max=1000) == [("conn", a)]
    assert budget.owned("conn") == 800 and budget.total == 800
    # one huge lane is kept: it is the one continued
    assert budget.update("conn", c, 5000, owner_max=1000) == [("conn", b)]
    assert budget.owned("conn") == 5000


def test_packed_connections_share_the_host_budget_and_evict_across_connections_lru_first():
    budget: CacheBudget[str, Lane] = CacheBudget(max_tokens=1000)
    lanes = [Lane() for _ in range(4)]
    evicted = [budget.update(f"conn{i}", lane, 300, owner_max=2000) for i, lane in enumerate(lanes)]
    assert evicted == [[], [], [], [("conn0", lanes[0])]], "the oldest, of another connection"
    assert budget.total == 900 and budget.evictions == 1 and budget.owned("conn0") == 0
    assert budget.update("conn1", lanes[1], 300, owner_max=2000) == []  # conn1 continues: now the most recent
    assert budget.update("conn4", Lane(), 300, owner_max=2000) == [("conn2", lanes[2])]


def test_a_closed_connection_no_longer_counts():
    budget: CacheBudget[str, Lane] = CacheBudget(max_tokens=1000)
    a, b = Lane(), Lane()
    budget.update("gone", a, 600, owner_max=2000)
    budget.forget("gone")
    assert budget.update("live", b, 600, owner_max=2000) == []
    assert budget.total == 600 and budget.owned("gone") == 0


def test_lanes_of_one_owner_caching_nothing_are_dropped_one_by_one():
    budget: CacheBudget[str, Lane] = CacheBudget(max_tokens=1000)
    a, b = Lane(), Lane()
    budget.update("conn", a, 0, owner_max=10)
    budget.update("conn", b, 0, owner_max=10)
    budget.drop(a)
    budget.drop(b)
    assert budget.total == 0 and budget.owned("conn") == 0
