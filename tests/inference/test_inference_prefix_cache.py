"""prefix_cache: per-session common prefix, bounded LRU, counters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inference.prefix_cache import PrefixCache, common_prefix_len


def test_common_prefix_length():
    assert common_prefix_len((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix_len((1, 2, 3), (1, 9, 3)) == 1
    assert common_prefix_len((), (1,)) == 0
    assert common_prefix_len((5,), (6,)) == 0


@given(a=st.lists(st.integers(0, 3), max_size=1500), b=st.lists(st.integers(0, 3), max_size=1500))
def test_common_prefix_length_matches_a_plain_scan(a, b):
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert common_prefix_len(tuple(a), tuple(b)) == expected


def test_a_session_reuses_what_its_last_request_left():
    cache = PrefixCache(capacity=4)
    cache.store("s", [1, 2, 3, 4])
    assert cache.lookup("s", [1, 2, 3, 4, 5, 6]) == 4
    assert cache.lookup("s", [1, 2, 9]) == 2


def test_unknown_sessions_and_stateless_requests_reuse_nothing():
    cache = PrefixCache(capacity=4)
    cache.store("s", [1, 2, 3])
    cache.store(None, [1, 2, 3])
    assert cache.lookup("other", [1, 2, 3]) == 0
    assert cache.lookup(None, [1, 2, 3]) == 0
    assert len(cache) == 1


def test_least_recently_used_session_is_evicted():
    cache = PrefixCache(capacity=2)
    cache.store("a", [1])
    cache.store("b", [2])
    cache.lookup("a", [1])  # touching "a" makes "b" the oldest
    cache.store("c", [3])
    assert cache.tokens("b") is None
    assert cache.tokens("a") == (1,) and cache.tokens("c") == (3,)
    assert cache.stats()["evictions"] == 1


def test_storing_again_replaces_the_session_entry():
    cache = PrefixCache(capacity=2)
    cache.store("a", [1, 2])
    cache.store("a", [7])
    assert cache.tokens("a") == (7,) and len(cache) == 1


def test_zero_capacity_disables_the_cache():
    cache = PrefixCache(capacity=0)
    cache.store("a", [1, 2])
    assert cache.lookup("a", [1, 2]) == 0


def test_stats_count_hits_misses_and_tokens():
    cache = PrefixCache(capacity=2)
    cache.lookup("a", [1, 2])  # miss
    cache.store("a", [1, 2])
    cache.lookup("a", [1, 2, 3])  # hit, 2 cached
    cache.lookup("a", [9])  # miss: nothing in common
    assert cache.stats() == {
        "sessions": 1, "capacity": 2, "hits": 1, "misses": 2, "evictions": 0,
        "cached_tokens_total": 2, "prompt_tokens_total": 6, "hit_rate": 1 / 3,
    }
