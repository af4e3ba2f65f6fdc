"""A session host's event-loop probe: while the host serves WebSockets, a callback scheduled
every ``period_s`` records how late it ran (:class:`~actors.core.loop_lag.LoopLag`); each
response reports the worst stall within its time on the server as its ``loop_lag`` timing
(and so in the ``responses_ws_phase_seconds`` histogram, ``phase="loop_lag"``).

A host with no WebSocket open runs no probe: an idle host does not wake for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ..core.loop_lag import LoopLag

PERIOD_S = 0.02  # 50 wake-ups a second while serving: a few microseconds each
# uvloop (Ray's actors run it) keeps timers to the millisecond: a probe on time runs up to
# 1 ms after it was due.  Only lateness beyond that counts.
TIMER_SLACK_S = 0.001


class LoopWatch:
    def __init__(self, period_s: float = PERIOD_S, perf: Callable[[], float] = time.perf_counter) -> None:
        self.lag = LoopLag(bucket_s=period_s)
        self.period_s = period_s
        self._perf = perf
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def worst_since(self, since: float) -> float:
        """The loop's longest stall (s) after ``since`` (``perf``'s clock)."""
        return self.lag.worst_since(since)

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Probe from now on (on the running loop); no-op if probing already."""
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._due = self._perf() + self.period_s
            self._handle = loop.call_later(self.period_s, self._tick, loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = self._perf()
        self.lag.record(now, now - self._due - TIMER_SLACK_S)
        self._due = now + self.period_s
        self._handle = loop.call_later(self.period_s, self._tick, loop)


__all__ = ["PERIOD_S", "TIMER_SLACK_S", "LoopWatch"]
