"""The capacity model of docs/scaling.md ("A capacity model to 1000 session nodes"): what a
deployment of N session nodes asks of its shared parts — the GCS, the Serve controller, the
head's raylet, the cluster store — from per-node, per-turn and per-connection figures
measured on the multi-node harness (``responses-ws bench scaling --real-nodes --model``),
against the limits the projects publish.  Pure arithmetic, no I/O.

A shared part's demand at N session nodes is ``base + N × per_node`` (a straight line fitted
to the harness's 1, 2, 3 nodes, :func:`fit_line`).  A part whose work runs on one thread (the
GCS's and the head raylet's main event loops, the Serve controller's, Redis's command
thread: each one core) is full when the
demand (its busiest thread's CPU) reaches ``headroom`` of that core; a count (Ray nodes, Ray actors, Redis Cluster
nodes) when it reaches ``headroom`` of the published figure.  The first of them to fill
bounds one Ray cluster (:func:`session_nodes_per_cluster`); past it the deployment is several
Ray clusters behind one balancer, sharing one Redis Cluster, whose primaries grow with the
store's load (:func:`store_primaries`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .stats import line

CORE_MS_PER_S = 1000.0  # what one core gives a single-threaded process, CPU ms per second
UNBOUNDED = 10**9  # session nodes a part never limits (its demand does not grow with them)


@dataclass(frozen=True, slots=True)
class Line:
    """``base + per_node × n``."""

    base: float
    per_node: float

    def at(self, n: float) -> float:
        return self.base + self.per_node * n


def slope_error(points: Sequence[tuple[float, float]], line: Line) -> float:
    """The standard error of ``line``'s slope fitted to ``points`` (0 with fewer than three
    points or one distinct n): how well 1, 2, 3 nodes pin the growth per node down."""
    if len(points) < 3:
        return 0.0
    xs = [float(x) for x, _ in points]
    mx = sum(xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    residual = sum((float(y) - line.at(float(x))) ** 2 for x, y in points)
    return math.sqrt(residual / (len(points) - 2) / sxx)


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares through ``(n, value)`` points; with one distinct ``n``, the line
    through the origin and their mean."""
    if not points:
        raise ValueError("no points to fit")
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    fitted = line(xs, ys)
    if fitted is None:
        mx, my = xs[0], sum(ys) / len(ys)
        return Line(0.0, my / mx if mx else 0.0)
    slope, intercept = fitted
    return Line(intercept, slope)


@dataclass(frozen=True, slots=True)
class Measured:
    """The model's inputs (the harness's figures, or a deployment's own)."""

    # CPU (ms per second) of the busiest thread of each single-threaded bottleneck, against
    # session nodes: one core is its ceiling however many the head has
    gcs_thread_ms_per_s: Line  # the GCS's
    controller_thread_ms_per_s: Line  # the Serve controller's (a Python actor: its event loop)
    head_raylet_thread_ms_per_s: Line  # the head node's raylet's
    store_cmds_per_turn: float  # Redis commands a turn costs (those its scripts run included)
    store_bytes_per_turn: float  # bytes a turn sends to Redis
    store_cpu_us_per_turn: float  # Redis's own CPU a turn costs (``INFO cpu``, its idle rate taken off)
    store_cmds_per_connection_s: float  # commands an open connection costs per second (heartbeats)
    store_cpu_us_per_connection_s: float  # Redis's CPU an open connection costs per second
    actors_per_session_node: float  # a gateway and its session hosts


@dataclass(frozen=True, slots=True)
class Deployment:
    """What each session node carries (a choice, not a measurement)."""

    turns_per_node_s: float
    connections_per_node: float
    other_nodes: int = 1  # the head; add accelerator nodes
    other_actors: int = 2  # the Serve controller and the inference replicas


@dataclass(frozen=True, slots=True)
class Limits:
    """Published limits (their sources in docs/scaling.md) and the share of each planned for."""

    ray_nodes: int = 3000  # Ray's scalability envelope: nodes in a cluster, trivial tasks
    ray_actors: int = 20000  # the envelope: actors in a cluster
    redis_cluster_nodes: int = 1000  # the Redis Cluster specification's suggested maximum
    redis_replicas_per_primary: int = 1
    headroom: float = 0.5  # plan each part to half of its limit


