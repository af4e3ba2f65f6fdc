"""The pool's policy (serve.pool_policy), pure: no event loop, no clock but the one given."""

from __future__ import annotations

from serve.pool_policy import (
    Host,
    PoolPolicy,
    admission_target,
    free_slots,
    idle_to_stop,
    next_startup_s,
    retry_after_s,
    shared_http_host,
    starts_wanted,
    wanted_free,
)

POLICY = PoolPolicy(
    soft=4, hard=8, warm=2, max_hosts=5, max_starting=2, idle_timeout_s=10.0, admission_wait_s=1.0
)


def hosts(*connections: int, idle_since: float | None = None) -> list[Host]:
    return [Host(f"h{i}", None, 0.0, connections=c, idle_since=idle_since) for i, c in enumerate(connections)]


def test_a_connection_goes_to_the_fullest_host_below_the_soft_target_else_the_emptiest_below_the_cap():
    a, b, c = hosts(1, 3, 4)
    assert admission_target([a, b, c], POLICY) is b, "packed: the fullest below the soft target"
    d, e = hosts(6, 5)
    assert admission_target([d, e], POLICY) is e, "all at the soft target: the emptiest below the cap"
    assert admission_target(hosts(8, 8), POLICY) is None, "every host at its hard cap"
    x, y = hosts(2, 2)
    assert admission_target([x, y], POLICY) is x, "a tie goes to the oldest"


def test_http_shares_a_host_new_websockets_do_not_go_to_unless_it_is_the_only_one():
    a, b = hosts(1, 3)  # b is the admission target
    assert shared_http_host([a, b], POLICY) is a
    [only] = hosts(3)
    assert shared_http_host([only], POLICY) is only


def test_free_slots_kept_follow_the_arrival_rate_between_warm_and_what_every_host_holds():
    assert wanted_free(POLICY, arrivals_per_s=0.0, startup_s=2.0) == 2, "warm at least"
    assert wanted_free(POLICY, arrivals_per_s=3.0, startup_s=2.0) == 9, "3/s for a 2 s start, x1.5"
    assert wanted_free(POLICY, arrivals_per_s=1000.0, startup_s=2.0) == 20, "5 hosts x 4"
    assert free_slots(hosts(1, 5), starting=1, soft=4) == 3 + 0 + 4


def test_hosts_start_until_the_free_slots_suffice_within_the_start_and_host_limits():
    assert starts_wanted(POLICY, free=3, need=10, live=1, starting=0) == 2, "7 slots short: 2 hosts"
    assert starts_wanted(POLICY, free=3, need=20, live=1, starting=0) == 2, "2 starts at a time"
    assert starts_wanted(POLICY, free=3, need=20, live=1, starting=1) == 1
    assert starts_wanted(POLICY, free=3, need=20, live=4, starting=0) == 1, "5 hosts in all"
    assert starts_wanted(POLICY, free=10, need=10, live=1, starting=0) == 0


def test_idle_hosts_stop_newest_first_while_the_rest_keep_twice_the_wanted_slots_never_the_last():
    idle = hosts(0, 0, 0, 0, idle_since=0.0)
    assert idle_to_stop(idle, POLICY, now=5.0, wanted=2) == [], "not idle long enough"
    assert idle_to_stop(idle, POLICY, now=10.0, wanted=2) == idle[:0:-1], "newest first, never the last"
    assert idle_to_stop(idle, POLICY, now=10.0, wanted=4) == idle[:1:-1], "the rest keep 2 x 4 free slots"
    busy = hosts(1, 0, idle_since=0.0)
    busy[0].idle_since = None
    assert idle_to_stop(busy, POLICY, now=10.0, wanted=0) == [busy[1]]
    assert idle_to_stop(busy[:1], POLICY, now=10.0, wanted=0) == []


def test_the_start_up_time_expected_is_the_first_then_a_moving_average():
    assert next_startup_s(2.0, 5.0, first=True) == 5.0
    assert next_startup_s(5.0, 1.0, first=False) == 0.7 * 5.0 + 0.3 * 1.0
    assert retry_after_s(0.2) == 1 and retry_after_s(2.1) == 3
