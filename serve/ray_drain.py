"""Ray's unstable drain interfaces, pinned to the Ray they were
written for (:data:`RAY_SERIES`).

Ray marks a node *draining* before it goes away: ``ray drain-node`` (a hidden command that
calls the GCS autoscaler service's ``DrainNode``), the autoscaler's idle termination and
preemption, and — since Ray 2.60 — a SIGTERM to the node's ``ray start`` process (it drains
its own node for ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``, 30 s by default, before it stops
its processes).  None of this has a public API in Ray 2.60:

- :func:`drain_node` calls ``ray._raylet.GcsClient.drain_node``, as ``ray drain-node`` does;
- :func:`draining_nodes` reads ``ray._private.state.state.get_draining_nodes()`` (the GCS's
  map of draining node ids to deadlines; one cheap GCS read, ~0.2 ms on this machine);
- :func:`serve_replica_stopping` reads the Serve replica's own ``_shutting_down`` flag,
  which Serve sets when it starts to stop the replica — 30 s before it calls the
  deployment's destructor under direct ingress, unless
  ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` says otherwise.

A Ray of another
series fails :func:`check_ray_version` with a message saying what to re-check.  The test is
tests/cluster/test_ray_drain.py (a head and a worker node, a real drain)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import ray

log = logging.getLogger(__name__)

RAY_SERIES = "2.60."  # the Ray whose internals this module was written against and tested on

DrainReason = Literal["preemption", "idle_termination"]
_REASONS = {
    "preemption": "DRAIN_NODE_REASON_PREEMPTION",
    "idle_termination": "DRAIN_NODE_REASON_IDLE_TERMINATION",
}


class UnsupportedRay(RuntimeError):
    """The installed Ray is not the series this module was written for."""


class DrainRejected(RuntimeError):
    """Ray refused to drain the node (e.g. an idle-termination drain of a busy node)."""


def check_ray_version(version: str | None = None) -> None:
    """Raise :class:`UnsupportedRay` unless Ray is of :data:`RAY_SERIES`."""
    version = ray.__version__ if version is None else version
    if not version.startswith(RAY_SERIES):
        raise UnsupportedRay(
            f"serve/ray_drain.py was written for Ray {RAY_SERIES}x and Ray {version} is installed: "
            "its drain calls use Ray internals (GcsClient.drain_node, "
            "GlobalState.get_draining_nodes, the Serve replica's _shutting_down flag); re-check them "
            "against the new Ray's source, run tests/cluster/test_ray_drain.py, then update RAY_SERIES"
        )


@dataclass(frozen=True, slots=True)
class NodeDrain:
    """A node Ray marked draining: its hex id, and the wall-clock time (Unix seconds) by
    which it will be killed, if Ray was given one."""

    node_id: str
    deadline: float | None

    def remaining_s(self, now: float) -> float | None:
        """Seconds left before the deadline at wall-clock time ``now`` (``None``: none)."""
        return None if self.deadline is None else self.deadline - now


def draining_nodes() -> dict[str, NodeDrain]:
    """Every node Ray marks draining now, by hex node id.  Needs a connected Ray (a driver,
    an actor, a Serve replica).  A blocking GCS read: call it off the event loop."""
    check_ray_version()
    from ray._private import state  # unstable: the GCS's global state accessor

    out = {}
    for node_id, deadline_ms in state.state.get_draining_nodes().items():
        # 0: drained without a deadline (ray drain-node without --deadline-remaining-seconds)
        out[node_id] = NodeDrain(node_id, deadline_ms / 1000.0 if deadline_ms else None)
    return out


def node_drain(node_id: str) -> NodeDrain | None:
    """The drain of ``node_id`` if Ray marks it draining, else ``None``."""
    return draining_nodes().get(node_id)


def current_node_id() -> str:
    """This process's node (hex id)."""
    return ray.get_runtime_context().get_node_id()


def drain_node(
    node_id: str,
    *,
    deadline_s: float | None,
    reason: DrainReason = "preemption",
    message: str = "",
    gcs_address: str | None = None,
) -> None:
    """Ask Ray to drain ``node_id`` with a deadline ``deadline_s`` seconds from now
    (``None``: no deadline), as ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
    --deadline-remaining-seconds N`` does.  Ray does not kill the node at the deadline: the
    caller (a cloud's preemption, a test harness) does.  ``gcs_address``: the cluster's
    (``host:port``); by default the connected Ray's.  :class:`DrainRejected` if Ray says no.

    An idle node (nothing running on it) is drained at once: Ray stops it right away."""
    check_ray_version()
    from ray.core.generated import autoscaler_pb2  # unstable: the autoscaler service's protos

    if gcs_address is None:
        gcs_address = ray.get_runtime_context().gcs_address
    deadline_ms = 0 if deadline_s is None else int(time.time() * 1000 + deadline_s * 1000)
    # Unstable: Ray's internal GCS client (a compiled module; no stubs) and the protos' enum.
    gcs = ray._raylet.GcsClient(address=gcs_address)  # type: ignore[attr-defined]
    code = autoscaler_pb2.DrainNodeReason.Value(_REASONS[reason])  # type: ignore[attr-defined]
    accepted, why = gcs.drain_node(node_id, code, message, deadline_ms)
    if not accepted:
        raise DrainRejected(f"Ray did not drain node {node_id}: {why}")


_warned_no_replica = False


def serve_replica_stopping() -> bool:
    """Whether Serve has begun to stop the replica this code runs in (a redeploy, a delete,
    a scale-down, a migration off a draining node): Serve sets its replica's
    ``_shutting_down`` as its graceful stop starts, which under direct ingress is up to
    ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` (30 s) before it calls the
    deployment's destructor.  ``False`` outside a Serve replica, or if Ray's layout
    changed (logged once)."""
    check_ray_version()
    global _warned_no_replica
    try:
        from ray._private.worker import global_worker  # unstable: the worker's actor instances

        actor = global_worker.actors.get(global_worker.actor_id)
        if actor is None:  # not an actor
            return False
        return bool(actor._replica_impl._shutting_down)  # ray/serve/_private/replica.py
    except Exception:  # a changed internal is reported, not fatal
        if not _warned_no_replica:
            _warned_no_replica = True
            log.warning("cannot read Serve's stopping flag of this replica", exc_info=True)
        return False
