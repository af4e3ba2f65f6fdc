"""A session host's event-loop probe: while the host serves WebSockets, a callback scheduled
every ``period_s`` records how late it ran (:class:`~actors.core.loop_lag.LoopLag`); each
response reports the worst stall within its time on the server as its ``loop_lag`` timing
(and so in the ``responses_ws_phase_seconds`` histogram, ``phase="loop_lag"``).

The probe alone sees a stall only once it has ended and the probe has run, so two more
sources make a response that finishes right after a stall see it too:

- the probe's own lateness at the moment of the question: a probe due before now that has
  not run yet means the loop has kept it waiting since it was due (:meth:`worst_since`);
- every garbage collection in the process (``gc.callbacks``): a collection holds the
  interpreter, and so the loop, for its whole length; it is recorded as a stall when it
  ends, before the code that triggered it carries on.

A host with no WebSocket open runs no probe: an idle host does not wake for it.

Given a :class:`~inference.collector.BurstPacing`, each probe tells it how late it ran, so
young garbage collections wait while the loop is behind (a storm of first turns) and run
once it is on time again.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

from inference.collector import BurstPacing

from ..core.loop_lag import LoopLag

PERIOD_S = 0.02  # 50 wake-ups a second while serving: a few microseconds each
# uvloop (Ray's actors run it) keeps timers to the millisecond: a probe on time runs up to
# 1 ms after it was due.  Only lateness beyond that counts.
TIMER_SLACK_S = 0.001


class LoopWatch:
    def __init__(
        self,
        period_s: float = PERIOD_S,
        perf: Callable[[], float] = time.perf_counter,
        pacing: BurstPacing | None = None,
    ) -> None:
        self.lag = LoopLag(bucket_s=period_s)
        self.pacing = pacing
        self.period_s = period_s
        self._perf = perf
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._collecting = 0.0  # when the running garbage collection began

    def worst_since(self, since: float) -> float:
        """The loop's longest stall (s) after ``since`` (``perf``'s clock), the one going on
        now (an overdue probe) included."""
        worst = self.lag.worst_since(since)
        if self._handle is not None:
            now = self._perf()
            overdue = min(now - self._due - TIMER_SLACK_S, now - since)
            if overdue > worst:
                worst = overdue
        return worst

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Probe from now on (on the running loop); no-op if probing already."""
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._due = self._perf() + self.period_s
            self._handle = loop.call_later(self.period_s, self._tick, loop)
            gc.callbacks.append(self._collection)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            gc.callbacks.remove(self._collection)
            if self.pacing is not None:
                self.pacing.reset()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = self._perf()
        late = now - self._due - TIMER_SLACK_S
        self.lag.record(now, late)
        if self.pacing is not None:
            self.pacing.probed(late)
        self._due = now + self.period_s
        self._handle = loop.call_later(self.period_s, self._tick, loop)

    def _collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting = self._perf()
        else:
            now = self._perf()
            self.lag.record(now, now - self._collecting)


__all__ = ["PERIOD_S", "TIMER_SLACK_S", "LoopWatch"]
