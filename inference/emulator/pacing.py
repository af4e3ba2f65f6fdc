"""The latency model: when the first token and each later token are due, and how due
tokens are grouped into stream items.

Everything is a pure function of explicit parameters; time comes from an injected
``Clock`` and waiting from an injected ``Sleeper``, so tests drive it with a fake clock
and assert exact times.  Tokens are scheduled against *absolute*
deadlines computed in closed form from the decode start, never by summing sleeps, so a
late wake-up does not push every later token back: the stream catches up by coalescing.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, overload

from inference.emulator.alarm import alarm_for
from inference.emulator.profiles import ModelProfile


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic time in seconds."""
        ...


class Sleeper(Protocol):
    async def sleep_until(self, t: float, precise: bool = False) -> None:
        """Return once the clock reads at least ``t`` (immediately if it already does);
        ``precise``: as soon after ``t`` as the machine allows (a response's first and last
        tokens), at some CPU cost, rather than when the event loop's timer gets to it."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic()``."""

    def now(self) -> float:
        return time.monotonic()


class AsyncioSleeper:
    """The real sleeper, on the event loop alone.  The loop's timers fire up to a
    millisecond late (its selector waits in whole milliseconds, rounded up), so a
    ``precise`` sleep (a response's first and last tokens) waits on the loop's
    :class:`inference.emulator.alarm.Alarm` instead: a kernel timer the loop watches, which wakes it
    within microseconds of the deadline, at the cost of a system call or two.  Without one
    (not Linux) a precise sleep is the loop's timer too.  ``clock`` must be the monotonic
    clock the deadlines are on."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def sleep_until(self, t: float, precise: bool = False) -> None:
        while (delay := t - self._clock.now()) > 0:  # the clock may read a hair early: check again
            alarm = alarm_for(asyncio.get_running_loop()) if precise else None
            if alarm is None:
                await asyncio.sleep(delay)
            else:
                await alarm.wait(delay)


def ttft_ms(profile: ModelProfile, prompt_tokens: int, cached_tokens: int) -> float:
    """Prefill time in ms: fixed overhead plus prefill of the uncached tokens.

    ``prefill_overhead_ms + (prompt_tokens - cached_tokens) * 1000 / prefill_tokens_per_s``.
    Queueing (``Prefilled.queue_ms``) comes before it, the request's jitter factor
    multiplies it, and the first token is due one decode step after it (docs/emulator.md).
    """
    uncached = max(0, prompt_tokens - cached_tokens)
    return profile.prefill_overhead_ms + uncached * 1000.0 / profile.prefill_tokens_per_s


def decode_s(profile: ModelProfile, k: int) -> float:
    """Seconds to decode the first ``k`` tokens of a response: the first ``burst_tokens``
    at ``burst_tokens_per_s``, the rest at ``decode_tokens_per_s`` (a token bucket that
    starts full and does not refill within a response)."""
    rate = profile.burst_tokens_per_s
    if rate is None or profile.burst_tokens == 0:
        return k / profile.decode_tokens_per_s
    burst = profile.burst_tokens
    if k <= burst:
        return k / rate
    return burst / rate + (k - burst) / profile.decode_tokens_per_s


def decode_work(
    profile: ModelProfile, n: int, request_factor: float = 1.0, token_factors: Sequence[float] | None = None
) -> Sequence[float]:
    """Cumulative single-stream decode time (s) up to and including each of ``n`` tokens.

    Token ``i`` alone takes ``decode_s(i + 1) - decode_s(i)`` (the burst schedule), times
    the request's jitter factor and its own.  Without token jitter the values are the
    closed form ``request_factor * decode_s(i + 1)`` (no accumulated rounding), computed
    when asked for (``ClosedFormWork``): a response's start does not pay for its length."""
    if token_factors is None:
        return ClosedFormWork(profile, n, request_factor)
    work, total, prev = [], 0.0, 0.0
    for i in range(n):
        cur = decode_s(profile, i + 1)
        total += (cur - prev) * request_factor * token_factors[i]
        prev = cur
        work.append(total)
    return work


class ClosedFormWork(Sequence[float]):
    """``decode_work`` without token jitter, as a sequence: item ``i`` is
    ``request_factor * decode_s(profile, i + 1)``, computed on access."""

    __slots__ = ("_factor", "_n", "_profile")

    def __init__(self, profile: ModelProfile, n: int, request_factor: float) -> None:
        self._profile = profile
        self._n = n
        self._factor = request_factor

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> float: ...

    @overload
    def __getitem__(self, i: slice) -> list[float]: ...

    def __getitem__(self, i: int | slice) -> float | list[float]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._factor * decode_s(self._profile, i + 1)


def token_deadlines(profile: ModelProfile, t0: float, n: int) -> list[float]:
    """Absolute deadline (seconds) of each of ``n`` output tokens.

    ``t0`` is the decode start, i.e. request start + TTFT; token ``i`` (0-based) is due at
    ``t0 + decode_s(profile, i + 1)``, e.g. ``t0 + (i + 1) / 1000`` at 1000 tok/s.
    """
    return [t0 + decode_s(profile, i + 1) for i in range(n)]


class Schedule(Protocol):
    """Deadlines that may move while a stream runs (``batching.DecodeSchedule``)."""

    def __len__(self) -> int: ...

    def deadline(self, i: int) -> float: ...

    def due(self, now: float, lo: int = 0) -> int: ...


