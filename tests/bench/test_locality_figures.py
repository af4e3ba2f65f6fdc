from bench.multinode.locality_figures import Turn, check_cached, imbalance, moves, pins_per_replica


def test_pins_per_replica_counts_every_live_replica_and_imbalance_is_the_fullest_over_the_mean():
    counts = pins_per_replica({"a": "r1", "b": "r1", "c": "r2"}, ["r1", "r2", "r3"])
    assert counts == {"r1": 2, "r2": 1, "r3": 0}
    assert imbalance(counts) == 2.0
    assert imbalance({"r1": 2, "r2": 2}) == 1.0
    assert imbalance({}) == 0.0


def test_a_scale_down_forces_the_removed_replicas_sessions_and_counts_any_other_move():
    before = {"a": "r1", "b": "r2", "c": "r3", "d": "r4"}
    after = {"a": ["r1", "r1"], "b": ["r2", "r1"], "c": ["r2"], "d": ["r4"]}
    m = moves(before, after, ["r1", "r2", "r3", "r4"], ["r1", "r2", "r4"])
    assert m.forced == {"c"} and m.moved == {"b", "c"} and m.unforced == {"b"}
    assert (m.moved_share, m.forced_share, m.minimum) == (0.5, 0.25, 0.25)


def test_a_scale_up_forces_nothing_and_its_minimum_is_zero():
    before = {"a": "r1", "b": "r2"}
    m = moves(before, {"a": ["r1"], "b": ["r3"]}, ["r1", "r2"], ["r1", "r2", "r3"])
    assert m.forced == set() and m.moved == {"b"} and m.minimum == 0.0


def test_cached_tokens_are_checked_against_the_replica_each_turn_ran_on():
    turns = [
        Turn("r1", 1300, 0),
        Turn("r1", 1340, 1280),  # kept: at least the previous prompt's 1280 (128-token steps)
        Turn("r2", 1380, 0),  # moved to a replica that never served it: 0
        Turn("r2", 1420, 1280),  # kept, but under the previous prompt's 1280? no: 1380 → 1280
        Turn("r1", 1460, 1280),  # returned: at most the prompt
    ]
    kinds = [(c.kind, c.ok) for c in check_cached(turns)]
    assert kinds == [("first", True), ("kept", True), ("moved", True), ("kept", True), ("returned", True)]
    assert check_cached(turns)[1].share == 1.0


def test_an_over_report_or_a_lost_prefix_fails_the_check():
    moved_but_cached = [Turn("r1", 1300, 0), Turn("r2", 1340, 1280)]
    assert [c.ok for c in check_cached(moved_but_cached)] == [True, False]
    kept_but_missed = [Turn("r1", 1300, 0), Turn("r1", 1340, 0)]
    check = check_cached(kept_but_missed)[1]
    assert (check.kind, check.ok, check.share) == ("kept", False, 0.0)
    past_the_prompt = [Turn("r1", 1300, 0), Turn("r1", 1340, 1408)]
    assert not check_cached(past_the_prompt)[1].ok


def test_the_clients_cached_tokens_rule_is_the_servers():
    from bench.multinode.locality_figures import reported_cached_tokens as clients
    from inference.emulator.prefix_cache import reported_cached_tokens as servers

    assert [clients(n) for n in range(0, 5000, 7)] == [servers(n) for n in range(0, 5000, 7)]
