"""routing: session keys pinned to live replicas (sticky, rendezvous for new keys)."""

from __future__ import annotations

from collections import Counter

from inference.routing import SessionAffinity, rendezvous


def test_rendezvous_is_stable_and_spreads_keys():
    replicas = ["r1", "r2", "r3"]
    assert rendezvous("conn_a", replicas) == rendezvous("conn_a", list(reversed(replicas)))
    counts = Counter(rendezvous(f"conn_{i}", replicas) for i in range(3000))
    assert set(counts) == set(replicas) and min(counts.values()) > 800


def test_removing_a_replica_moves_only_its_keys():
    before = {f"k{i}": rendezvous(f"k{i}", ["a", "b", "c"]) for i in range(500)}
    after = {k: rendezvous(k, ["a", "b"]) for k in before}
    assert all(after[k] == v for k, v in before.items() if v != "c")


def test_pins_are_sticky_when_replicas_are_added():
    aff = SessionAffinity()
    first = {f"k{i}": aff.choose(f"k{i}", ["a"]) for i in range(100)}
    assert set(first.values()) == {"a"}
    assert all(aff.choose(k, ["a", "b", "c"]) == "a" for k in first)  # upscaling moves nobody


def test_a_key_whose_replica_died_is_repinned():
    aff = SessionAffinity()
    key = next(f"k{i}" for i in range(100) if rendezvous(f"k{i}", ["a", "b"]) == "a")
    assert aff.choose(key, ["a", "b"]) == "a"
    assert aff.choose(key, ["b", "c"]) == rendezvous(key, ["b", "c"])
    assert aff.choose(key, ["a", "b", "c"]) == rendezvous(key, ["b", "c"])  # stays on its new pin


def test_the_pin_table_is_bounded():
    aff = SessionAffinity(capacity=10)
    for i in range(50):
        aff.choose(f"k{i}", ["a", "b"])
    assert len(aff) == 10
