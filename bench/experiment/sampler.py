"""A sampler on every node of the cluster: a Ray actor pinned to its node (num_cpus=0) that,
once every ``period_s``, reads ``/proc`` for the CPU of each of the node's processes by role
and, on the head, of each thread of the GCS, the head's raylet and the Serve controller
(one thread of each is their ceiling: bench/scale_model.py), and reads the node's Ray
metrics endpoint for the inference replicas' batches and prefix cache.

The node's processes are its raylet and everything below it (workers, actors, Ray's
agents); on the head also the GCS and the other processes that ``ray start`` ran beside the
raylet.  A process's role is what its title names (bench/processes.py: ``gateway``,
``session_host``, ``inference``, else ``ray``).  The samples are cumulative and
timestamped (``time.time()``); :mod:`bench.experiment.window` turns them into a window's
figures."""

from __future__ import annotations

import http.client
import os
import re
import threading
import time
import urllib.request
from typing import Any

import psutil

from .. import processes

THREADED = {"gcs_server": "gcs", "raylet": "head_raylet", "ray::ServeController": "serve_controller"}
_METRIC = re.compile(
    r"^(?:ray_)?responses_ws_inference_(running_seqs|prefix_hit_blocks|prefix_miss_blocks)(?:_total)?"
    r"\{([^}]*)\}\s+([0-9.eE+-]+)$"
)
_SOCKETS = re.compile(r"^(?:ray_)?responses_ws_open_sockets\{[^}]*\}\s+([0-9.eE+-]+)$")
# Responses a node's session hosts answered: one api_overhead observation each (actors/core/timings.py)
_SERVED = re.compile(
    r'^(?:ray_)?responses_ws_phase_seconds_count\{[^}]*phase="api_overhead"[^}]*\}\s+([0-9.eE+-]+)$'
)
_REPLICA = re.compile(r'replica="([^"]*)"')
KEEP_SAMPLES = 3600


def raylet_of(pid: int) -> psutil.Process | None:
    """The raylet ``pid`` runs under (a Ray worker's ancestor)."""
    try:
        for parent in psutil.Process(pid).parents():
            if parent.name() == "raylet":
                return parent
    except psutil.Error:
        pass
    return None


def node_processes(raylet: psutil.Process, head_gcs_port: int | None, exclude: set[int]) -> dict[int, str]:
    """pid → title of the node's processes: the raylet and its descendants, and with
    ``head_gcs_port`` (the head) the GCS and its siblings ``ray start`` ran."""
    procs: dict[int, str] = {}
    try:
        found = [raylet, *raylet.children(recursive=True)]
    except psutil.Error:
        found = []
    if head_gcs_port is not None:
        marks = (f"--gcs_server_port={head_gcs_port}", f":{head_gcs_port}")
        under = {p.pid for p in found}
        for p in psutil.process_iter(["cmdline", "name"]):
            if p.pid in under or p.info["name"] == "raylet":
                continue
            cmd = " ".join(p.info["cmdline"] or ())
            if any(m in cmd for m in marks) and ("gcs" in cmd or p.info["name"] == "gcs_server"):
                found.append(p)
    titles = processes.titles({p.pid: "" for p in found if p.pid not in exclude})
    procs.update(titles)
    return procs