class FixedDeadlines:
    """A ``Schedule`` over a precomputed list of absolute deadlines."""

    def __init__(self, deadlines: Sequence[float]) -> None:
        self._deadlines = deadlines

    def __len__(self) -> int:
        return len(self._deadlines)

    def deadline(self, i: int) -> float:
        return self._deadlines[i]

    def due(self, now: float, lo: int = 0) -> int:
        return bisect_right(self._deadlines, now, lo=lo)


class ItemWindow:
    """When a stream's due tokens make an item (sans-I/O; one per model on a replica, shared
    by its streams' ``Chunker``s).

    At light load: every ``chunk_ms`` after the last item, or as soon as
    ``min_chunk_tokens`` are due.  ``max_items_per_s`` caps the items per second a replica
    sends for the model in all — every item costs the same whatever it carries (a Ray
    message; downstream a protocol event, a WebSocket frame, a client wake-up).  With ``b``
    streams running and ``b * 1000 / chunk_ms`` above the cap, the window stretches to
    ``b / max_items_per_s`` and is *aligned*: items leave on the ticks of a grid of that
    period on the replica's clock, one per stream and tick at most, so the streams' items
    leave together (one wake-up of the replica per tick, not one per stream) and the cap
    holds whatever the streams' rates.  Tokens are only ever held, never sent before they
    are due: at most one window; the first token of a response still goes out alone the
    moment it is due, and the last when it is due (a response ends on time).
    """

    __slots__ = ("_base_s", "_max_items_per_s", "aligned", "chunk_s", "min_tokens")

    def __init__(self, chunk_ms: float, min_chunk_tokens: int, max_items_per_s: float | None = None) -> None:
        self._base_s = chunk_ms / 1000.0
        self._max_items_per_s = max_items_per_s
        self.chunk_s = self._base_s
        self.min_tokens = max(1, min_chunk_tokens)
        self.aligned = False

    @classmethod
    def of(cls, profile: ModelProfile) -> ItemWindow:
        return cls(profile.chunk_ms, profile.min_chunk_tokens, profile.max_items_per_s)

    def follow(self, running: int) -> None:
        """``running`` streams share the item budget from now on."""
        cap = self._max_items_per_s
        self.aligned = cap is not None and running > cap * self._base_s
        self.chunk_s = running / cap if cap is not None and self.aligned else self._base_s


class Chunker:
    """Groups due tokens into stream items (sans-I/O; the async driver is ``paced_chunks``).

    The first token goes out alone as soon as it is due (time to first token is not padded
    by chunking).  After that, at light load, an item is due when ``min_tokens`` pending
    tokens are due, or when ``chunk_s`` has passed since the last item and at least one
    token is due, whichever comes first; under load (``ItemWindow.aligned``), on the next
    tick of the window's grid at which a token is due.  The last tokens go out when the
    final one is due.  ``take(now)`` hands out *every* token due at ``now``, so a consumer
    that fell behind gets one larger item instead of a backlog of small ones.
    """

    def __init__(self, deadlines: Sequence[float] | Schedule, start: float, window: ItemWindow) -> None:
        self._schedule: Schedule = FixedDeadlines(deadlines) if isinstance(deadlines, Sequence) else deadlines
        self._window = window
        self._sent = 0
        self._last_emit = start

    @property
    def sent(self) -> int:
        return self._sent

    @property
    def done(self) -> bool:
        return self._sent >= len(self._schedule)

    @property
    def last_emit(self) -> float:
        return self._last_emit

    def first_or_last(self, t: float) -> bool:
        """Whether the next item, due at ``t`` (:meth:`next_emit_time`), holds the first token
        or the last (only meaningful while not ``done``)."""
        sched = self._schedule
        return self._sent == 0 or t >= sched.deadline(len(sched) - 1)

    def next_emit_time(self) -> float:
        """When the next item is due (only meaningful while not ``done``)."""
        sched = self._schedule
        first_due = sched.deadline(self._sent)
        if self._sent == 0:  # the first token is never held back
            return first_due
        window = self._window
        last_due = sched.deadline(len(sched) - 1)
        if window.aligned:  # the first tick after the last item's at which a token is due
            period = window.chunk_s
            tick = max(math.ceil(first_due / period), math.floor(self._last_emit / period) + 1) * period
            return max(first_due, min(tick, last_due))
        enough_due = sched.deadline(min(self._sent + window.min_tokens, len(sched)) - 1)
        return max(first_due, min(enough_due, self._last_emit + window.chunk_s))

    def take(self, now: float) -> tuple[int, int]:
        """The half-open token range ``[start, end)`` due at ``now`` and not yet sent; empty
        (``start == end``) if nothing is due."""
        start = self._sent
        end = self._schedule.due(now, lo=start)
        if end > start:
            self._sent = end
            self._last_emit = now
        return start, end


async def paced_chunks(chunker: Chunker, clock: Clock, sleeper: Sleeper) -> AsyncIterator[tuple[int, int]]:
    """Yield token ranges ``(start, end)`` as they come due, until every token is sent."""
    while not chunker.done:
        t = chunker.next_emit_time()
        await sleeper.sleep_until(t, precise=chunker.first_or_last(t))
        start, end = chunker.take(clock.now())
        if end > start:
            yield start, end
