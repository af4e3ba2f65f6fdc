"""routing: session keys pinned to live replicas (sticky), stateless requests routed by
their prefix with a per-minute spill (pure decisions, a fake clock)."""

from __future__ import annotations

from collections import Counter

from inference.routing import (
    PrefixRouting,
    Routes,
    SessionAffinity,
    prefix_key,
    ranked,
    rendezvous,
    routes_of,
    spill,
)
from inference.types import InferenceRequest


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


def test_choose_pins_a_new_key_to_the_callers_choice_and_asks_only_once():
    aff = SessionAffinity()
    asked = []
    assert aff.choose("k", ["a", "b"], first=lambda: asked.append(1) or "b") == "b"
    assert aff.choose("k", ["a", "b"], first=lambda: asked.append(1) or "a") == "b"  # pinned: not asked
    assert asked == [1]
    assert aff.pinned("k", ["a"]) is None  # its replica is gone


# --- stateless requests: the prefix route ------------------------------------------------

PROMPT = list(range(1000, 1600))


def test_ranked_orders_every_replica_and_starts_with_rendezvous():
    for i in range(50):
        order = ranked(f"k{i}", ["a", "b", "c", "d"])
        assert sorted(order) == ["a", "b", "c", "d"]
        assert order[0] == rendezvous(f"k{i}", ["d", "c", "b", "a"])
        assert order == ranked(f"k{i}", ["c", "a", "d", "b"])


def test_the_prefix_key_hashes_scope_prompt_cache_key_and_the_first_tokens_only():
    base = prefix_key(PROMPT, "key:a", None)
    assert prefix_key(PROMPT[:256] + [7] * 50, "key:a", None) == base  # only the first 256 count
    assert prefix_key(PROMPT[:255] + [7], "key:a", None) != base
    assert prefix_key(PROMPT, "key:b", None) != base  # another API key
    assert prefix_key(PROMPT, "key:a", "conv-1") != base  # a prompt_cache_key
    assert prefix_key(PROMPT, "key:a", "") != base  # "" is a key, unlike None
    assert prefix_key(PROMPT, "key:a", "conv-1") != prefix_key(PROMPT, "key:a", "conv-2")
    assert prefix_key(PROMPT, "key:a", None, prefix_tokens=8) == prefix_key(PROMPT[:8], "key:a", None)
    int(base, 16)


def test_spill_takes_the_first_replica_under_the_limit_else_the_least_used():
    order = ["b", "a", "c"]
    assert spill(order, {}, 15) == "b"
    assert spill(order, {"b": 14}, 15) == "b"
    assert spill(order, {"b": 15}, 15) == "a"
    assert spill(order, {"b": 15, "a": 15, "c": 3}, 15) == "c"
    assert spill(order, {"b": 20, "a": 16, "c": 16}, 15) == "a"  # all full: fewest, rank breaks ties


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_prefix_stays_home_up_to_the_rate_then_overflows_and_comes_back():
    clock = Clock()
    routing = PrefixRouting(15, clock)
    replicas = ["a", "b", "c"]
    home, second, third = ranked("p", replicas)
    chosen = []
    for _ in range(40):
        chosen.append(routing.choose("p", replicas)[0])
        clock.t += 1.0  # 40 requests in 40 s: one window
    assert chosen == [home] * 15 + [second] * 15 + [third] * 10
    assert routing.recent("p") == {home: 15, second: 15, third: 10}
    clock.t += 60.0  # the window has passed
    assert routing.choose("p", replicas)[0] == home


def test_the_preference_order_puts_the_choice_first_then_the_rest_by_rank():
    routing = PrefixRouting(1, Clock())
    order = ranked("p", ["a", "b", "c"])
    assert routing.choose("p", ["a", "b", "c"]) == order
    assert routing.choose("p", ["a", "b", "c"]) == [order[1], order[0], order[2]]


def test_a_steady_overload_is_shared_at_the_rate_per_replica():
    clock = Clock()
    routing = PrefixRouting(15, clock)
    seen = []
    for _ in range(300):  # 30 requests per minute for 10 minutes, over two replicas
        seen.append(routing.choose("p", ["a", "b"])[0])
        clock.t += 2.0
    last_minute = Counter(seen[-30:])
    assert last_minute == Counter({"a": 15, "b": 15})


def test_prefixes_are_counted_apart_and_the_table_is_bounded():
    clock = Clock()
    routing = PrefixRouting(2, clock, capacity=3)
    for _ in range(2):
        routing.choose("p", ["a", "b"])
    assert routing.choose("q", ["a", "b"])[0] == rendezvous("q", ["a", "b"])  # q has its own count
    for key in ("r", "s", "t"):
        routing.choose(key, ["a", "b"])
    assert len(routing) == 3 and routing.recent("p") == {}  # p fell out (LRU)


def test_different_prefixes_spread_over_the_replicas():
    routing = PrefixRouting(15, Clock())
    homes = Counter(routing.choose(prefix_key([i] * 300, "key:a", None), ["a", "b"])[0] for i in range(400))
    assert min(homes.values()) > 150


def _call(rid: str, key: str | None, hint: str | None = None) -> InferenceRequest:
    return InferenceRequest(
        rid, "emu-fast", list(range(300)), session_key=key, cache_scope="key:a", replica_hint=hint
    )


def test_a_first_call_is_decided_as_the_router_decides_it_and_pins_its_key() -> None:
    """``Routes.first_call`` (a session host's pick) pins a new key where the prefix route
    goes, counting it; the router's own decision for the key's later calls is that pin."""
    routes = Routes(requests_per_min=1)
    assert routes.first_call(_call("a", "c1")) is None  # no replica heard of yet
    routes.update(["y", "x", "z"])
    assert routes.live == ("x", "y", "z")
    assert routes.first_call(_call("s", None)) is None  # a stateless call: the router's
    order = ranked(prefix_key(list(range(300)), "key:a", None), ["x", "y", "z"])
    assert routes.first_call(_call("a", "c1")) == order[0]
    assert routes.first_call(_call("b", "c2")) == order[1]  # one a minute: the 2nd spills
    assert routes.session("c1", _call("c", "c1"), ["x", "y", "z"]) == order[0]  # pinned
    assert routes.first_call(_call("d", "c3", hint=order[2])) == order[2]  # its conversation's


def test_a_process_publishes_one_routes_a_deployment() -> None:
    made = routes_of("test-app/one-state", lambda: Routes())
    assert made is not None
    assert routes_of("test-app/one-state", lambda: Routes()) is made
    assert routes_of("test-app/one-state") is made and routes_of("test-app/none") is None


def test_a_routes_counts_follow_its_window_request_by_request() -> None:
    """The per-replica counts are kept as requests come and go (a storm of one route is
    counted without recounting its window each request)."""
    now = [0.0]
    routing = PrefixRouting(requests_per_min=10, clock=lambda: now[0], window_s=60.0)
    for i in range(100):
        now[0] = i * 0.5  # 100 requests over 50 s: all in the window
        routing.choose("k", ["a", "b", "c"])
    counts = routing.recent("k")
    assert sum(counts.values()) == 100 and set(counts) == {"a", "b", "c"}
    now[0] = 79.5  # the window starts after 19.5 s: the first 40 requests are out of it
    assert sum(routing.recent("k").values()) == 60
    now[0] = 200.0
    assert routing.recent("k") == {}
