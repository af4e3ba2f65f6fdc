"""Ray metrics of a gateway replica: its open WebSockets, the upgrades it refused, failed
handoffs, its session-host pool, its store writer's failures (docs/operations.md, Metrics;
configs/grafana-dashboard.json charts them).

The gateway calls :meth:`GatewayMetrics.refused` and :meth:`~GatewayMetrics.handoff_failed`
where those happen, and :meth:`~GatewayMetrics.sample` once a second with its open sockets
and pool: gauges are set, the pool's cumulative counters become counter increments.
"""

from __future__ import annotations

from typing import Any

from ray.util import metrics

from actors.host.host_metrics import StoreReplicationMetrics, refusals, store_write_failures


class GatewayMetrics:
    """``writer``: the name of the gateway's store writer (its degraded-shards gauge's label)."""

    def __init__(self, writer: str) -> None:
        self._open = metrics.Gauge(
            "responses_ws_open_sockets",
            description="WebSockets open on a gateway replica (handed to session hosts)",
        )
        self._refusals = refusals()
        self._handoff_failures = metrics.Counter(
            "responses_ws_handoff_failures", description="Sockets that could not be handed to a session host"
        )
        self._hosts = metrics.Gauge(
            "responses_ws_pool_hosts", description="Live session hosts of a gateway replica"
        )
        self._http_hosts = metrics.Gauge(
            "responses_ws_pool_http_hosts",
            description="Live session hosts of HTTP mode alone (session.http_actors)",
        )
        self._starting = metrics.Gauge("responses_ws_pool_starting", description="Session hosts starting")
        self._free = metrics.Gauge(
            "responses_ws_pool_free_slots",
            description="Free connection slots on live hosts (below the soft target)",
        )
        self._starts = metrics.Counter(
            "responses_ws_pool_host_starts",
            description="Session host starts, by outcome (started, failed)",
            tag_keys=("outcome",),
        )
        self._stops = metrics.Counter(
            "responses_ws_pool_host_stops", description="Idle session hosts stopped"
        )
        self._store_failures = store_write_failures()
        self.store_replication = StoreReplicationMetrics(writer)
        self._seen = {"started": 0, "failed": 0, "stopped": 0}

    def refused(self, status: int) -> None:
        self._refusals.inc(tags={"status": str(status)})

    def handoff_failed(self) -> None:
        self._handoff_failures.inc()

    def store_write_failed(self) -> None:
        self._store_failures.inc()

    def sample(self, open_sockets: int, pool: Any) -> None:
        """Gauges from the gateway's state now, the store's replication as last seen;
        counters from the pool's (``ActorPool``)."""
        self._open.set(open_sockets)
        self.store_replication.refresh()
        stats = pool.stats()
        self._hosts.set(stats["actors"])
        self._http_hosts.set(stats["http_actors"])
        self._starting.set(stats["starting"])
        self._free.set(stats["free_slots"])
        counters = pool.counters
        now = {"started": counters.started, "failed": counters.start_failures, "stopped": counters.stopped}
        for key, value in now.items():
            delta = value - self._seen[key]
            if delta > 0:
                if key == "stopped":
                    self._stops.inc(delta)
                else:
                    self._starts.inc(delta, tags={"outcome": key})
        self._seen = now
