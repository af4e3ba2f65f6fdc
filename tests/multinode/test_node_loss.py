"""Losing session nodes under load.  SIGKILL of every process of one: only that node's clients
see a close; they reconnect through the balancer and are served by the other node; the other
node's clients never notice.  Then the killed node is started again and Ray drains the other
with a deadline (the kill at the deadline), with Serve's draining settings at Ray's defaults,
under many Codex-like clients: /readyz 503 first, every create answered, every socket closed
1012 after its last terminal event, the clients served on the other node with their prefix
cached.  Kills both session nodes of the tier's harness: the tier's last module, its tests in
this order."""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time

from bench.multinode import Harness
from bench.multinode.load import clients_figures, run_load
from tests.multinode.conftest import INFERENCE_REPLICAS, wait_up
from tests.support.waiting import wait_until

# Sockets in mid-conversation when the drain starts (issue 37 asks for 200).
DRAIN_CLIENTS = int(os.environ.get("RWS_MULTINODE_DRAIN_CLIENTS", "200"))
DRAIN_DEADLINE_S = 25
DRAIN_AT_S = 12.0  # the clients' warm-up: connected, a few turns each


def test_sigkill_of_a_session_node_affects_only_its_clients(harness: Harness):
    victim, survivor = (n.name for n in harness.session_nodes[:2])
    killed: dict[str, float] = {}

    def kill() -> None:
        killed["at"] = time.monotonic()
        killed["processes"] = harness.kill(victim)

    load = run_load(
        harness.ws_url,
        clients=12,
        duration_s=20.0,
        servers=harness.connection_lookup,
        during=kill,
        during_at_s=6.0,
        turns_per_chain=10_000,  # one connection per client until something closes it
    )
    clients = load.clients
    t = killed["at"]
    on = {c.index: c.connection_at(t) for c in clients}
    assert all(conn is not None and conn.server in (victim, survivor) for conn in on.values()), on
    hit = [c for c in clients if on[c.index].server == victim]
    spared = [c for c in clients if on[c.index].server == survivor]
    codes = sorted(on[c.index].close_code or 0 for c in hit)
    in_flight = sum(on[c.index].in_flight for c in hit)
    back = []
    for c in hit:
        after = [conn for conn in c.connections if conn.opened_at >= on[c.index].closed_at and conn.turns]
        assert after, f"client {c.index} was not served again: {c.connections} {c.errors}"
        assert after[0].server == survivor
        back.append(after[0].completions[0] - on[c.index].closed_at)
    closed_after = [on[c.index].closed_at - t for c in hit]
    print(
        f"\nkilled {victim} ({killed['processes']} processes) at t=6.0s under {len(clients)} clients: "
        f"{len(hit)} on {victim}, {len(spared)} on {survivor}\n"
        f"  {victim}'s clients: close codes {codes}, {in_flight} with a turn in flight, closed "
        f"{min(closed_after):.2f}-{max(closed_after):.2f}s after the kill; served again by {survivor} "
        f"p50 {statistics.median(back):.2f}s, max {max(back):.2f}s after their close\n"
        f"  {survivor}'s clients: {sum(len(c.closes) for c in spared)} closes, "
        f"{sum(sum(x > t for x in on[c.index].completions) for c in spared)} turns completed after the kill"
        f"\n  balancer: {harness.server_states()}\n  the load's clients: {clients_figures(load.result)}"
    )
    assert hit and spared
    assert all(code in (1006, 1011, 1012) for code in codes), codes
    for c in spared:
        assert c.closes == [] and len(c.connections) == 1, (c.index, c.connections)
        assert any(x > t + 1.0 for x in on[c.index].completions)
        assert c.errors == []
    assert harness.server_states()[victim].startswith("DOWN")


