"""prefix_cache: chained block hashes, stop at the first miss, bounded LRU, OpenAI's
reporting rule."""

from __future__ import annotations

import gc
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference.emulator.prefix_cache import PrefixCache, block_keys, reported_cached_tokens

B = 4  # block size in these tests


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# --- what usage reports ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reused", "reported"),
    [
        (0, 0),
        (127, 0),
        (1023, 0),
        (1024, 1024),
        (1100, 1024),
        (1151, 1024),
        (1152, 1152),
        (5000, 4992),
        (128_000, 128_000),
    ],
)
def test_reported_cached_tokens_follow_openai_rules(reused, reported):
    # From 1024 tokens, in 128-token steps, rounded down: never more than was reused.
    assert reported_cached_tokens(reused) == reported


@given(st.integers(0, 1_000_000))
def test_reported_is_a_step_of_128_from_1024_and_never_above_reused(reused):
    r = reported_cached_tokens(reused)
    assert r <= reused and r % 128 == 0 and (r == 0 or r >= 1024)
    assert reused - r < 128 or r == 0


# --- block keys ------------------------------------------------------------------------


def test_keys_cover_full_blocks_only_and_chain_on_what_precedes():
    assert len(block_keys(toks(11), B)) == 2
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8], B)
    b = block_keys([9, 2, 3, 4, 5, 6, 7, 8], B)
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different history
    assert block_keys([1, 2, 3, 4, 5, 6, 7, 8], B, root=1) != a  # another model's chain


def test_known_keys_are_reused_and_extended():
    full = block_keys(toks(20), B)
    assert block_keys(toks(20), B, known=full[:2]) == full
    assert block_keys(array("I", toks(20)), B) == full  # arrays and lists agree


# --- lookup and insert -----------------------------------------------------------------


def test_a_prompt_reuses_the_full_blocks_of_a_cached_prefix():
    cache = PrefixCache(capacity_blocks=100, block_tokens=B)
    cache.insert(toks(10))  # blocks [0..4) and [4..8); tokens 8, 9 are a partial block
    assert cache.contains_prefix(toks(10)) == 8
    found = cache.lookup(toks(30))
    assert found.reused_tokens == 8 and found.hit_blocks == 2
    # the matchable part is 29 tokens: 7 full blocks, 5 of them missing
    assert found.miss_blocks == 5 and len(found.keys) == 7


def test_matching_stops_at_the_first_miss():
    cache = PrefixCache(capacity_blocks=100, block_tokens=B)
    cache.insert(toks(16))
    prompt = toks(16)
    prompt[5] = 999  # second block differs; the third and fourth blocks are equal tokens
    assert cache.lookup(prompt + [1]).reused_tokens == 4


def test_the_last_prompt_token_is_never_reused():
    cache = PrefixCache(capacity_blocks=100, block_tokens=B)
    cache.insert(toks(8))
    assert cache.lookup(toks(8)).reused_tokens == 4  # 7 matchable tokens: one full block
    assert cache.lookup(toks(9)).reused_tokens == 8


def test_blocks_are_shared_across_conversations_with_the_same_prefix():
    cache = PrefixCache(capacity_blocks=100, block_tokens=B)
    system = toks(8, 1000)
    cache.insert(system + toks(8, 1))
    assert cache.lookup(system + toks(8, 500)).reused_tokens == 8


def test_least_recently_used_blocks_are_evicted_tail_first():
    cache = PrefixCache(capacity_blocks=4, block_tokens=B)
    cold, hot = toks(8, 100), toks(8, 200)
    cache.insert(cold)
    cache.insert(hot)
    assert len(cache) == 4
    cache.lookup(cold + [0])  # cold becomes the most recent chain
    evicted = cache.insert(toks(4, 300))  # one new block: the LRU block goes
    assert evicted == 1 and cache.evicted_blocks == 1
    # hot lost its tail block, never its root
    assert cache.contains_prefix(hot) == 4 and cache.contains_prefix(cold) == 8


