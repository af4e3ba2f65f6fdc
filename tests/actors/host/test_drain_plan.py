"""The decisions of a drain (actors/host/drain.py) on a fake clock: the budget taken from
the node's deadline, the hold, the batches, the cut-off."""

from __future__ import annotations

import itertools
import math

import pytest

from actors.host.drain import (
    PHASE_MOVES,
    CloseSchedule,
    DrainPlan,
    DrainSettings,
    InvalidPhaseMove,
    Phase,
    budget_s,
)

SETTINGS = DrainSettings(
    timeout_s=30.0, health_grace_s=6.0, deadline_margin_s=2.0, batch_size=50, batch_interval_s=0.5
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_is_the_drain_timeout_or_the_node_deadline_less_the_margin_whichever_is_sooner():
    assert budget_s(SETTINGS, None) == 30.0  # no deadline (a drain without one, a redeploy)
    assert budget_s(SETTINGS, 120.0) == 30.0  # a far deadline: the configured drain
    assert budget_s(SETTINGS, 20.0) == 18.0  # a spot deadline: 2 s before the kill
    assert budget_s(SETTINGS, 1.5) == 0.0  # too late for anything: cut off now
    assert budget_s(SETTINGS, -4.0) == 0.0  # the deadline passed already


def test_only_a_node_drain_holds_and_the_hold_fits_in_the_budget():
    node = DrainPlan.make(SETTINGS, remaining_s=30.0, hold=True)
    assert (node.hold_s, node.budget_s) == (6.0, 28.0)
    serve_stop = DrainPlan.make(SETTINGS, remaining_s=None, hold=False)
    assert (serve_stop.hold_s, serve_stop.budget_s) == (0.0, 30.0)
    late = DrainPlan.make(SETTINGS, remaining_s=5.0, hold=True)
    assert (late.hold_s, late.budget_s) == (3.0, 3.0)  # the hold ends at the cut-off, not after


def test_hosts_share_the_nodes_batch_rounded_up():
    plan = DrainPlan.make(SETTINGS, remaining_s=None, hold=True)
    assert plan.share(1).batch_size == 50
    assert plan.share(3).batch_size == 17
    assert plan.share(200).batch_size == 1
    assert plan.share(0).batch_size == 50


def test_no_socket_closes_during_the_hold_then_one_batch_per_interval_then_all_at_the_cut_off():
    clock = FakeClock()
    schedule = CloseSchedule(DrainPlan(hold_s=6.0, budget_s=10.0, batch_size=3, batch_interval_s=0.5), clock)
    assert schedule.phase() is Phase.HOLD
    assert schedule.take(100) == 0
    assert schedule.next_change_s() == 6.0
    clock.now += 5.9
    assert schedule.take(100) == 0
    clock.now += 0.1  # the hold is over: the first batch
    assert schedule.phase() is Phase.CLOSING
    assert schedule.take(100) == 3
    assert schedule.take(100) == 0  # the batch is spent
    assert schedule.next_change_s() == 0.5
    clock.now += 0.25
    assert schedule.take(100) == 0
    clock.now += 0.25  # the second batch
    assert schedule.take(2) == 2  # fewer ready than allowed: the rest is not lost...
    assert schedule.take(100) == 1  # ...it is there for the next that becomes ready
    clock.now += 1.0  # two batches later: both are available at once
    assert schedule.take(100) == 6
    clock.now = 1000.0 + 10.0  # the cut-off
    assert schedule.phase() is Phase.CUT_OFF
    assert schedule.allowed() == math.inf
    assert schedule.take(10_000) == 10_000
    assert schedule.next_change_s() == 0.0 and schedule.remaining_s() == 0.0


def test_the_next_change_never_passes_the_cut_off():
    clock = FakeClock()
    schedule = CloseSchedule(DrainPlan(hold_s=0.0, budget_s=1.2, batch_size=1, batch_interval_s=1.0), clock)
    clock.now += 1.0
    assert schedule.take(5) == 2
    assert abs(schedule.next_change_s() - 0.2) < 1e-9  # the cut-off comes before the next batch


def test_a_stricter_plan_learnt_later_tightens_the_running_drain():
    clock = FakeClock()
    schedule = CloseSchedule(DrainPlan.make(SETTINGS, remaining_s=None, hold=False), clock)
    clock.now += 4.0
    # A node deadline learnt 4 s into a redeploy's drain: 10 s from now, less the margin.
    schedule.tighten(DrainPlan.make(SETTINGS, remaining_s=10.0, hold=True))
    assert schedule.plan.budget_s == 4.0 + 8.0
    assert schedule.plan.hold_s == 0.0  # a hold that did not start then does not start now
    assert schedule.phase() is Phase.CLOSING
    clock.now += 8.0
    assert schedule.phase() is Phase.CUT_OFF
    # A laxer plan changes nothing.
    schedule.tighten(DrainPlan.make(SETTINGS, remaining_s=None, hold=True))
    assert schedule.plan.budget_s == 12.0


def _walk(plan: DrainPlan, times: list[float]) -> list[Phase]:
    now = [0.0]
    schedule = CloseSchedule(plan, lambda: now[0])
    seen = []
    for t in times:
        now[0] = t
        phase = schedule.phase()
        if not seen or seen[-1] is not phase:
            seen.append(phase)
    return seen


def test_every_transition_of_the_drain_lifecycle_is_walked_and_only_those_happen():
    """Each move PHASE_MOVES lists, produced by a plan and a clock; every walk of a fine
    time grid, with and without a hold, stays within the table."""
    walks = {
        (Phase.HOLD, Phase.CLOSING): (DrainPlan(2.0, 10.0, 1, 1.0), [0.0, 2.0]),
        (Phase.HOLD, Phase.CUT_OFF): (DrainPlan(5.0, 3.0, 1, 1.0), [0.0, 3.0]),  # the cut-off comes first
        (Phase.CLOSING, Phase.CUT_OFF): (DrainPlan(0.0, 3.0, 1, 1.0), [0.0, 3.0]),
    }
    listed = {(a, b) for a, nxt in PHASE_MOVES.items() for b in nxt}
    assert set(walks) == listed
    for (a, b), (plan, times) in walks.items():
        assert _walk(plan, times) == [a, b]
    for hold in (0.0, 0.5, 2.0, 20.0):
        seen = _walk(DrainPlan(hold, 10.0, 1, 1.0), [i / 4 for i in range(60)])
        assert all((x, y) in listed for x, y in itertools.pairwise(seen))
        assert seen[-1] is Phase.CUT_OFF and not PHASE_MOVES[Phase.CUT_OFF]


def test_a_drain_never_moves_back():
    now = [0.0]
    schedule = CloseSchedule(DrainPlan(0.0, 3.0, 1, 1.0), lambda: now[0])
    now[0] = 4.0
    assert schedule.phase() is Phase.CUT_OFF
    now[0] = 1.0  # a clock that went back
    with pytest.raises(InvalidPhaseMove):
        schedule.phase()
