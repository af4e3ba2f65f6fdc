"""The harness's faults take effect and undo: a paused node and a node whose link is down
fail the balancer's health check (no answer: no reset, no refusal) and come back; a
partitioned node cannot reach the head until healed, while the bridge (where the balancer
is) still reaches it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable

from bench.multinode import Harness
from bench.multinode.harness import REDIS_PORT


def wait_state(harness: Harness, name: str, prefix: str, timeout_s: float = 20.0) -> float:
    """Seconds until the balancer's state of ``name`` starts with ``prefix``."""
    t0 = time.monotonic()
    while not harness.server_states()[name].startswith(prefix):
        assert time.monotonic() - t0 < timeout_s, (
            f"{name} not {prefix} after {timeout_s}s: {harness.server_states()}"
        )
        time.sleep(0.1)
    return time.monotonic() - t0


def down_and_back(
    harness: Harness, name: str, fault: Callable[[], object], undo: Callable[[], object]
) -> str:
    fault()
    try:
        down = wait_state(harness, name, "DOWN")
    finally:
        undo()
    up = wait_state(harness, name, "UP")
    harness.wait_ready(name, timeout_s=30)
    return f"DOWN after {down:.1f}s, UP {up:.1f}s after the undo"


def test_pause_and_link_down_fail_the_health_check_until_undone(harness: Harness):
    name = harness.session_nodes[-1].name
    s = harness.balancer_settings
    print(f"\nhealth check every {s.inter_ms} ms, fall {s.fall}, rise {s.rise}")
    print(
        f"{name} paused: "
        + down_and_back(harness, name, lambda: harness.pause(name), lambda: harness.resume(name))
    )
    print(
        f"{name} link down: "
        + down_and_back(harness, name, lambda: harness.link(name, False), lambda: harness.link(name, True))
    )
    assert all(v.startswith("UP") for v in harness.server_states().values())


def reaches(harness: Harness, name: str, address: str, port: int) -> bool:
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=2).close()"
    res = subprocess.run(
        ["ip", "netns", "exec", harness.node(name).namespace, sys.executable, "-c", code],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return res.returncode == 0


def test_a_partitioned_node_reaches_no_other_node_until_healed(harness: Harness):
    name, other = harness.session_nodes[-1].name, harness.session_nodes[0].name
    head = harness.topology.head.address
    assert reaches(harness, name, head, REDIS_PORT) and reaches(harness, other, head, REDIS_PORT)
    harness.partition(name)
    try:
        assert not reaches(harness, name, head, REDIS_PORT)
        assert reaches(harness, other, head, REDIS_PORT)  # the others still reach each other
        socket.create_connection(
            (harness.node(name).address, harness.balancer_settings.port), timeout=5
        ).close()
    finally:
        harness.partition(name, heal=True)
    assert reaches(harness, name, head, REDIS_PORT)
    harness.wait_ready(name, timeout_s=30)
    print(f"\n{name} partitioned from the other nodes, then healed")
