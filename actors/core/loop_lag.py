"""How long a session host's event loop kept ready work waiting, lately: the figure behind
each response's ``loop_lag`` timing (docs/performance.md, "Timings users can see").

A host serves all of its connections on one event loop, so one connection's long step (a
first turn's 30 KB create, a long history's render) holds every other connection's ready
callbacks back.  A periodic probe (:class:`actors.host.loop_watch.LoopWatch`) records, each
time it runs, how late it ran (:meth:`LoopLag.record`); a response asks, when it finishes,
for the worst stall within its own time on the server (:meth:`LoopLag.worst_since`).

A stall that ended at ``t`` after ``lag`` seconds began at ``t - lag``: a response that
started during it was held back only for the part after its start.  Samples are kept in a
ring of fixed-width buckets (the worst of each), so a query costs one step per bucket the
response spans and memory stays bounded.  Pure: times are the caller's clock, in seconds.
"""

from __future__ import annotations

import math


class LoopLag:
    """The worst probe lag per ``bucket_s`` of time, for the last ``buckets`` buckets."""

    __slots__ = ("_bucket_s", "_ends", "_ids", "_lags", "_latest", "_size")

    def __init__(self, bucket_s: float = 0.02, buckets: int = 3000) -> None:
        if bucket_s <= 0 or buckets < 1:
            raise ValueError("bucket_s must be > 0 and buckets >= 1")
        self._bucket_s = bucket_s
        self._size = buckets
        self._ids = [-1] * buckets  # which bucket each slot holds now
        self._lags = [0.0] * buckets  # its worst lag (s)
        self._ends = [0.0] * buckets  # when that stall ended
        self._latest = -1

    def record(self, t: float, lag_s: float) -> None:
        """A probe due at ``t - lag_s`` ran at ``t``."""
        if lag_s <= 0:
            return
        b = math.floor(t / self._bucket_s)
        slot = b % self._size
        if self._ids[slot] != b:
            self._ids[slot], self._lags[slot], self._ends[slot] = b, lag_s, t
        elif lag_s > self._lags[slot]:
            self._lags[slot], self._ends[slot] = lag_s, t
        if b > self._latest:
            self._latest = b

    def worst_since(self, since: float) -> float:
        """The longest the loop kept work waiting after ``since`` (seconds; 0.0 if no probe
        was late since then, or ``since`` is older than the ring)."""
        first = max(math.floor(since / self._bucket_s), self._latest - self._size + 1)
        worst = 0.0
        ids, lags, ends = self._ids, self._lags, self._ends
        for b in range(first, self._latest + 1):
            slot = b % self._size
            if ids[slot] == b:
                held = min(lags[slot], ends[slot] - since)
                if held > worst:
                    worst = held
        return worst


__all__ = ["LoopLag"]
