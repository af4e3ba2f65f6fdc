"""Cached-context budgets: per connection and per host, least recently updated lanes first."""

from __future__ import annotations

from dataclasses import dataclass

from actors.core.cache_budget import CacheBudget


@dataclass(eq=False)
class Lane:
    latest: object | None = "ctx"


def test_a_connection_past_its_own_bound_loses_its_least_recently_updated_lanes_never_the_current_one():
    budget = CacheBudget(max_tokens=10_000)
    a, b, c = Lane(), Lane(), Lane()
    budget.update("conn", a, 400, owner_max=1000)
    budget.update("conn", b, 400, owner_max=1000)
    budget.update("conn", c, 400, owner_max=1000)
    assert a.latest is None and b.latest == "ctx" and c.latest == "ctx"
    assert budget.owned("conn") == 800 and budget.total == 800
    budget.update("conn", c, 5000, owner_max=1000)  # one huge lane is kept: it is the one continued
    assert c.latest == "ctx" and b.latest is None and budget.owned("conn") == 5000


def test_packed_connections_share_the_host_budget_and_evict_across_connections_lru_first():
    budget = CacheBudget(max_tokens=1000)
    lanes = [Lane() for _ in range(4)]
    for i, lane in enumerate(lanes):  # four connections, 300 tokens each, within their own bound
        budget.update(f"conn{i}", lane, 300, owner_max=2000)
    assert [lane.latest for lane in lanes] == [None, "ctx", "ctx", "ctx"], "the oldest, of another connection"
    assert budget.total == 900 and budget.evictions == 1
    budget.update("conn1", lanes[1], 300, owner_max=2000)  # conn1 continues: now the most recent
    budget.update("conn4", Lane(), 300, owner_max=2000)
    assert lanes[2].latest is None and lanes[1].latest == "ctx"


def test_a_closed_connection_no_longer_counts():
    budget = CacheBudget(max_tokens=1000)
    a, b = Lane(), Lane()
    budget.update("gone", a, 600, owner_max=2000)
    budget.forget("gone")
    budget.update("live", b, 600, owner_max=2000)
    assert b.latest == "ctx" and budget.total == 600 and budget.owned("gone") == 0
