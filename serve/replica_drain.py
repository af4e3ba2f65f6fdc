"""A gateway replica's drain: why and since when it drains, its hold and cut-off, the decision
a new drain or a sooner deadline makes (pure, :meth:`ReplicaDrain.begin`), and the watch
that sees a drain begin — Ray draining the node, Serve stopping the replica
(docs/reliability.md, "Drains").  serve/gateway.py carries it out."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from actors.host.drain import DrainPlan

from .ray_drain import NodeDrain, node_drain, serve_replica_stopping

log = logging.getLogger(__name__)


class Begun(enum.Enum):
    """What a call of :meth:`ReplicaDrain.begin` changed."""

    BEGAN = "began"  # the replica drains from now
    SOONER = "sooner"  # a running drain's cut-off moved sooner: the hosts take it
    NOTHING = "nothing"


@dataclass(slots=True)
class ReplicaDrain:
    """Times are ``time.monotonic()``."""

    reason: str | None = None  # why this replica drains, once it does: /readyz says so
    started: float = 0.0
    hold_until: float = 0.0  # until when the listener stays open (a node drain)
    cut_off: float = 0.0  # by when every socket is closed
    listener_closed: bool = False

    def begin(self, reason: str, plan: DrainPlan, now: float) -> Begun:
        """Begin the drain, or tighten a running one: a deadline learnt later (a node drain
        during a redeploy's) moves the cut-off sooner; a hold that has not begun does not
        begin now."""
        if self.reason is None:
            self.reason = reason
            self.started = now
            self.hold_until = now + plan.hold_s
            self.cut_off = now + plan.budget_s
            return Begun.BEGAN
        if now + plan.budget_s < self.cut_off - 0.1:
            self.cut_off = now + plan.budget_s
            return Begun.SOONER
        return Begun.NOTHING


async def watch(
    node_id: str,
    interval: float,
    poller: Executor,
    *,
    node_draining: Callable[[float | None], Awaitable[None]],
    replica_stopping: Callable[[], Awaitable[None]],
    node_interval: float | None = None,
    read_node_drain: Callable[[str], NodeDrain | None] = node_drain,
    serve_stopping: Callable[[], bool] = serve_replica_stopping,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Check Serve's stop of this replica every ``interval`` seconds (an attribute of this
    process), and read Ray's drain state of this node every ``node_interval`` (a GCS read, off
    the event loop; ``interval`` when ``None``) and whenever Serve's stop is first seen; either
    begins the drain at once, whatever Serve's draining-period settings."""
    loop = asyncio.get_running_loop()
    failing = False
    seen: NodeDrain | None = None
    stopping = False
    every = max(1, round((node_interval or interval) / interval))  # ticks between GCS reads
    tick = 0
    while True:
        try:
            # Serve's controller stops the replicas of a draining node, often before the watch
            # sees the drain: on a stop, read the node's drain state first, so that such a
            # stop gets the node drain's hold (/readyz 503 while the balancer notices).
            stops = not stopping and serve_stopping()
            if stops or tick % every == 0:
                # A blocking GCS read, off the event loop; a slow GCS delays only the watch.
                drain = await asyncio.wait_for(
                    loop.run_in_executor(poller, read_node_drain, node_id), max(5.0, interval)
                )
                if drain is not None and drain != seen:  # a new drain, or a new deadline
                    seen = drain
                    await node_draining(drain.deadline)
            if stops:
                stopping = True
                await replica_stopping()
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception:
            if not failing:  # log when it starts failing, not every poll
                log.warning("cannot read whether this node is draining", exc_info=True)
            failing = True
        tick += 1
        await sleep(interval)