@dataclass(frozen=True, slots=True)
class Demand:
    """One shared part at one size: what it is asked, and the share of its limit."""

    part: str
    demand: float
    limit: float

    @property
    def share(self) -> float:
        return self.demand / self.limit if self.limit else math.inf


def demands(m: Measured, d: Deployment, lim: Limits, n: int) -> list[Demand]:
    """Each part of one Ray cluster with ``n`` session nodes, against its planned limit."""
    core = CORE_MS_PER_S * lim.headroom
    return [
        Demand("gcs_thread", m.gcs_thread_ms_per_s.at(n), core),
        Demand("serve_controller_thread", m.controller_thread_ms_per_s.at(n), core),
        Demand("head_raylet_thread", m.head_raylet_thread_ms_per_s.at(n), core),
        Demand("ray_nodes", n + d.other_nodes, lim.ray_nodes * lim.headroom),
        Demand("ray_actors", n * m.actors_per_session_node + d.other_actors, lim.ray_actors * lim.headroom),
    ]


def store_cmds_per_s(m: Measured, d: Deployment, n: int) -> float:
    """Redis commands per second from ``n`` session nodes (turns and open connections)."""
    return n * (
        d.turns_per_node_s * m.store_cmds_per_turn + d.connections_per_node * m.store_cmds_per_connection_s
    )


def store_cpu_ms_per_s(m: Measured, d: Deployment, n: int) -> float:
    """Redis's CPU (ms per second, all primaries) for ``n`` session nodes."""
    per_node_us = (
        d.turns_per_node_s * m.store_cpu_us_per_turn
        + d.connections_per_node * m.store_cpu_us_per_connection_s
    )
    return n * per_node_us / 1000.0


def store_primaries(m: Measured, d: Deployment, lim: Limits, n: int) -> int:
    """Redis Cluster primaries for ``n`` session nodes: each one core (Redis runs commands on
    one thread) at ``headroom``."""
    return max(1, math.ceil(store_cpu_ms_per_s(m, d, n) / (CORE_MS_PER_S * lim.headroom)))


def session_nodes_per_cluster(m: Measured, d: Deployment, lim: Limits) -> tuple[int, str]:
    """The most session nodes one Ray cluster takes before a part passes its planned limit,
    and that part (the one that splits the deployment into several Ray clusters)."""
    at0, at1 = demands(m, d, lim, 0), demands(m, d, lim, 1)
    best: tuple[int, str] | None = None
    for zero, one in zip(at0, at1, strict=True):
        per = one.demand - zero.demand
        room = zero.limit - zero.demand
        n = UNBOUNDED if per <= 0 else int(max(0.0, room) / per)
        if best is None or n < best[0]:
            best = (n, zero.part)
    assert best is not None
    return best


@dataclass(frozen=True, slots=True)
class Size:
    """The deployment at one size."""

    session_nodes: int
    ray_clusters: int
    session_nodes_per_cluster: int
    first_bottleneck: str  # the part nearest its planned limit in each Ray cluster
    split_by: str  # the part that bounds a Ray cluster's session nodes
    shares: dict[str, float]  # each part's share of its planned limit, in one of the Ray clusters
    store_cmds_per_s: float
    store_mb_per_s: float
    store_primaries: int
    redis_cluster_nodes: int
    redis_cluster_fits: bool


def size(m: Measured, d: Deployment, lim: Limits, n: int) -> Size:
    """``n`` session nodes: how many Ray clusters, what is nearest its limit in each, and the
    one Redis Cluster they share."""
    cap, split_by = session_nodes_per_cluster(m, d, lim)
    clusters = max(1, math.ceil(n / max(1, cap)))
    per_cluster = math.ceil(n / clusters)
    shares = {p.part: round(p.share, 4) for p in demands(m, d, lim, per_cluster)}
    primaries = store_primaries(m, d, lim, n)
    redis_nodes = primaries * (1 + lim.redis_replicas_per_primary)
    return Size(
        session_nodes=n,
        ray_clusters=clusters,
        session_nodes_per_cluster=per_cluster,
        first_bottleneck=max(shares, key=lambda k: shares[k]),
        split_by=split_by,
        shares=shares,
        store_cmds_per_s=store_cmds_per_s(m, d, n),
        store_mb_per_s=n * d.turns_per_node_s * m.store_bytes_per_turn / 1e6,
        store_primaries=primaries,
        redis_cluster_nodes=redis_nodes,
        redis_cluster_fits=redis_nodes <= lim.redis_cluster_nodes,
    )
