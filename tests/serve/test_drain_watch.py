"""The gateway's drain watch (serve/replica_drain.py ``watch``): Serve's stop is checked on every
tick, Ray's drain state of the node (a GCS read) only every ``node_interval`` and at once when
Serve's stop is first seen, so that a stop caused by a node drain still gets the node's hold."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve.ray_drain import NodeDrain
from serve.replica_drain import watch


def run_watch(
    ticks: int,
    *,
    stop_at: int | None = None,
    drain_from: int | None = None,
    node_interval: float | None = 2.0,
) -> list[str]:
    """Run the watch for ``ticks`` ticks (interval 0.5 s, node reads every ``node_interval``: 2 s
    unless told, every tick when ``None``); Serve stops the replica from tick ``stop_at``, Ray
    drains the node from tick ``drain_from``.  Returns what happened, in order."""
    events: list[str] = []
    tick = 0

    def read_node_drain(node_id: str) -> NodeDrain | None:
        events.append(f"read {tick}")
        return NodeDrain(node_id, 123.0) if drain_from is not None and tick >= drain_from else None

    def serve_stopping() -> bool:
        return stop_at is not None and tick >= stop_at

    async def node_draining(deadline: float | None) -> None:
        events.append(f"node draining {tick} {deadline}")

    async def replica_stopping() -> None:
        events.append(f"replica stopping {tick}")

    async def sleep(interval: float) -> None:
        nonlocal tick
        assert interval == 0.5
        tick += 1
        if tick == ticks:
            raise asyncio.CancelledError

    async def main() -> None:
        with ThreadPoolExecutor(1) as poller:
            await watch(
                "n1",
                0.5,
                poller,
                node_draining=node_draining,
                replica_stopping=replica_stopping,
                node_interval=node_interval,
                read_node_drain=read_node_drain,
                serve_stopping=serve_stopping,
                sleep=sleep,
            )

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    return events


def test_the_node_is_read_every_node_interval_not_every_tick():
    assert run_watch(9) == ["read 0", "read 4", "read 8"]


def test_a_drain_is_seen_once_on_the_read_after_it_began():
    assert run_watch(10, drain_from=5) == ["read 0", "read 4", "read 8", "node draining 8 123.0"]


def test_serves_stop_reads_the_node_at_once_and_a_node_drain_comes_first():
    events = run_watch(8, stop_at=2, drain_from=1)
    assert events == ["read 0", "read 2", "node draining 2 123.0", "replica stopping 2", "read 4"]


def test_serves_stop_alone_begins_the_replicas_drain_once():
    assert run_watch(8, stop_at=3) == ["read 0", "read 3", "replica stopping 3", "read 4"]


def test_without_a_node_interval_every_tick_reads_the_node():
    assert run_watch(3, node_interval=None) == ["read 0", "read 1", "read 2"]