def test_a_drain_under_load_fails_the_health_check_first_and_loses_nothing(harness: Harness):
    """``ray drain-node`` (preemption) of a session node with a deadline, the node killed at
    the deadline, under Codex-like clients (each resends its whole conversation, with a
    ``prompt_cache_key``, on every turn and after a reconnect).  Judged: the node's
    ``/readyz`` answered 503 before its first socket closed; each of its sockets closed with
    1012 after the terminal event of its last create, before the kill; every create sent got
    ``response.created`` and a terminal event, or ``server_shutting_down``; the clients were
    served again by the other session node, their first turn there with ``cached_tokens > 0``
    (two inference replicas running)."""
    node, other = harness.session_nodes[-1].name, harness.session_nodes[0].name
    if harness.ready(other) != 200:  # killed by the test before
        t0 = time.monotonic()
        harness.restart(other)
        print(f"\nrestarted {other}: ready in {time.monotonic() - t0:.1f}s")
    wait_up(harness)
    inference = {k: v for k, v in harness.driver("replicas").items() if k.endswith("/InferenceDeployment")}
    print(f"\ninference replicas: {inference}")
    assert [v.get("RUNNING", 0) for v in inference.values()] == [INFERENCE_REPLICAS], inference

    drains = []
    probes: list[tuple[float, int | None, str]] = []  # (when, /readyz of the node, balancer's state)
    stop_probing = threading.Event()

    def probe() -> None:  # a sample every 0.1 s (the resolution of "503 before the first close")
        while not stop_probing.is_set():
            probes.append(
                (time.monotonic(), harness.ready(node, timeout_s=1.0), harness.server_states()[node])
            )
            stop_probing.wait(0.1)

    def drain() -> None:
        threading.Thread(target=probe, daemon=True).start()
        wait_until(  # the probes see the node ready before the drain: its 503 is the drain's
            lambda: any(status == 200 and state.startswith("UP") for _, status, state in probes),
            10.0,
            f"a /readyz 200 of {node}, UP in the balancer, before the drain",
        )
        asked.append(time.monotonic())
        drains.append(harness.drain(node, deadline_s=DRAIN_DEADLINE_S, reason_message="multinode tier"))

    asked: list[float] = []  # when ``ray drain-node`` was started
    try:
        load = run_load(
            harness.ws_url,
            clients=DRAIN_CLIENTS,
            duration_s=DRAIN_AT_S + DRAIN_DEADLINE_S + 6.0,
            servers=harness.connection_lookup,
            during=drain,
            during_at_s=DRAIN_AT_S,
            turns_per_chain=10_000,
            think_s=0.5,
            reconnect_s=0.5,
            open_timeout_s=30.0,
            ping_interval_s=None,
            resend_history=True,
        )
        clients = load.clients
    finally:
        stop_probing.set()
    (d,) = drains
    if d.timer is not None:  # the kill at the deadline (``ray drain-node`` may take seconds to return)
        d.timer.join(timeout=DRAIN_DEADLINE_S + 10.0)
    t = asked[0]  # the CLI sets the deadline before it returns (``d.requested_at``)
    on = {c.index: c.connection_at(t) for c in clients}
    hit = [c for c in clients if on[c.index] is not None and on[c.index].server == node]
    spared = [c for c in clients if on[c.index] is not None and on[c.index].server == other]
    conns = [on[c.index] for c in hit]
    closed = [x.closed_at for x in conns if x.closed_at is not None]
    first_close = min(closed) if closed else float("inf")
    first_503 = next((w for w, status, _ in probes if status == 503), None)
    first_down = next((w for w, _, state in probes if state.startswith("DOWN")), None)
    codes = sorted({x.close_code for x in conns}, key=str)
    unanswered = [
        (c.index, x.creates, x.created, x.terminals, x.shutting_down)
        for c in clients
        for x in c.connections
        if x.server == node and (x.creates != x.terminals + x.shutting_down or x.created != x.terminals)
    ]
    cut = [c.index for c in hit if on[c.index].in_flight]
    moved, back, first_cached = [], [], []
    for c in hit:
        x = on[c.index]
        after = [
            y for y in c.connections if x.closed_at is not None and y.opened_at >= x.closed_at and y.turns
        ]
        if after:
            moved.append(after[0].server)
            back.append(after[0].completions[0] - x.closed_at)
            first_cached.append(after[0].cached[0])
    steady = [n for c in clients for x in c.connections for n in x.cached[2:]]
    in_flight_at_drain = sum(
        1 for x in conns for w in x.completions if w > t and w - t < 1.0
    )  # rough: turns ending within 1 s of the request were in flight at it
    rel = lambda w: f"{w - t:.2f}s" if w is not None and w != float("inf") else "never"  # noqa: E731
    print(
        f"\ndrained {node} (deadline {DRAIN_DEADLINE_S}s; times from the start of `ray drain-node`, which "
        f"returned at {rel(d.requested_at)}; killed at {rel(d.killed_at)}) "
        f"under {len(clients)} clients: {len(hit)} on {node}, {len(spared)} on {other}, "
        f"{sum(on[c.index] is None for c in clients)} between connections, "
        f"{sum(on[c.index] is not None and on[c.index].server is None for c in clients)} not located; "
        f"turns in all: {sum(x.turns for c in clients for x in c.connections if x.server == node)} turns "
        f"on {node}, {sum(x.turns for c in clients for x in c.connections if x.server == other)} on {other}, "
        f"{load.failed_connects} failed connects, connections by node "
        f"{collections.Counter(x.server for c in clients for x in c.connections)}\n"
        f"  /readyz 503 first at {rel(first_503)}, balancer DOWN at {rel(first_down)}; "
        f"{node}'s sockets closed {rel(first_close)}-{rel(max(closed, default=None))}, codes {codes}\n"
        f"  {node}'s connections: {sum(x.creates for x in conns)} creates, {sum(x.created for x in conns)} "
        f"response.created, {sum(x.terminals for x in conns)} terminal events, "
        f"{sum(x.shutting_down for x in conns)} server_shutting_down, ~{in_flight_at_drain} turns ended "
        f"within 1 s of the request; unanswered {unanswered[:10]}; a create in flight at the close: {cut[:10]}\n"
        f"  served again: {len(moved)}/{len(hit)}, by {sorted(set(moved), key=str)}, p50 "
        f"{statistics.median(back) if back else float('nan'):.2f}s, max {max(back, default=float('nan')):.2f}s "
        f"after their close; first turn there cached_tokens > 0 for "
        f"{sum(n > 0 for n in first_cached)}/{len(first_cached)} (median {statistics.median(first_cached) if first_cached else 0}"
        f", steady-state turns' median {statistics.median(steady) if steady else 0})\n"
        f"  {other}'s clients: {sum(len(c.closes) for c in spared)} closes; errors "
        f"{[e for c in clients for e in c.errors][:5]}; balancer: {harness.server_states()}\n"
        f"  the load's clients: {clients_figures(load.result)}"
    )
    assert d.killed_at is not None and d.killed_at >= d.deadline_at
    assert len(hit) >= len(clients) // 4 and spared, (len(hit), len(spared))
    assert first_503 is not None and first_503 < first_close, (rel(first_503), rel(first_close))
    assert codes == [1012], codes
    assert all(w < d.killed_at for w in closed)
    assert unanswered == [] and cut == []
    assert [e for c in clients for e in c.errors if not e.startswith("connect:")] == []
    assert moved == [other] * len(hit)
    assert all(n > 0 for n in first_cached), first_cached
