"""The scaling experiment's loopback cluster (tests/cluster/test_scaling_experiment.py): four
``ray start`` nodes on 127.0.0.1 as an operator starts them, configs/serve-cluster.yaml
deployed on them, and ``responses-ws bench scaling --cluster ADDRESS`` run as a driver of it.

:class:`LoopbackSweep` starts the cluster on a thread of its own and runs the sweep case's
experiment on it right after, while the tests before that case run (the ``loopback_sweep``
fixture, tests/conftest.py, at the session's first test)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench.services import ray_start_command, wait_ray_started
from serve.embedded import RAY_ENV, free_port
from tests.support.children import ray_start_lock
from tests.support.ray_cluster import MARKER, is_gcs, marked_pids

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "serve-cluster.yaml"
APPS = "/api/serve/applications/"
NODES = (  # (name, resources) of each ray start, the head first
    ("head", {"head": 1, "accelerator": 1}),
    ("session1", {"session": 1}),
    ("session2", {"session": 1}),
    ("client", {"client": 1}),
)
MB = 1024 * 1024
# The sweep case's run: two session-node steps at one load level, short windows (its
# checks need turns, not figures).
SWEEP = ("--session-nodes", "1,2", "--loops-per-node", "2", "--duration", "3", "--warmup", "0.5")
RUN_TIMEOUT_S = 240


class LoopbackCluster:
    """``ray start`` nodes on 127.0.0.1 in a temp dir of their own; :meth:`stop` ends every
    process they started (a marker in their environment), by pid."""

    def __init__(self) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rws-exp-", dir="/tmp"))
        self.marker = f"experiment-{os.getpid()}-{time.monotonic_ns()}"
        self.taken: set[int] = set()
        self.gcs_port, self.dashboard_port = self.port(), self.port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        env = {
            k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
        }
        env.update(RAY_ENV)
        self.token = secrets.token_hex(32)
        env.update(
            {
                MARKER: self.marker,
                "RAY_metrics_report_interval_ms": "500",
                # Serve's controller reconciles every 0.25 s (a development node's 1 s when this
                # process runs one): each step's new gateway count runs sooner
                "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.25",
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token,
            }
        )
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.metrics_urls: list[str] = []  # each node's Ray metrics endpoint (Prometheus text)

    def port(self) -> int:
        """A free port none of this cluster's others is (two free_port() calls in a row may
        answer the same one: Ray refuses a port given to two of its components)."""
        while (port := free_port()) in self.taken:
            pass
        self.taken.add(port)
        return port

    def start(self, lock: Path, redis_url: str, timeout_s: float = 180) -> None:
        """The head, then the other nodes one after another (several raylets joining at
        once on a loaded 2-core machine miss their start-up deadline: "The current node
        timed out during startup") while configs/serve-cluster.yaml is deployed (its
        gateway waits for the first session node); until the app runs."""
        deadline = time.monotonic() + timeout_s
        with ThreadPoolExecutor(1) as pool:
            with ray_start_lock(lock):
                self._wait(*self._spawn(*NODES[0]), deadline)
                deployed = pool.submit(self.deploy, self.port(), redis_url, deadline)
                for name, resources in NODES[1:]:
                    self._wait(*self._spawn(name, resources), deadline)
            deployed.result()

    def _spawn(self, name: str, resources: dict[str, int]) -> tuple[str, subprocess.Popen[bytes], Path]:
        metrics_port = self.port()
        self.metrics_urls.append(f"http://127.0.0.1:{metrics_port}/metrics")
        ports = [f"--metrics-export-port={metrics_port}"] + [
            f"--{p}-port={self.port()}"
            for p in ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc",
                      "runtime-env-agent")
        ]  # fmt: skip
        extra = [
            "--node-ip-address=127.0.0.1",
            f"--resources={json.dumps(resources)}",
            f"--object-store-memory={80 * MB}",
            *ports,
        ]
        if name == "head":
            extra += [f"--dashboard-port={self.dashboard_port}", "--dashboard-host=127.0.0.1",
                      f"--ray-client-server-port={self.port()}"]  # fmt: skip
            cmd = ray_start_command(temp_dir=self.temp_dir, num_cpus=1, head_port=self.gcs_port, extra=extra)
            cmd[cmd.index("--include-dashboard=false")] = "--include-dashboard=true"
        else:
            cmd = ray_start_command(temp_dir=self.temp_dir, num_cpus=1, address=self.address, extra=extra)
        log = self.temp_dir / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return name, proc, log

    def _wait(self, name: str, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
        wait_ray_started(proc, log, deadline, name)

    def rest(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.dashboard + APPS,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
        return json.loads(text) if text else {}

    def deploy(self, port: int, redis_url: str, deadline: float) -> dict[str, Any]:
        """configs/serve-cluster.yaml as ``serve deploy`` sends it, one gateway to start with."""
        raw = yaml.safe_load(CONFIG.read_text())
        args = raw["applications"][0]["args"]
        args["server"]["port"] = port
        args["server"]["gateway_replicas"] = 1
        # no balancer here to notice a stopping gateway's /readyz: it stops listening after 1 s, not 6
        # (the experiment waits for a gateway stopping at its start: the second run's)
        args["server"]["drain_health_grace_s"] = 1.0
        args["store"]["redis_url"] = redis_url
        args["store"]["redis_password_file"] = None  # the suite's redis-server has none
        args["session"]["warm_actors"] = 1
        args["inference"]["scaling"]["autoscaling"].update({"min_replicas": 1, "max_replicas": 1})
        while True:  # the dashboard's Serve module answers a few seconds after the head is up
            try:
                self.rest("PUT", raw)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        while True:
            apps = self.rest("GET").get("applications", {})
            if apps.get("responses-ws", {}).get("status") == "RUNNING":
                return apps["responses-ws"]
            assert time.monotonic() < deadline, f"app not running: {apps}"
            time.sleep(0.5)

    def alive_actors(self, class_name: str | None = None) -> list[str]:
        """The class names of the cluster's live actors (the dashboard's state API), of
        ``class_name`` only when given (filtered by the API: a short answer)."""
        query = "limit=1000&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE"
        if class_name is not None:
            query += f"&filter_keys=class_name&filter_predicates=%3D&filter_values={class_name}"
        req = urllib.request.Request(
            f"{self.dashboard}/api/v0/actors?{query}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return [a["class_name"] for a in json.loads(r.read())["data"]["result"]["result"]]

    def stop(self) -> None:
        # the GCS last: SIGTERM beside the rest keeps it waiting for them (tests/support/ray_cluster.py)
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            pids = {*marked_pids(self.marker), *(p.pid for p in self.procs if p.poll() is None)}
            for pid in {p for p in pids if sig == signal.SIGKILL or not is_gcs(p)}:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and marked_pids(self.marker):
                time.sleep(0.2)
        for p in self.procs:
            p.wait(timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def command(cluster: LoopbackCluster, out: Path, *flags: str) -> tuple[list[str], dict[str, str]]:
    cmd = [str(Path(sys.executable).parent / "responses-ws"), "bench", "scaling", "--cluster", cluster.address,
           "--out", str(out), *flags]  # fmt: skip
    return cmd, {k: v for k, v in cluster.env.items() if k != MARKER}  # the driver is not the cluster's


def experiment(cluster: LoopbackCluster, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd, env = command(cluster, out, *flags)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


class LoopbackSweep:
    """A :class:`LoopbackCluster` started on a thread of its own (holding the suite's Ray-start
    lock at ``lock`` while its nodes start) and, with ``flags``, the experiment run on it
    right after with those flags, its output in ``out``."""

    def __init__(self, lock: Path, redis_url: str, out: Path, flags: Sequence[str] | None) -> None:
        self.cluster = LoopbackCluster()
        self.out = out
        self._flags = flags
        self._run: subprocess.CompletedProcess[str] | None = None
        self.ended: float | None = None  # time.monotonic() when the run ended
        self._failed: BaseException | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._go, args=(lock, redis_url), name="loopback", daemon=True)
        self._thread.start()

    def _go(self, lock: Path, redis_url: str) -> None:
        try:
            self.cluster.start(lock, redis_url)
            if self._flags is None or self._closing.is_set():
                return
            cmd, env = command(self.cluster, self.out, *self._flags)
            self._proc = proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            try:
                out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
            self.ended = time.monotonic()
            self._run = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except BaseException as exc:  # noqa: BLE001 - raised again to the test that asks
            self._failed = exc

    def ready(self, timeout_s: float = 600) -> LoopbackCluster:
        """The cluster, once it runs and the run (with ``flags``) has ended; raises what
        went wrong on the thread."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the loopback cluster or its run not done in {timeout_s} s"
        if self._failed is not None:
            raise self._failed
        return self.cluster

    def run(self) -> subprocess.CompletedProcess[str]:
        """The experiment's run (``flags``): its return code and output."""
        self.ready()
        assert self._run is not None, "no run: the sweep was started without flags"
        return self._run

    def stop(self) -> None:
        """Ends the run if it still goes on, then every process of the cluster."""
        self._closing.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self._thread.join(RUN_TIMEOUT_S)
        self.cluster.stop()
