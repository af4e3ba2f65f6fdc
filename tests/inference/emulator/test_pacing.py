"""pacing: TTFT, absolute token deadlines, chunking and coalescing (fake clock, exact times)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from inference.emulator.pacing import (
    AsyncioSleeper,
    Chunker,
    ItemWindow,
    MonotonicClock,
    decode_s,
    paced_chunks,
    token_deadlines,
    ttft_ms,
)


def approx(x):
    return pytest.approx(x, abs=1e-12)


def drain(chunker, clock, on_item=None) -> list[tuple[float, int, int]]:
    """Run ``paced_chunks`` to the end; returns (time, start, end) per item."""

    async def run():
        items = []
        async for start, end in paced_chunks(chunker, clock, clock):
            items.append((clock.now(), start, end))
            if on_item:
                on_item()
        return items

    return asyncio.run(run())


# --- time to first token ---------------------------------------------------------------


def test_ttft_is_overhead_plus_uncached_prefill(make_profile):
    p = make_profile(prefill_tokens_per_s=10_000, prefill_overhead_ms=10)
    assert ttft_ms(p, prompt_tokens=5_000, cached_tokens=0) == approx(510.0)
    assert ttft_ms(p, prompt_tokens=5_000, cached_tokens=4_000) == approx(110.0)
    assert ttft_ms(p, prompt_tokens=5_000, cached_tokens=5_000) == approx(10.0)


# --- deadlines -------------------------------------------------------------------------


def test_token_i_is_due_at_t0_plus_i_plus_one_over_rate(make_profile):
    p = make_profile(decode_tokens_per_s=1000)
    t0 = 2.0 + ttft_ms(p, 100, 0) / 1000
    deadlines = token_deadlines(p, t0, 5)
    assert deadlines == [approx(t0 + (i + 1) / 1000) for i in range(5)]


def test_the_first_burst_tokens_go_at_the_burst_rate(make_profile):
    p = make_profile(decode_tokens_per_s=1000, burst_tokens_per_s=4000, burst_tokens=4)
    deadlines = token_deadlines(p, 0.0, 6)
    assert deadlines == [approx(x) for x in (0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.003)]


def test_deadlines_are_closed_form_not_accumulated(make_profile):
    p = make_profile(decode_tokens_per_s=3)
    assert token_deadlines(p, 0.0, 30_000)[-1] == decode_s(p, 30_000) == 10_000.0


def test_no_burst_rate_means_no_burst(make_profile):
    assert decode_s(make_profile(decode_tokens_per_s=100), 10) == approx(0.1)


# --- chunking --------------------------------------------------------------------------


def test_the_first_token_goes_out_alone_as_soon_as_it_is_due():
    d = [(i + 1) / 1000 for i in range(20)]
    chunker = Chunker(d, 0.0, ItemWindow(5, 8))
    assert chunker.next_emit_time() == d[0]  # not held for a window or for 8 tokens
    assert chunker.take(d[0]) == (0, 1)
    assert chunker.next_emit_time() == approx(d[0] + 0.005)  # then the window rule


def test_at_1000_tok_s_items_follow_the_5_ms_window_after_the_first_token(make_profile, clock):
    # Token i is due at (i + 1) ms.  Token 0 alone at 1 ms; then every 5 ms (only 5 tokens
    # come due per window, so min 8 is never hit); the last 4 when token 19 is due at 20 ms.
    p = make_profile(decode_tokens_per_s=1000, min_chunk_tokens=8, chunk_ms=5)
    d = token_deadlines(p, 0.0, 20)
    items = drain(Chunker(d, 0.0, ItemWindow.of(p)), clock)
    assert [(s, e) for _, s, e in items] == [(0, 1), (1, 6), (6, 11), (11, 16), (16, 20)]
    assert [t for t, _, _ in items] == [approx(x) for x in (0.001, 0.006, 0.011, 0.016, 0.020)]


def test_a_chunk_goes_out_when_min_chunk_tokens_are_due(make_profile, clock):
    # 4096 tok/s: after the lone first token, 8 more tokens are due 1.953 ms later, well
    # before the 5 ms window; the last 3 go when the final token is due.
    p = make_profile(decode_tokens_per_s=4096, min_chunk_tokens=8, chunk_ms=5)
    d = token_deadlines(p, 0.0, 20)
    items = drain(Chunker(d, 0.0, ItemWindow.of(p)), clock)
    assert [(s, e) for _, s, e in items] == [(0, 1), (1, 9), (9, 17), (17, 20)]
    assert [t for t, _, _ in items] == [d[0], d[8], d[16], d[19]]


def test_a_chunk_goes_out_when_the_window_passes(make_profile, clock):
    # 1024 tok/s and a window of exactly 8 token-times: after the lone first token, 8 tokens
    # per item (min 16 never hit), then the last 3 when the final token is due.
    p = make_profile(decode_tokens_per_s=1024, min_chunk_tokens=16, chunk_ms=7.8125)
    d = token_deadlines(p, 0.0, 20)
    items = drain(Chunker(d, 0.0, ItemWindow.of(p)), clock)
    assert [(s, e) for _, s, e in items] == [(0, 1), (1, 9), (9, 17), (17, 20)]
    assert [t for t, _, _ in items] == [1 / 1024, 9 / 1024, 17 / 1024, 20 / 1024]


def test_slow_decode_sends_each_token_when_it_is_due(make_profile, clock):
    p = make_profile(decode_tokens_per_s=65, min_chunk_tokens=8, chunk_ms=5)
    d = token_deadlines(p, 1.0, 4)
    items = drain(Chunker(d, 1.0, ItemWindow.of(p)), clock)
    assert items == [(d[i], i, i + 1) for i in range(4)]


def test_a_consumer_that_falls_behind_gets_one_coalesced_chunk():
    d = [(i + 1) / 1000 for i in range(100)]
    chunker = Chunker(d, 0.0, ItemWindow(5, 8))
    assert chunker.take(0.0505) == (0, 50)  # 50 ms late: everything due so far, at once
    assert chunker.next_emit_time() == approx(0.0555)  # then the window restarts
    assert chunker.take(0.06) == (50, 60)
    assert chunker.take(0.06) == (60, 60)  # nothing new is due


def test_a_late_stream_catches_up_instead_of_drifting(make_profile, clock):
    # The consumer takes 20 ms per item; the stream still ends when the last token is due
    # (or right after the last slow hand-off), because deadlines are absolute.
    p = make_profile(decode_tokens_per_s=1000, min_chunk_tokens=8, chunk_ms=5)
    d = token_deadlines(p, 0.0, 100)
    items = drain(Chunker(d, 0.0, ItemWindow(5, 8)), clock, on_item=lambda: clock.advance(0.020))
    sizes = [e - s for _, s, e in items]
    assert sum(sizes) == 100 and items[-1][2] == 100
    assert max(sizes) >= 20  # coalesced
    assert len(items) <= 100 / 20 + 2
    assert items[-1][0] <= d[-1] + 0.020


def test_every_token_is_sent_once_in_order(make_profile, clock):
    p = make_profile(decode_tokens_per_s=1000, burst_tokens_per_s=4000, burst_tokens=37)
    d = token_deadlines(p, 0.0, 333)
    items = drain(Chunker(d, 0.0, ItemWindow.of(p)), clock)
    ranges = [(s, e) for _, s, e in items]
    assert ranges[0][0] == 0 and ranges[-1][1] == 333
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    # no token leaves before its deadline
    assert all(t >= d[e - 1] for t, _, e in items)


# --- the item budget under load ----------------------------------------------------------


def test_the_window_stretches_only_past_the_replicas_item_budget():
    window = ItemWindow(5, 8, max_items_per_s=3200)  # 5 ms items: 16 streams fill the budget
    window.follow(16)
    assert (window.chunk_s, window.min_tokens, window.aligned) == (0.005, 8, False)
    window.follow(64)
    assert window.aligned and window.chunk_s == approx(64 / 3200)  # 20 ms
    window.follow(3)  # the batch shrank: back to the profile's window
    assert (window.chunk_s, window.aligned) == (0.005, False)
    uncapped = ItemWindow(5, 8)
    uncapped.follow(10_000)
    assert not uncapped.aligned


def test_under_load_items_leave_on_the_window_grid_and_never_early(make_profile, clock):
    # 64 streams on a 3200 items/s budget: a 20 ms grid.  Decode starts off the grid.
    p = make_profile(decode_tokens_per_s=1000, burst_tokens_per_s=4000, burst_tokens=50, max_items_per_s=3200)
    window = ItemWindow.of(p)
    window.follow(64)
    start = 0.0123
    d = token_deadlines(p, start, 300)
    items = drain(Chunker(d, start, window), clock)
    times = [t for t, _, _ in items]
    assert items[0] == (d[0], 0, 1)  # the first token alone, the moment it is due
    assert items[-1][0] == d[-1] and items[-1][2] == 300  # the last one when it is due
    middle = times[1:-1]
    assert all(t / 0.02 == pytest.approx(round(t / 0.02)) for t in middle)  # on the ticks
    assert len({round(t / 0.02) for t in middle}) == len(middle)  # one item per tick at most
    assert all(t >= d[e - 1] for t, _, e in items)  # never before the tokens are due
    # held at most one window: each item's first token was due less than a tick before
    assert all(t - d[s] < 0.02 + 1e-12 for t, s, _ in items)


@pytest.mark.parametrize("precise", [False, True])
def test_the_real_sleeper_never_wakes_early_and_a_cancelled_sleep_does_not_disturb_the_others(precise):
    """Many sleeps at once, on the real clock (the loop's timer, or the loop's alarm for
    precise ones): each returns at or after its deadline, in deadline order (to within the
    loop's millisecond and however long the loop took to arm them), and one cancelled
    midway neither wakes nor holds back the rest."""
    clock = MonotonicClock()
    sleeper = AsyncioSleeper(clock)

    async def main() -> tuple[list[tuple[float, float]], bool, float]:
        woke: list[tuple[float, float]] = []

        async def sleep(t: float) -> None:
            await sleeper.sleep_until(t, precise)
            woke.append((t, clock.now()))

        start = clock.now()
        deadlines = [start + 0.02 + 0.001 * (i % 10) + 0.0001 * i for i in range(40)]
        cancelled = asyncio.ensure_future(sleeper.sleep_until(start + 0.025, precise))
        tasks = [asyncio.ensure_future(sleep(t)) for t in deadlines]
        await asyncio.sleep(0)  # one loop turn: every sleep has begun
        arming_s = clock.now() - start  # every timer was armed by now
        cancelled.cancel()
        await asyncio.gather(*tasks)
        await sleeper.sleep_until(clock.now() - 1.0, precise)  # already due: returns at once
        await sleep(clock.now() + 0.0001)  # shorter than the loop's timer can wait
        return woke, cancelled.cancelled(), arming_s

    woke, was_cancelled, arming_s = asyncio.run(main())
    assert len(woke) == 41 and was_cancelled
    assert all(now >= t for t, now in woke)
    # in deadline order, up to the loop's own granularity (a sleep its timer ends a hair early
    # sleeps again) and the time the loop took to arm the timers: each is armed relative to when
    # its sleep began, and a process stalled while arming them (another thread holding the GIL, a
    # collection) delays some by up to that stall, or starts them after their deadlines
    order = [t for t, _ in woke]
    slack = 0.001 + arming_s
    assert all(later > earlier - slack for earlier, later in itertools.pairwise(order)), (arming_s, order)


def test_only_the_first_and_the_last_items_ask_for_a_precise_wake_up(make_profile):
    class Recorder:
        def __init__(self) -> None:
            self.t, self.asked = 0.0, []

        def now(self) -> float:
            return self.t

        async def sleep_until(self, t: float, precise: bool = False) -> None:
            self.asked.append((t, precise))
            self.t = max(self.t, t)

    async def items(n: int) -> list[tuple[int, int]]:
        clock = Recorder()
        chunker = Chunker(token_deadlines(make_profile(), 0.0, n), 0.0, ItemWindow(5.0, 8))
        out = [r async for r in paced_chunks(chunker, clock, clock)]
        assert [p for _, p in clock.asked] == [True] + [False] * (len(out) - 2) + [True] * (len(out) > 1)
        return out

    assert asyncio.run(items(1)) == [(0, 1)]
    ranges = asyncio.run(items(40))
    assert ranges[0] == (0, 1) and ranges[-1][1] == 40 and len(ranges) > 2
