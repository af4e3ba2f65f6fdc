"""Continuous batching on one replica (sans-I/O): the running batch, the waiting queue,
and each running sequence's token deadlines as the batch size changes.

The load model (``BatchingConfig``, docs/emulator.md): with ``b`` sequences running, every
token of every running sequence takes its single-stream time multiplied by
``step_factor(b)``.  The factor is piecewise constant — it changes only when a sequence
joins or leaves the batch — so a sequence's token deadlines stay closed-form within each
piece.  ``DecodeSchedule`` keeps, per sequence, how much decode *work* (seconds at factor 1)
was done by the last change, and computes every deadline from that anchor; nothing is
accumulated from sleeps, so a late wake-up never delays later tokens.

Simplifications (documented, deliberate): a sequence holds its batch slot from admission
to its last token or cancellation, including its prefill; prefill time does not depend on
the batch (it has its own per-token cost); a sequence's wake-up is not moved *earlier* when
the batch shrinks while it sleeps — it wakes at the time computed before, at most one chunk
window late, and then takes every token already due.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from inference.emulator.profiles import BatchingConfig


class EngineOverloaded(RuntimeError):
    """The replica's waiting queue is full (``batching.max_waiting``); nothing was started.

    ``args == (limit,)`` so the exception pickles across Ray unchanged."""

    code = "server_is_overloaded"
    status = 503

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit

    def __str__(self) -> str:
        return f"The model is overloaded ({self.limit} requests waiting). Retry later."


def step_factor(b: int, cfg: BatchingConfig) -> float:
    """Inter-token latency multiplier with ``b`` sequences running (1.0 for ``b <= 1``).

    ``(1 + itl_growth_per_seq * (min(b, knee) - 1)) * max(1, b / knee)``."""
    if b <= 1:
        return 1.0
    below = 1.0 + cfg.itl_growth_per_seq * (min(b, cfg.knee) - 1)
    return below * max(1.0, b / cfg.knee)


def steady_tokens_per_s(single_stream_tokens_per_s: float, b: int, cfg: BatchingConfig) -> float:
    """The model's per-stream decode rate with ``b`` streams decoding together (no jitter,
    past any burst): the prediction the fidelity benchmark compares against."""
    return single_stream_tokens_per_s / step_factor(min(b, cfg.max_running), cfg)


class Batch:
    """Which sequences run and which wait (FIFO).  Sequence ids are any hashable."""

    def __init__(self, cfg: BatchingConfig) -> None:
        self._cfg = cfg
        self._running: set[Hashable] = set()
        self._waiting: OrderedDict[Hashable, None] = OrderedDict()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def factor(self) -> float:
        return step_factor(len(self._running), self._cfg)

    def submit(self, seq: Hashable) -> bool:
        """Admit ``seq`` (True) or queue it (False); raises ``EngineOverloaded`` if the
        queue is full.  Nobody overtakes the queue: while anyone waits, newcomers wait."""
        if len(self._running) < self._cfg.max_running and not self._waiting:
            self._running.add(seq)
            return True
        if len(self._waiting) >= self._cfg.max_waiting:
            raise EngineOverloaded(self._cfg.max_waiting)
        self._waiting[seq] = None
        return False

    def release(self, seq: Hashable) -> list[Hashable]:
        """``seq`` finished or was cancelled (running or still waiting); returns the
        sequences admitted from the queue into the freed slots, in FIFO order."""
        self._running.discard(seq)
        self._waiting.pop(seq, None)
        admitted = []
        while self._waiting and len(self._running) < self._cfg.max_running:
            nxt, _ = self._waiting.popitem(last=False)
            self._running.add(nxt)
            admitted.append(nxt)
        return admitted


class DecodeSchedule:
    """Absolute deadlines of one sequence's tokens under a changing step factor.

    ``work[i]`` is the cumulative decode time (seconds, at factor 1, jitter included) up to
    and including token ``i``.  Decode starts at ``start``; token ``i`` is due at
    ``anchor_t + (work[i] - anchor_work) * factor`` where the anchor is the last factor
    change (or ``start``).
    """

    def __init__(self, work: Sequence[float], start: float, factor: float) -> None:
        self._work = work
        self._anchor_t = start
        self._anchor_work = 0.0
        self._factor = factor

    def __len__(self) -> int:
        return len(self._work)

    @property
    def factor(self) -> float:
        return self._factor

    def set_factor(self, t: float, factor: float) -> None:
        """From time ``t`` on, tokens take ``factor`` times their single-stream time."""
        if t > self._anchor_t:  # decode is under way: bank the work done at the old factor
            self._anchor_work += (t - self._anchor_t) / self._factor
            self._anchor_t = t
        self._factor = factor

    def deadline(self, i: int) -> float:
        return self._anchor_t + (self._work[i] - self._anchor_work) * self._factor

    def due(self, now: float, lo: int = 0) -> int:
        """How many tokens are due at ``now`` (``deadline(i) <= now``), searching from
        ``lo`` (tokens before it are known to be due).  Uses ``deadline`` itself, so a
        sleeper woken at ``deadline(i)`` always finds token ``i`` due."""
        hi = len(self._work)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.deadline(mid) <= now:
                lo = mid + 1
            else:
                hi = mid
        return lo