def _name(pid: int) -> str:
    try:
        return str(psutil.Process(pid).name())
    except psutil.Error:
        return ""


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far of each live thread of ``pid``."""
    out = {}
    try:
        for t in psutil.Process(pid).threads():
            out[t.id] = t.user_time + t.system_time
    except psutil.Error:
        pass
    return out


def metrics_values(text: str) -> dict[str, float]:
    """The node's figures in one Prometheus scrape of its Ray metrics: the inference
    replicas' ``running`` (sequences in the batches, all replicas), ``replicas``, ``hit`` and
    ``miss`` (prefix-cache blocks so far), the gateways' open ``sockets`` and the responses
    the session hosts ``served`` so far."""
    running: dict[str, float] = {}
    out = {"hit": 0.0, "miss": 0.0}
    found: dict[str, float] = {}
    seen = False
    for line in text.splitlines():
        for key, pattern in (("sockets", _SOCKETS), ("served", _SERVED)):
            if hit := pattern.match(line):
                found[key] = found.get(key, 0.0) + float(hit.group(1))
        if line.startswith("#") or "responses_ws_inference_" not in line:
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        seen = True
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        tag = _REPLICA.search(labels)
        replica = tag.group(1) if tag else "?"
        if name == "running_seqs":
            running[replica] = running.get(replica, 0.0) + value
        else:
            out["hit" if name == "prefix_hit_blocks" else "miss"] += value
    if not seen:
        return found
    return {**out, **found, "running": sum(running.values()), "replicas": float(len(running))}


class NodeSamplerCore:
    """The sampler's work, outside Ray (the actor below wraps it)."""

    def __init__(
        self,
        head_gcs_port: int | None,
        metrics_url: str | None,
        exclude: tuple[int, ...] = (),
        period_s: float = 1.0,
    ) -> None:
        self.head_gcs_port = head_gcs_port
        self.metrics_url = metrics_url
        self.exclude = {os.getpid(), *exclude}
        self.period_s = period_s
        self.raylet = raylet_of(os.getpid())
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-sampler", daemon=True)

    def sample(self) -> tuple[float, dict[str, float]]:
        values: dict[str, float] = {}
        if self.raylet is not None:
            for pid, title in node_processes(self.raylet, self.head_gcs_port, self.exclude).items():
                try:
                    cmd = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                values[f"cpu/{processes.role_of(cmd)}/{pid}"] = processes.cpu_precise_s(pid)
                label = THREADED.get(_name(pid)) or THREADED.get(title.split(" ")[0])
                if self.head_gcs_port is not None and label is not None:
                    for tid, s in thread_cpu_s(pid).items():
                        values[f"thread/{label}/{tid}"] = s
        if self.metrics_url:
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                    text = r.read().decode(errors="replace")
                values.update({f"metrics/{k}": v for k, v in metrics_values(text).items()})
            except (OSError, http.client.HTTPException) as exc:
                self._error(f"metrics: {type(exc).__name__}: {exc}")
        return time.time(), values

    def _error(self, message: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(message[:200])

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # noqa: BLE001 - kept for the report; the next tick tries again
                self._error(f"sample: {type(exc).__name__}: {exc}")
            del self.samples[:-KEEP_SAMPLES]
            self._stop.wait(self.period_s)

    def start(self) -> bool:
        self._thread.start()
        return self.raylet is not None

    def since(self, t: float) -> list[tuple[float, dict[str, float]]]:
        return [s for s in self.samples if s[0] >= t]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def host_cpus() -> int:
    """The cores this process may run on (its machine's, as the OS gives them; a node started
    with ``num_cpus=0`` still runs on them)."""
    return len(os.sched_getaffinity(0))


def sampler_actor_class() -> Any:
    """The Ray actor class (Ray imported here: the lab imports this module without Ray)."""
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class NodeSampler:
        def __init__(
            self,
            head_gcs_port: int | None,
            metrics_url: str | None,
            exclude: tuple[int, ...],
            period_s: float,
        ) -> None:
            self.core = NodeSamplerCore(head_gcs_port, metrics_url, exclude, period_s)

        def start(self) -> dict[str, Any]:
            found = self.core.start()
            return {
                "node_id": ray.get_runtime_context().get_node_id(),
                "raylet_found": found,
                "host_cpus": host_cpus(),
            }

        def since(self, t: float) -> list[tuple[float, dict[str, float]]]:
            return self.core.since(t)

        def errors(self) -> list[str]:
            return list(self.core.errors)

        def stop(self) -> None:
            self.core.stop()

    return NodeSampler
