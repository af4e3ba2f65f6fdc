"""The decisions of a drain, as pure logic with an injected clock.

A drain has three phases from its start (docs/reliability.md, "Drains"):

1. **hold** (``hold_s``): ``/readyz`` answers 503, upgrades are refused (503,
   ``Retry-After``), creates get ``server_shutting_down``, responses in flight go on; no
   socket closes yet, so the balancer's health check sees the node fail before any client
   reconnects (and is sent back here).  A drain of the node has a hold, and so has a Serve
   stop of a gateway alone on its node; a Serve stop of one of several gateways sharing the
   node's port has none (the port's other listeners on the node go on).
2. **closing**: each socket whose responses have all ended closes with 1012, at most
   ``batch_size`` per ``batch_interval_s`` so that reconnects do not arrive as one storm.
3. **cut-off** (``budget_s``): whatever is still open closes now, responses in flight or
   not (1012: the client retries).  The budget is ``drain_timeout_s``, or less when the
   node's deadline comes sooner: the deadline minus a margin for the close frames to leave
   before the node is killed.

:class:`DrainPlan` is computed once where the drain starts (the gateway) and sent to every
session host of the node, each with its share of the batch (:meth:`DrainPlan.share`); a
host runs it with a :class:`CloseSchedule` on its own clock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class DrainSettings:
    """The configured drain (``server.drain_*``: serve/config.py)."""

    timeout_s: float  # the longest drain: responses in flight may run this long
    health_grace_s: float  # a node drain's hold: the balancer's check interval × fall
    deadline_margin_s: float  # the cut-off comes this long before the node's deadline
    batch_size: int  # sockets closed per batch, per node
    batch_interval_s: float  # between batches


def budget_s(settings: DrainSettings, remaining_s: float | None) -> float:
    """How long the drain may take: ``timeout_s``, or the time left before the node's
    deadline (``remaining_s``; ``None``: no deadline) minus the margin, if that is sooner;
    never negative (a deadline already past: cut off at once)."""
    if remaining_s is None:
        return settings.timeout_s
    return max(0.0, min(settings.timeout_s, remaining_s - settings.deadline_margin_s))


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """A drain's schedule, relative to its start (seconds)."""

    hold_s: float
    budget_s: float
    batch_size: int
    batch_interval_s: float

    @classmethod
    def make(cls, settings: DrainSettings, *, remaining_s: float | None, hold: bool) -> DrainPlan:
        """The plan of a drain that starts now with ``remaining_s`` before the node's deadline
        (``None``: none); ``hold``: a drain of the node (the balancer must notice first)."""
        budget = budget_s(settings, remaining_s)
        return cls(
            hold_s=min(settings.health_grace_s, budget) if hold else 0.0,
            budget_s=budget,
            batch_size=settings.batch_size,
            batch_interval_s=settings.batch_interval_s,
        )

    def share(self, hosts: int) -> DrainPlan:
        """Each of ``hosts`` session hosts' part of the node's batches (rounded up)."""
        return replace(self, batch_size=max(1, math.ceil(self.batch_size / max(1, hosts))))

    def after(self, elapsed_s: float) -> DrainPlan:
        """The same drain seen ``elapsed_s`` after its start (a host told late, or a
        second plan merged into a running drain)."""
        return replace(
            self, hold_s=max(0.0, self.hold_s - elapsed_s), budget_s=max(0.0, self.budget_s - elapsed_s)
        )

    def sooner(self, other: DrainPlan) -> DrainPlan:
        """The stricter of two plans of one drain (both relative to the same instant):
        the earlier cut-off, the shorter hold."""
        return replace(
            self, hold_s=min(self.hold_s, other.hold_s), budget_s=min(self.budget_s, other.budget_s)
        )


class Phase(enum.Enum):
    HOLD = "hold"
    CLOSING = "closing"
    CUT_OFF = "cut_off"


# Every transition of a drain's lifecycle.  Time only moves it on; a hold of 0 (no hold, or
# a deadline already past) goes straight to closing or to the cut-off.
PHASE_MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.HOLD: frozenset({Phase.CLOSING, Phase.CUT_OFF}),
    Phase.CLOSING: frozenset({Phase.CUT_OFF}),
    Phase.CUT_OFF: frozenset(),
}


class InvalidPhaseMove(RuntimeError):
    """A drain moved between phases the lifecycle does not list (a bug: a clock that went
    back, a plan loosened)."""


class CloseSchedule:
    """When a session host may close its drained sockets: none during the hold, then
    ``batch_size`` more per ``batch_interval_s``, all at the cut-off.  ``clock``: seconds,
    monotonic (``time.monotonic`` in the host, a fake in tests)."""

    def __init__(self, plan: DrainPlan, clock: Callable[[], float]) -> None:
        self._plan = plan
        self._clock = clock
        self._start = clock()
        self.closed = 0  # sockets released so far
        self._phase = Phase.HOLD  # where the drain stands, moved only through PHASE_MOVES

    @property
    def plan(self) -> DrainPlan:
        return self._plan

    def tighten(self, plan: DrainPlan) -> None:
        """A stricter plan for the same drain, given relative to now (:meth:`DrainPlan.sooner`)."""
        self._plan = self._plan.sooner(plan.after(-self._elapsed()))

    def _elapsed(self) -> float:
        return self._clock() - self._start

    def phase(self) -> Phase:
        elapsed = self._elapsed()
        if elapsed >= self._plan.budget_s:
            now = Phase.CUT_OFF
        elif elapsed >= self._plan.hold_s:
            now = Phase.CLOSING
        else:
            now = Phase.HOLD
        if now is not self._phase:
            if now not in PHASE_MOVES[self._phase]:
                raise InvalidPhaseMove(f"drain: {self._phase.value} -> {now.value}")
            self._phase = now
        return now

    def allowed(self) -> float:
        """How many sockets may have closed by now (``math.inf`` at the cut-off)."""
        phase = self.phase()
        if phase is Phase.HOLD:
            return 0
        if phase is Phase.CUT_OFF:
            return math.inf
        batches = 1 + math.floor((self._elapsed() - self._plan.hold_s) / self._plan.batch_interval_s)
        return batches * self._plan.batch_size

    def take(self, waiting: int) -> int:
        """How many of ``waiting`` sockets (ready to close, oldest first) close now."""
        n = int(min(waiting, max(0.0, self.allowed() - self.closed)))
        self.closed += n
        return n

    def elapsed(self) -> float:
        """Seconds since the drain began."""
        return self._elapsed()

    def remaining_s(self) -> float:
        """Seconds until the cut-off (0 once there)."""
        return max(0.0, self._plan.budget_s - self._elapsed())

    def next_change_s(self) -> float:
        """Seconds until :meth:`allowed` next grows (the hold's end, the next batch, or the
        cut-off); 0 at the cut-off."""
        elapsed = self._elapsed()
        plan = self._plan
        if elapsed >= plan.budget_s:
            return 0.0
        if elapsed < plan.hold_s:
            return plan.hold_s - elapsed
        into = (elapsed - plan.hold_s) % plan.batch_interval_s
        return min(plan.batch_interval_s - into, plan.budget_s - elapsed)
