"""A gateway replica's drain state (serve/replica_drain.py): the first drain sets its times, a
sooner deadline moves only the cut-off, a later one changes nothing."""

from actors.host.drain import DrainPlan
from serve.replica_drain import Begun, ReplicaDrain


def plan(hold_s: float, budget_s: float) -> DrainPlan:
    return DrainPlan(hold_s=hold_s, budget_s=budget_s, batch_size=10, batch_interval_s=0.5)


def test_the_first_drain_sets_reason_hold_and_cut_off():
    drain = ReplicaDrain()
    assert drain.begin("the node is draining", plan(5.0, 30.0), now=100.0) is Begun.BEGAN
    assert (drain.reason, drain.started, drain.hold_until, drain.cut_off) == (
        "the node is draining",
        100.0,
        105.0,
        130.0,
    )


def test_a_sooner_deadline_moves_the_cut_off_and_nothing_else():
    drain = ReplicaDrain()
    drain.begin("Serve is stopping this replica", plan(0.0, 30.0), now=100.0)
    assert drain.begin("the node is draining", plan(5.0, 10.0), now=110.0) is Begun.SOONER
    assert (drain.reason, drain.started, drain.hold_until, drain.cut_off) == (
        "Serve is stopping this replica",
        100.0,
        100.0,
        120.0,
    ), "the hold that had not begun does not begin"


def test_a_later_or_barely_sooner_deadline_changes_nothing():
    drain = ReplicaDrain()
    drain.begin("the node is draining", plan(5.0, 30.0), now=100.0)
    assert drain.begin("again", plan(5.0, 60.0), now=101.0) is Begun.NOTHING
    assert drain.begin("again", plan(5.0, 28.95), now=101.0) is Begun.NOTHING  # within 0.1 s
    assert drain.cut_off == 130.0
