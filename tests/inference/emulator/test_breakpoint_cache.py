"""breakpoint_cache: the breakpoint rule's plan, reads and writes, TTLs under a fake clock,
bounds, and keys that are the same whether the prompt's blocks were hashed in pieces or whole."""

from __future__ import annotations

import asyncio
from array import array

import pytest

from inference.emulator.breakpoint_cache import MATCH_WINDOW, TTL_S, BreakpointCache, plan, prefix_key
from inference.emulator.engine import Engine
from inference.emulator.prefix_cache import as_bytes, block_keys
from inference.types import Breakpoint, InferenceRequest, Prefilled
from tests.inference.emulator.conftest import FakeClock, config, profile

B = 4


def bp(offset: int, ttl=None, implicit: bool = False) -> Breakpoint:
    return Breakpoint(offset, ttl, implicit)


# --- the plan: what a request reads and writes ----------------------------------------------


def test_implicit_mode_writes_the_prompt_end_and_the_latest_three_explicit():
    p = plan([bp(10), bp(20), bp(30), bp(40)], 100, "implicit", "30m")
    assert p.writes == ((20, "30m"), (30, "30m"), (40, "30m"), (100, "30m"))
    assert p.candidates == (100, 40, 30, 20, 10)


def test_explicit_mode_writes_the_latest_four_and_nothing_without_breakpoints():
    p = plan([bp(o) for o in (10, 20, 30, 40, 50)], 100, "explicit", "30m")
    assert p.writes == ((20, "30m"), (30, "30m"), (40, "30m"), (50, "30m"))
    assert p.candidates == (50, 40, 30, 20, 10)  # the prompt's end is no breakpoint here
    assert plan([bp(60, implicit=True)], 100, "explicit", "30m") == plan([], 100, "explicit", "12h")
    assert plan([], 100, "explicit", "30m").writes == ()


def test_a_breakpoint_ttl_overrides_the_request_ttl_and_duplicates_keep_the_longer():
    p = plan([bp(10, "12h"), bp(20), bp(20, "12h"), bp(30)], 50, "explicit", "30m")
    assert p.writes == ((10, "12h"), (20, "12h"), (30, "30m"))
    assert plan([bp(10)], 50, "explicit", "12h").writes == ((10, "12h"),)


def test_matching_considers_only_the_latest_80_breakpoints():
    marks = [bp(o) for o in range(1, 200)]
    p = plan(marks, 1000, "explicit", "30m")
    assert len(p.candidates) == MATCH_WINDOW
    assert p.candidates[-1] == 199 - MATCH_WINDOW + 1


def test_earlier_prompt_ends_are_candidates_in_implicit_mode_only_and_never_written():
    p = plan([bp(40, implicit=True)], 100, "implicit", "30m")
    assert p.candidates == (100, 40) and p.writes == ((100, "30m"),)


def test_breakpoints_outside_the_prompt_are_ignored():
    assert plan([bp(0), bp(101)], 100, "explicit", "30m") == plan([], 100, "explicit", "30m")


# --- reads, writes, lifetimes ------------------------------------------------------------------


def test_a_read_is_the_longest_held_candidate_and_writes_add_what_is_new():
    cache = BreakpointCache(1000)
    first = cache.serve([(100, 1)], [(40, 2, "30m"), (100, 1, "12h")], now=0.0)
    assert first.read == 0 and first.written == (40, 60)
    again = cache.serve([(150, 3), (100, 1), (40, 2)], [(150, 3, "30m")], now=1.0)
    assert again.read == 100 and again.written == (50, 0)  # past the 100 it read
    assert cache.held_tokens == 150
    held = cache.serve([(150, 3)], [(150, 3, "30m")], now=2.0)
    assert held.read == 150 and held.written == (0, 0)  # a held entry is refreshed, not rewritten


