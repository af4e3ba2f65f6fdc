"""``responses-ws bench scaling --cluster ADDRESS`` on raylets on one machine (loopback, no
root): the orchestration of the scaling experiment, in the operations tier (``make
test-operations``, which ``.ci/run`` runs).

Four ``ray start`` nodes on 127.0.0.1 as an operator starts them, each with the custom
resources of its node type: the head (Serve's controller, the dashboard whose REST API the
experiment uses, the inference replica: ``head``, ``accelerator``), two session nodes
(``session``) and a client node (``client``).  configs/serve-cluster.yaml is deployed with
``serve deploy``'s REST call (one gateway to begin with, the suite's redis-server as the
store) while the nodes after the head join; the experiment then runs as a driver of the
cluster.  The nodes share one address here, so the experiment counts each node's turns on
the server's side (its Ray metrics, reported every 500 ms on this cluster).  One cluster
serves the module's cases.

A sweep of two session-node steps at one load level, short windows.  Checks: every load actor ran on the client node; each session node
served turns in every step that had it in service and none in a step that did not; the
steps are the sweep's; ``scaling.json`` validates against its schema; the gateway count is
back to the deployed one at the end; no load actor or sampler is left.

Then a ``--url`` outside the cluster is
refused with one line; ``--transports ws,http-full`` interleaves the transports over two
load levels, and Ctrl-C during the third step ends the run with the partial report
(``complete: false``) and no load actor or sampler left."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.report import validate
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
        ports = [
            f"--{p}-port={self.port()}"
            for p in ("node-manager", "object-manager", "metrics-export", "dashboard-agent-listen",
                      "dashboard-agent-grpc", "runtime-env-agent")
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


@pytest.fixture(scope="module")
def loopback(ray_start_lock_path, redis_server) -> Iterator[LoopbackCluster]:
    """One cluster for the module's cases (each ends with the deployment as it found it)."""
    cluster = LoopbackCluster()
    try:
        cluster.start(ray_start_lock_path, redis_server)
        yield cluster
    finally:
        cluster.stop()


def command(cluster: LoopbackCluster, out: Path, *flags: str) -> tuple[list[str], dict[str, str]]:
    cmd = [str(Path(sys.executable).parent / "responses-ws"), "bench", "scaling", "--cluster", cluster.address,
           "--out", str(out), *flags]  # fmt: skip
    return cmd, {k: v for k, v in cluster.env.items() if k != MARKER}  # the driver is not the cluster's


def experiment(cluster: LoopbackCluster, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd, env = command(cluster, out, *flags)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)


def nothing_left_behind(cluster: LoopbackCluster) -> None:
    """No load actor or node sampler of the run lives on (they end with it, bounded wait)."""
    deadline = time.monotonic() + 60
    while {"LoadActor", "NodeSampler"} & set(alive := cluster.alive_actors()):
        assert time.monotonic() < deadline, alive
        time.sleep(0.5)


def gateways_back_to_one(cluster: LoopbackCluster) -> None:
    """The deployment is back as it was: one gateway."""
    gateway = cluster.rest("GET")["applications"]["responses-ws"]["deployments"]["Gateway"]
    deadline = time.monotonic() + 60
    while gateway["target_num_replicas"] != 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        gateway = cluster.rest("GET")["applications"]["responses-ws"]["deployments"]["Gateway"]
    assert gateway["target_num_replicas"] == 1


def test_scaling_experiment_sweeps_the_session_nodes_of_a_loopback_cluster(loopback, tmp_path):
    """One sweep of two session-node steps at one load level, short
    windows (the checks need turns, not figures)."""
    cluster = loopback
    out = tmp_path / "run"
    run = experiment(
        cluster, out, "--session-nodes", "1,2", "--loops-per-node", "2", "--duration", "3", "--warmup", "0.5"
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    doc = json.loads((out / "scaling.json").read_text())
    validate(doc)
    assert doc["complete"] is True
    assert (out / "report.html").is_file()

    nodes = {n["node_id"]: n for n in doc["provenance"]["nodes"]}
    clients = {i for i, n in nodes.items() if "client" in n["roles"]}
    sessions = {i for i, n in nodes.items() if "session" in n["roles"]}
    assert len(clients) == 1 and len(sessions) == 2
    assert {n["node_id"] for n in doc["load_nodes"]} == clients
    for step in doc["steps"]:
        assert {c["node_id"] for c in step["clients"]} <= clients

    planned = [(s["session_nodes"], s["loops_per_node"], s["transport"]) for s in doc["steps"]]
    assert planned == [(1, 2, "ws"), (2, 2, "ws")]
    assert [s["loops"] for s in doc["steps"]] == [2, 4]
    for step in doc["steps"]:
        assert step["turns"] > 0 and not step["failures"], step  # valid or not: this machine's load
        assert step["turns_counted_by"] == "server"  # the nodes share one address here
        in_service = {n["node_id"] for n in step["nodes"]}
        assert len(in_service) == step["session_nodes"] and in_service <= sessions
        # One machine: the gateways share one listening socket (serve/port_claim.py), so the
        # kernel picks the node of each connection; the nodes in service served the turns.
        assert sum(n["turns"] for n in step["nodes"]) > 0, step["nodes"]
        out_of_service = {n["node_id"]: n["turns"] for n in step["out_of_service"]}
        assert set(out_of_service) == sessions - in_service and not any(out_of_service.values()), step

    gateways_back_to_one(cluster)
    nothing_left_behind(cluster)


def test_a_url_outside_the_cluster_is_refused_and_ctrl_c_writes_the_partial_report(loopback, tmp_path):
    """The operations tier's case: a ``--url`` outside the cluster is refused in one line;
    the transports interleaved and Ctrl-C during the third step: the load actors end, the
    partial report is written."""
    cluster = loopback
    bad = experiment(cluster, tmp_path / "bad", "--url", "http://192.0.2.1:8765")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "is not one of the cluster's session nodes" in bad.stderr

    out = tmp_path / "interrupted"
    cmd, env = command(cluster, out, "--session-nodes", "1", "--loops-per-node", "1,2", "--duration", "6",
                       "--warmup", "1", "--transports", "ws,http-full")  # fmt: skip
    # Ctrl-C at a terminal: SIGINT at its default in the run (a suite started in the background
    # of a shell, as `cmd &`, ignores SIGINT, and the run would inherit that)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the second step's progress line
            if line.startswith("[2/4]"):
                break
        deadline = time.monotonic() + 60
        polls: list[float] = []  # how long each look took (the state API on a loaded machine)
        while True:  # until the third step's load runs
            t0 = time.monotonic()
            running = cluster.alive_actors("LoadActor")
            polls.append(round(time.monotonic() - t0, 2))
            assert proc.poll() is None, (
                f"the run ended before its third step was seen; state API polls (s): {polls}"
            )
            if running:
                break
            assert time.monotonic() < deadline, "the third step did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, f"state API polls (s): {polls}\n{err[-3000:]}"
    partial = json.loads((out / "scaling.json").read_text())
    validate(partial)
    assert partial["complete"] is False and partial["error"] == "interrupted"
    assert [(s["transport"], s["loops"]) for s in partial["steps"]] == [("ws", 1), ("http-full", 1)]
    nothing_left_behind(cluster)
    for step in partial["steps"]:  # every loop connected at its first attempt, and served turns
        assert step["turns"] > 0 and not step["failures"], step
