"""LoopWatch: on a real event loop, a callback that holds the loop shows as a stall of at
least that long to a response that started before it; a stopped watch schedules nothing."""

from __future__ import annotations

import asyncio
import time

from actors.host.loop_watch import TIMER_SLACK_S, LoopWatch


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
