"""LoopWatch: on a real event loop, a callback that holds the loop shows as a stall of at
least that long to a response that started before it, also to one that finishes inside that
callback; a garbage collection is a stall; a stopped watch schedules nothing; its pacing of
garbage collection hears of a late probe and is reset when it stops."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from actors.host.loop_watch import TIMER_SLACK_S, LoopWatch
from inference.collector import SERVING_THRESHOLDS, BurstPacing


async def _ticks(watch: LoopWatch, n: int) -> None:
    for _ in range(n):  # a few of the probe's periods pass on the loop
        await asyncio.sleep(watch.period_s)


def test_a_callback_holding_the_loop_is_seen_as_a_stall():
    async def main() -> float:
        watch = LoopWatch(period_s=0.005)
        watch.start()
        started = time.perf_counter()
        await _ticks(watch, 2)
        time.sleep(0.05)  # holds the loop: the probe due meanwhile runs late
        await _ticks(watch, 2)
        watch.stop()
        return watch.worst_since(started)

    assert asyncio.run(main()) >= 0.05 - 0.005 - TIMER_SLACK_S


def test_start_is_idempotent_and_stop_cancels_the_probe():
    async def main() -> None:
        watch = LoopWatch(period_s=0.005)
        watch.start()
        watch.start()
        assert watch.running
        watch.stop()
        assert not watch.running
        watch.stop()

    asyncio.run(main())


def test_a_stall_going_on_when_a_response_finishes_is_reported():
    async def main() -> tuple[float, float]:
        watch = LoopWatch(period_s=0.005)
        watch.start()
        await _ticks(watch, 2)
        started = time.perf_counter()
        time.sleep(0.05)  # the response finishes in this very callback: no probe has run since
        during = watch.worst_since(started)
        watch.stop()
        return during, time.perf_counter() - started

    during, elapsed = asyncio.run(main())
    assert elapsed >= during >= 0.05 - 0.005 - TIMER_SLACK_S


def test_a_garbage_collection_is_recorded_as_a_stall_as_it_ends():
    ticks = [100.0]

    def perf() -> float:  # every reading is 10 ms after the one before
        ticks[0] += 0.01
        return ticks[0]

    async def main() -> tuple[float, float]:
        watch = LoopWatch(period_s=60.0, perf=perf)  # the probe never comes due
        watch.start()
        began = perf()
        gc.collect()  # read at its start and at its end: a 10 ms stall
        seen = watch.worst_since(began), watch.worst_since(perf())
        watch.stop()
        gc.collect()  # a stopped watch no longer listens
        return seen

    during, after = asyncio.run(main())
    assert during == pytest.approx(0.01)
    assert after == 0.0


def test_a_late_probe_holds_young_collections_until_the_watch_stops():
    thresholds: list[tuple[int, int, int]] = []
    collected: list[int] = []
    pacing = BurstPacing(
        get_threshold=lambda: SERVING_THRESHOLDS,
        set_threshold=lambda *t: thresholds.append(t),
        get_count=lambda: (0, 0, 0),
        collect=lambda generation: collected.append(generation) or 0,
    )

    async def main() -> bool:
        watch = LoopWatch(period_s=0.005, pacing=pacing)
        watch.start()
        await _ticks(watch, 2)
        time.sleep(0.05)  # holds the loop: the probe due meanwhile runs late
        await _ticks(watch, 1)
        busy = pacing.busy
        watch.stop()
        return busy

    assert asyncio.run(main())
    assert not pacing.busy and pacing.bursts >= 1
    assert thresholds[-1] == SERVING_THRESHOLDS and collected == [0] * pacing.bursts
