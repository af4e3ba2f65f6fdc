"""Ray metrics recorded by session hosts (and, for the shared ones, by the gateway).

Every name starts with ``responses_ws_``; durations are in seconds.  Ray's metrics export
port serves them in Prometheus format with a ``ray_`` prefix, and counters with a
``_total`` suffix (docs/operations.md, Metrics).  A counter is exported from its first
increment (``Counter.inc`` refuses 0): the dashboard reads one not yet exported as 0.  No
label carries an id, a key or user text (tests/integration/test_isolation.py): a host's
label is its actor name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from ray.util import metrics

from store import ReplicationStatus


def refresh_s(environ: Mapping[str, str] = os.environ) -> float:
    """How often a process sets its held gauges again (:class:`HeldGauge`): twice each
    export interval of Ray's (``RAY_metrics_report_interval_ms``, 10 s by default; Ray never
    exports more often than once a second).  A worker exports a gauge only in an interval it
    was set in, and Ray's metrics agent drops a series not set again within two export
    intervals (Ray 2.60): a gauge set on change alone would vanish while its value holds."""
    interval_ms = max(int(environ.get("RAY_metrics_report_interval_ms", "10000")), 1000)
    return interval_ms / 2000


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class HeldGauge:
    """A gauge series whose value stays exported while it holds: :meth:`set` on change,
    :meth:`refresh`, every :func:`refresh_s`, sets the last value again."""

    def __init__(self, gauge: Gauge, value: float) -> None:
        self._gauge = gauge
        self.value = value
        gauge.set(value)

    def set(self, value: float) -> None:
        self.value = value
        self._gauge.set(value)

    def refresh(self) -> None:
        self._gauge.set(self.value)


def store_write_failures() -> metrics.Counter:
    """Failed writes of stored responses and usage lines (every process with a store writer)."""
    return metrics.Counter(
        "responses_ws_store_write_failures",
        description="Store writes (stored responses, usage lines) that failed",
    )


class StoreReplicationMetrics:
    """The Redis store's replication as this process's writes see it (a
    :class:`store.ReplicationObserver`): its shards with fewer online replicas than
    ``store.wait_replicas`` (a gauge, labelled with the ``process``'s name — a session host's
    actor name, a gateway's writer name — since each reports its own view: take the
    maximum), and its writes taken with fewer (a counter)."""

    def __init__(self, process: str) -> None:
        shards = metrics.Gauge(
            "responses_ws_store_degraded_shards",
            description="Store shards with fewer online replicas than store.wait_replicas",
            tag_keys=("process",),
        )
        shards.set_default_tags({"process": process})
        self._shards = HeldGauge(shards, 0)
        self._writes = metrics.Counter(
            "responses_ws_store_degraded_writes",
            description="Store writes acknowledged by fewer replicas than store.wait_replicas",
        )

    def changed(self, status: ReplicationStatus) -> None:
        self._shards.set(sum(1 for shard in status.shards if shard.degraded))

    def degraded_write(self) -> None:
        self._writes.inc()

    def refresh(self) -> None:
        """Every :func:`refresh_s`: the degraded shards stay exported while none changes."""
        self._shards.refresh()


def refusals() -> metrics.Counter:
    """Refusals by HTTP status: the gateway's (upgrades and first requests) and, for a
    keep-alive connection's later requests from a page not allowed, the hosts' (403)."""
    return metrics.Counter(
        "responses_ws_refusals",
        description="Upgrades and HTTP requests refused before they were served, by HTTP status",
        tag_keys=("status",),
    )


class Observer(Protocol):
    """What :class:`PhaseMetrics` records into (a Ray ``Histogram``)."""

    def observe(self, value: float, tags: dict[str, str]) -> None: ...


ALWAYS_OBSERVED = "api_overhead"  # the server's own time per response: every response's


class PhaseMetrics:
    """Server time per response, by transport and phase (one histogram).

    Ray's metrics agent records again, one call each, every value a histogram was sent over
    an export interval (Ray 2.60, ``record_histogram_aggregated_batch``): its CPU grows with
    the values, in a burst every 10 s that takes a core from the turns (docs/steady-tail.md).
    So ``api_overhead`` is observed for every response and the other phases for one response
    in ``every`` (the first, then every ``every``-th): their distributions are sampled, and
    their ``_count`` and ``_sum`` are that share of the responses'."""

    BOUNDARIES = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5]

    def __init__(self, every: int = 1, histogram: Observer | None = None) -> None:
        self._hist: Observer = histogram or metrics.Histogram(
            "responses_ws_phase_seconds",
            description="Server time per response by phase (seconds)",
            boundaries=self.BOUNDARIES,
            tag_keys=("transport", "phase"),
        )
        self._every = every
        self._responses = 0

    def observe(self, transport: str, report: dict[str, float]) -> None:
        """``report``: milliseconds by phase (actors.core.timings.PhaseTimer)."""
        every_phase = self._responses % self._every == 0
        self._responses += 1
        for phase, ms in report.items():
            if every_phase or phase == ALWAYS_OBSERVED:
                self._hist.observe(ms / 1000.0, tags={"transport": transport, "phase": phase})


class HostMetrics:
    """One session host's: the connections it holds, and its store writer's failures."""

    def __init__(self, host: str) -> None:
        connections = metrics.Gauge(
            "responses_ws_host_connections",
            description="WebSocket connections a session host serves",
            tag_keys=("host",),
        )
        connections.set_default_tags({"host": host})
        self._connections = HeldGauge(connections, 0)
        self.store_write_failures = store_write_failures()
        self.store_replication = StoreReplicationMetrics(host)
        self._refusals = refusals()

    def connections(self, n: int) -> None:
        self._connections.set(n)

    def store_write_failed(self) -> None:
        self.store_write_failures.inc()

    def refresh(self) -> None:
        """Every :func:`refresh_s`: the held gauges set again (:class:`HeldGauge`)."""
        self._connections.refresh()
        self.store_replication.refresh()

    def refused(self, status: int) -> None:
        """A request of a handed-over HTTP connection refused (403: its ``Origin``)."""
        self._refusals.inc(tags={"status": str(status)})