def test_a_chain_longer_than_the_cache_keeps_its_beginning():
    cache = PrefixCache(capacity_blocks=3, block_tokens=B)
    assert cache.insert(toks(20)) == 2
    assert cache.contains_prefix(toks(20)) == 12


def test_zero_capacity_disables_the_cache():
    cache = PrefixCache(capacity_blocks=0, block_tokens=B)
    assert cache.insert(toks(20)) == 0
    assert cache.lookup(toks(20)).reused_tokens == 0 and len(cache) == 0


@given(
    st.lists(st.lists(st.integers(0, 3), max_size=40), max_size=6), st.lists(st.integers(0, 3), max_size=40)
)
def test_reuse_is_the_longest_inserted_full_block_prefix(inserted, prompt):
    cache = PrefixCache(capacity_blocks=10_000, block_tokens=B)
    for seq in inserted:
        cache.insert(seq)
    matchable = prompt[: max(0, len(prompt) - 1)]
    best = 0
    for seq in inserted:
        n = 0
        while n < min(len(seq), len(matchable)) and seq[n] == matchable[n]:
            n += 1
        best = max(best, n // B * B)
    assert cache.lookup(prompt).reused_tokens == best


def test_stats_count_lookups_blocks_and_tokens():
    cache = PrefixCache(capacity_blocks=2, block_tokens=B)
    cache.lookup(toks(9))  # 2 blocks missing
    cache.insert(toks(9))
    cache.lookup(toks(13))  # 2 hits, 1 miss
    cache.insert(toks(13))  # a third block: one eviction
    assert cache.stats() == {
        "block_tokens": B,
        "blocks": 2,
        "capacity_blocks": 2,
        "lookups": 2,
        "hit_blocks": 2,
        "miss_blocks": 3,
        "evicted_blocks": 1,
        "reused_tokens_total": 8,
        "prompt_tokens_total": 22,
        "block_hit_rate": 0.4,
    }


@given(
    st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 2), max_size=32)), max_size=30),
    st.integers(1, 12),
)
def test_held_blocks_stay_closed_under_prefixes_and_evictions_follow_exact_lru(ops, capacity):
    """Lookups and inserts of chains sharing prefixes, under eviction: every held block's
    chain is held from its root (what the binary search relies on), and the blocks evicted
    are, step by step, those of an LRU that refreshes each used chain's blocks tail first."""
    cache = PrefixCache(capacity_blocks=capacity, block_tokens=B)
    order: list[int] = []  # the model: least recent first
    for is_lookup, seq in ops:
        keys = block_keys(seq[: max(0, len(seq) - 1)] if is_lookup else seq, B)
        if is_lookup:
            cache.lookup(seq)
            hits = 0
            while hits < len(keys) and keys[hits] in order:
                hits += 1
            keys = keys[:hits]
        else:
            cache.insert(seq)
        for key in reversed(keys):
            if key in order:
                order.remove(key)
            order.append(key)
        del order[: max(0, len(order) - capacity)]
        # the same blocks evicted, step by step
        assert len(cache) == len(order) and all(k in cache for k in order)
        for seq_keys in (block_keys(s, B) for _, s in ops):
            held = [k in cache for k in seq_keys]
            assert held == sorted(held, reverse=True)  # held ones first, then none


def test_a_full_cache_gives_the_garbage_collector_nothing_to_walk() -> None:
    """A replica's cache holds tens of thousands of blocks and, once full, evicts as many as
    it adds: none of what it holds is an object the collector tracks (docs/emulator.md,
    "The replica's own work"), so neither its inserts nor its evictions make work for a
    collection on the replica's event loop."""
    cache = PrefixCache(capacity_blocks=500, block_tokens=B)
    gc.collect()
    before = len(gc.get_objects())
    for chain in range(8):  # 8 chains of 200 blocks: 1100 evicted
        cache.insert(toks(200 * B, start=chain * 10_000))
    assert len(cache) == 500 and cache.evicted_blocks == 1100
    assert len(gc.get_objects()) - before < 20  # was one object a block held
