"""What the shared parts of a running harness carry, sampled once a second in a thread: the
head's Redis (``INFO all``: commands by name, bytes in and out, its own CPU), the GCS's RPCs
by method (the ``ray_grpc_server_req_finished_total`` counters of the head's metrics export
port, Ray's public Prometheus endpoint) and the CPU of every process of the harness by
label (``<node>/<title>``: ``head/gcs_server``, ``head/ray::ServeController``,
``session1/raylet``…), and of each thread of the head's GCS, raylet and Serve controller
(one thread of each is their ceiling).  :func:`window` turns two samples into rates per second."""

from __future__ import annotations

import http.client
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .. import processes
from . import network
from .harness import GCS_PORT, REDIS_PORT, Harness

INFO_REQUEST_BYTES = len(b"*2\r\n$4\r\nINFO\r\n$3\r\nall\r\n")  # the sampler's own command, subtracted
_GCS_RPC = re.compile(r"^ray_grpc_server_req_finished_total\{([^}]*)\}\s+([0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_LISTEN_PORT = re.compile(r"\S+:(\d+)\s+\S+:\*")  # ``ss -ltnH``'s local address column


def labelled_processes(h: Harness) -> dict[int, str]:
    """Every process of the harness's nodes, pid → ``<node>/<title>`` (Ray's process titles:
    ``gcs_server``, ``raylet``, ``ray::ServeController``, ``ray::SessionHost``…)."""
    out: dict[int, str] = {}
    for node in h.topology.nodes:
        pids = network.namespace_pids(node.namespace)
        titles = processes.titles(dict.fromkeys(pids, ""))
        out.update({pid: f"{node.name}/{titles.get(pid, '?')}" for pid in pids})
    return out


def metrics_export_port(h: Harness) -> int | None:
    """The head's metrics export port (Ray's Prometheus endpoint, which Ray picks when started
    without one): of the ports the head's processes listen on, the one whose ``/metrics``
    answers with the GCS's RPC counters."""
    listing = subprocess.run(
        network.in_namespace(h.topology.head.namespace, "ss", "-ltnH"),
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout
    ports = sorted({int(m.group(1)) for m in _LISTEN_PORT.finditer(listing)})
    for port in ports:
        if port in (REDIS_PORT, GCS_PORT, h.balancer_settings.port):
            continue
        try:
            url = f"http://{h.topology.head.address}:{port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                if b"ray_grpc_server_req_finished" in r.read():  # the GCS's own counters, not an agent's
                    return port
        except (OSError, ValueError, http.client.HTTPException):  # a gRPC port answers in HTTP/2
            continue
    return None


def gcs_rpcs(text: str, component: str = "gcs_server") -> dict[str, float]:
    """RPCs finished so far by method, of ``component``, from Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _GCS_RPC.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        if labels.get("Component") != component:
            continue
        method = labels.get("Method", "?").replace(".grpc_server.", ".")
        out[method] = out.get(method, 0.0) + float(match.group(2))
    return out


def redis_counters(info: dict[str, Any]) -> dict[str, float]:
    """The counters of one ``INFO all`` answer (redis-py's parsed dict), flattened."""
    out = {
        "redis/commands": float(info.get("total_commands_processed", 0)),
        "redis/net_input_bytes": float(info.get("total_net_input_bytes", 0)),
        "redis/net_output_bytes": float(info.get("total_net_output_bytes", 0)),
        "redis/cpu_s": float(info.get("used_cpu_user", 0.0)) + float(info.get("used_cpu_sys", 0.0)),
        "redis/used_memory_bytes": float(info.get("used_memory", 0)),
    }
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, dict):
            out[f"redis/cmd/{key.removeprefix('cmdstat_')}"] = float(value.get("calls", 0))
    return out


def own_share_removed(delta: dict[str, float]) -> dict[str, float]:
    """A window's Redis deltas less the sampler's own ``INFO`` commands."""
    out = dict(delta)
    infos = out.pop("redis/cmd/info", 0.0)
    if "redis/commands" in out:
        out["redis/commands"] -= infos
    if "redis/net_input_bytes" in out:
        out["redis/net_input_bytes"] -= infos * INFO_REQUEST_BYTES
    return out


Sample = tuple[float, dict[str, float]]
THREADED = ("head/gcs_server", "head/raylet", "head/ray::ServeController")  # whose busiest thread counts


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far of each live thread of ``pid`` (``/proc/<pid>/task/*/schedstat``)."""
    out = {}
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            out[int(path.parent.name)] = int(path.read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def busiest_thread(rates: dict[str, float], label: str) -> float:
    """The CPU (ms per second) of ``label``'s busiest thread in a window's rates."""
    prefix = f"thread/{label}/"
    return max((v for k, v in rates.items() if k.startswith(prefix)), default=0.0)


@dataclass
class SharedSampler:
    """Once a second: Redis's counters, the GCS's RPCs, every labelled process's CPU."""

    h: Harness
    procs: Callable[[], dict[int, str]]
    samples: list[Sample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._redis = redis.Redis(host=self.h.topology.head.address, port=REDIS_PORT, socket_timeout=5)
        port = metrics_export_port(self.h)
        self.metrics_url = None if port is None else f"http://{self.h.topology.head.address}:{port}/metrics"
        self._thread = threading.Thread(target=self._run, daemon=True, name="shared-sampler")

    def sample(self) -> Sample:
        values: dict[str, float] = {}
        try:
            values.update(redis_counters(self._redis.info("all")))
        except redis.RedisError as exc:
            self._error(f"redis: {exc}")
        if self.metrics_url is None and len(self.samples) % 5 == 0:  # Ray may not listen yet
            port = metrics_export_port(self.h)
            self.metrics_url = (
                None if port is None else f"http://{self.h.topology.head.address}:{port}/metrics"
            )
        if self.metrics_url:
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                    text = r.read().decode(errors="replace")
                values.update({f"gcs_rpc/{k}": v for k, v in gcs_rpcs(text).items()})
            except OSError as exc:
                self._error(f"metrics: {exc}")
        procs = self.procs()
        values.update({f"cpu/{k}": v for k, v in processes.cpu_by_role(procs).items() if "/" in k})
        for pid, label in procs.items():
            if label in THREADED:
                values.update({f"thread/{label}/{tid}": v for tid, v in thread_cpu_s(pid).items()})
        return time.time(), values

    def _error(self, message: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(message[:200])

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.sample())
            self.stop.wait(1.0)

    def start(self) -> SharedSampler:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        self._redis.close()


def window(samples: list[Sample], t0: float, t1: float) -> tuple[dict[str, float], float]:
    """Per second between the first sample at or after ``t0`` and the last at or before
    ``t1``: each counter's rate (CPU in ms per second), and the span in seconds (0: fewer
    than two samples inside).  A counter missing from the first sample counts from 0."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return {}, 0.0
    (a, first), (b, last) = inside[0], inside[-1]
    span = b - a
    delta = own_share_removed(
        {k: v - first.get(k, 0.0) for k, v in last.items() if k != "redis/used_memory_bytes"}
    )
    rates = {k: (v * 1000 if k.startswith(("cpu/", "thread/")) else v) / span for k, v in delta.items()}
    return rates, span