def test_entries_are_kept_their_ttl_and_evicted_by_capacity_after_it():
    cache = BreakpointCache(100)
    assert cache.serve([], [(100, 1, "30m")], now=0.0).written == (100, 0)
    refused = cache.serve([], [(50, 2, "30m")], now=TTL_S["30m"] - 1)
    assert refused.written == (0, 0) and cache.refused_writes == 1  # full of a live entry
    assert cache.serve([(100, 1)], [], now=TTL_S["30m"] - 1).read == 100  # and a read refreshes it
    assert cache.serve([], [(50, 2, "30m")], now=2 * TTL_S["30m"] - 2).written == (0, 0)
    later = 2 * TTL_S["30m"]  # past the refreshed lifetime: capacity may evict it
    assert cache.serve([], [(50, 2, "30m")], now=later).written == (50, 0)
    assert cache.serve([(100, 1)], [], now=later).read == 0 and cache.evicted == 1


def test_a_12h_entry_outlives_a_30m_one():
    cache = BreakpointCache(100)
    cache.serve([], [(50, 1, "30m"), (100, 2, "12h")], now=0.0)  # adds 50 + 50
    assert cache.serve([], [(30, 3, "30m")], now=TTL_S["30m"] + 1).written == (30, 0)  # the 30m one went
    assert cache.serve([(100, 2), (50, 1)], [], now=TTL_S["12h"] - 1).read == 100


def test_the_cache_stays_bounded_by_entries():
    cache = BreakpointCache(10_000, max_entries=3)
    for i in range(10):
        cache.serve([], [(i + 1, 100 + i, "30m")], now=i * TTL_S["12h"])
    assert len(cache) <= 3
    assert len(cache._expiry) <= 2 * len(cache) + 64


def test_capacity_zero_is_off():
    cache = BreakpointCache(0)
    assert cache.serve([(5, 1)], [(5, 1, "30m")], now=0.0).written == (0, 0) and len(cache) == 0


# --- keys: fed in pieces equals fed whole -------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 3, 4, 9, 16, 17])
def test_keys_from_blocks_hashed_in_pieces_equal_keys_hashed_whole(cut):
    tokens = array("I", range(1000, 1023))
    data = as_bytes(tokens)
    whole = block_keys(tokens, B, root=7)
    pieces = block_keys(tokens, B, known=block_keys(tokens[:cut], B, root=7), root=7)
    assert pieces == whole
    for offset in range(1, len(tokens) + 1):
        assert prefix_key(data, offset, B, pieces, 7) == prefix_key(data, offset, B, whole, 7)
    assert len({prefix_key(data, o, B, whole, 7) for o in range(1, 24)}) == 23  # exact ends differ


# --- in the engine: a pinned session's conversation ------------------------------------------


def _prefilled(engine: Engine, prompt, **kw) -> Prefilled:
    req = InferenceRequest(
        request_id="r", model="emu-test", prompt_token_ids=array("I", prompt), session_key="s", **kw
    )

    async def first():
        async for chunk in engine.generate(req):
            return chunk[0]

    return asyncio.run(first())


def test_the_engine_reads_and_writes_by_breakpoints_and_hashes_only_new_blocks(monkeypatch):
    clock = FakeClock()
    cfg = config(profile(prompt_cache="breakpoints"), prefix_cache={"block_tokens": B})
    engine = Engine(cfg, clock, clock)
    system = list(range(10, 33))  # 23 tokens: not a multiple of the block
    turn1 = system + list(range(500, 530))
    p1 = _prefilled(engine, turn1, breakpoints=(bp(len(system)),), generate=False)
    assert (p1.cached_tokens, p1.written) == (0, (len(turn1), 0))
    hashed: list[int] = []
    real = block_keys

    def counting(tokens, block_tokens, known=(), root=0):
        hashed.append(len(tokens) // block_tokens - len(known[: len(tokens) // block_tokens]))
        return real(tokens, block_tokens, known, root)

    monkeypatch.setattr("inference.emulator.engine.block_keys", counting)
    turn2 = turn1 + list(range(900, 910))
    p2 = _prefilled(
        engine, turn2, breakpoints=(bp(len(system), "12h"), bp(len(turn1), implicit=True)), generate=False
    )
    # Read: the end of turn 1's prompt (its implicit breakpoint); written: the 10 new tokens.
    assert (p2.cached_tokens, p2.reused_tokens, p2.written) == (len(turn1), len(turn1), (10, 0))
    assert hashed[0] <= 3  # only the blocks past what the session had hashed before
    other = _prefilled(engine, system + [1], breakpoints=(bp(len(system)),), generate=False)
    assert other.cached_tokens == len(system)  # the exact end, not rounded to a block
