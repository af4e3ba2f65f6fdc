"""The cluster store's commands and bytes, sampled once a second from the driver with
``INFO all`` (the counters bench/multinode/shared_load.py reads), on the Redis server or on
every primary of the Redis Cluster the Serve config in force names (``store.redis_url``,
``store.redis_password_file``).  The sampler's own ``INFO`` commands are taken off."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import redis

from ..multinode.shared_load import own_share_removed, redis_counters
from .window import Sample, inside, span_s

KEYS = ("redis/commands", "redis/net_input_bytes", "redis/cpu_s", "redis/cmd/info")


def password(settings: dict[str, Any]) -> str | None:
    path = settings.get("redis_password_file")
    if not path:
        return None
    return Path(path).expanduser().read_text().strip() or None


def summed(infos: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for info in infos:
        for key, value in redis_counters(info).items():
            if key in KEYS:
                out[key] = out.get(key, 0.0) + value
    return out


class StoreMeter:
    """A thread sampling the store's counters; :meth:`window` gives (commands, bytes in)."""

    def __init__(self, settings: dict[str, Any], period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        url = str(settings["redis_url"])
        pw = password(settings)
        if settings.get("redis_cluster"):
            self._cluster: Any = redis.RedisCluster.from_url(url.split(",")[0], password=pw, socket_timeout=5)
            self._client: Any = None
        else:
            self._cluster = None
            self._client = redis.Redis.from_url(url, password=pw, socket_timeout=5)
        self._thread = threading.Thread(target=self._run, name="store-meter", daemon=True)

    @classmethod
    def for_config(cls, settings: dict[str, Any]) -> StoreMeter | None:
        """A meter for the store of ``settings`` (the config's ``store`` section), or None
        when the store is not Redis."""
        if settings.get("backend") != "redis" or not settings.get("redis_url"):
            return None
        return cls(settings)

    def infos(self) -> list[dict[str, Any]]:
        if self._cluster is not None:
            answer = self._cluster.info("all", target_nodes=redis.RedisCluster.PRIMARIES)
            return (
                list(answer.values())
                if isinstance(answer, dict) and "redis_version" not in answer
                else [answer]
            )
        return [self._client.info("all")]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), summed(self.infos())))
            except (redis.RedisError, OSError) as exc:
                if len(self.errors) < 20:
                    self.errors.append(str(exc)[:200])
            self._stop.wait(self.period_s)

    def start(self) -> StoreMeter:
        self.samples.append((time.time(), summed(self.infos())))  # fails here if the store is unreachable
        self._thread.start()
        return self

    def window(self, t0: float, t1: float) -> tuple[float, float, float] | None:
        """Commands, bytes in and Redis's own CPU seconds over [t0, t1] (scaled to it from
        the samples inside)."""
        ins = inside(self.samples, t0, t1)
        span = span_s(ins)
        if span <= 0:
            return None
        first, last = ins[0][1], ins[-1][1]
        delta = own_share_removed({k: last.get(k, 0.0) - first.get(k, 0.0) for k in last})
        factor = (t1 - t0) / span
        return (
            delta.get("redis/commands", 0.0) * factor,
            delta.get("redis/net_input_bytes", 0.0) * factor,
            delta.get("redis/cpu_s", 0.0) * factor,
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for c in (self._client, self._cluster):
            if c is not None:
                c.close()
