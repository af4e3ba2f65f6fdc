"""The harness: ``with Harness() as h:`` builds the network, starts Redis and the Ray nodes
(``ray start --block`` inside each namespace), deploys the Serve config, waits for every
session node's ``/readyz`` and starts HAProxy in front; clients connect to :attr:`url`.
With ``job_server=True`` the head runs Ray's job server too (:meth:`Harness.submit_job`).
It injects faults on a node and tears everything down on exit, on an error in its set-up,
and at interpreter exit.  It needs root, and refuses to start beside a leftover of its
prefix (``python -m bench.multinode.cleanup`` removes one)."""

from __future__ import annotations

import atexit
import functools
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
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import services
from . import balancer, network, processes
from .cleanup import BALANCER_PIDFILE, temp_dirs
from .jobs import JOB_PORT, Job, JobServer
from .topology import PREFIX, SUBNET, Node, NodeSpec, Topology, leftovers

ROOT = Path(__file__).resolve().parents[2]
SERVE_CLUSTER_CONFIG = ROOT / "configs" / "serve-cluster.yaml"
GCS_PORT = 6379
REDIS_PORT = 6390
# The head carries the accelerator role here (inference replicas), which saves a raylet on
# a small machine; pass your own specs for a separate accelerator node.
DEFAULT_SPECS = (
    NodeSpec("head", {"head": 1, "accelerator": 2}),
    NodeSpec("session", {"session": 1}),
    NodeSpec("session", {"session": 1}),
)
# The Ray environment of every node and driver, as docs/deploy.md has operators start theirs
# (workers at niceness 0, not Ray's 15).  Serve's draining settings stay at Ray's defaults:
# the harness exists to test the product under them.
RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_worker_niceness": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "token",
}
# A node that generates load (bench/runner's actors go to nodes with the ``client`` resource);
# its CPUs are for them and for nothing of the app (which asks for session/accelerator).
CLIENT_SPEC = NodeSpec("client", {"client": 1}, num_cpus=2)


class LeftoverError(RuntimeError):
    pass


@dataclass
class Drain:
    """A drain in progress: Ray was told at ``requested_at`` (monotonic) that the node dies
    ``deadline_s`` later, and the harness kills it then unless :meth:`cancel` ed."""

    node: str
    node_id: str
    deadline_s: float
    requested_at: float
    output: str
    timer: threading.Timer | None = field(default=None, repr=False)
    killed_at: float | None = None

    @property
    def deadline_at(self) -> float:
        return self.requested_at + self.deadline_s

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class Harness:
    def __init__(
        self,
        specs: tuple[NodeSpec, ...] = DEFAULT_SPECS,
        *,
        prefix: str = PREFIX,
        subnet: str = SUBNET,
        balancer_settings: balancer.BalancerSettings | None = None,
        serve_config: Path | None = SERVE_CLUSTER_CONFIG,
        edit_args: Callable[[dict[str, Any]], None] | None = None,
        object_store_mb: int = 80,
        start_timeout_s: float = 300.0,
        job_server: bool = False,
    ) -> None:
        self.topology = Topology(specs, prefix=prefix, subnet=subnet)
        self.balancer_settings = balancer_settings or balancer.BalancerSettings()
        self.serve_config = serve_config
        self.edit_args = edit_args
        self.object_store_mb = object_store_mb
        self.start_timeout_s = start_timeout_s
        self.job_server = job_server
        self.jobs: list[Job] = []
        self.temp_dir: Path | None = None
        self.procs: dict[str, list[subprocess.Popen]] = {}  # node name (or "balancer") → started
        self.node_ids: dict[str, str] = {}  # node name → Ray node id
        self.drains: list[Drain] = []
        self._paused: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = True
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(RAY_ENV, RAY_AUTH_TOKEN=secrets.token_hex(32), PYTHONUNBUFFERED="1")
        # this interpreter's scripts first: a job's entrypoint (`responses-ws ...`) and `ray`
        venv_bin = str(Path(sys.executable).parent)
        self.env["PATH"] = os.pathsep.join(
            [venv_bin, *(p for p in self.env.get("PATH", "").split(os.pathsep) if p)]
        )

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """The balancer: every client connects here."""
        return f"http://{self.topology.bridge_address}:{self.balancer_settings.port}"

    @property
    def ws_url(self) -> str:
        return self.url.replace("http", "ws", 1) + "/v1/responses"

    @property
    def gcs_address(self) -> str:
        return f"{self.topology.head.address}:{GCS_PORT}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.topology.head.address}:{REDIS_PORT}/0"

    @property
    def data_dir(self) -> Path:
        """The app's ``store.data_dir`` (in the temp dir; one directory for all nodes, which
        share this machine's disk)."""
        assert self.temp_dir is not None
        return self.temp_dir / "data"

    def node(self, name: str) -> Node:
        return self.topology.node(name)

    def node_url(self, name: str) -> str:
        return f"http://{self.node(name).address}:{self.balancer_settings.port}"

    @property
    def session_nodes(self) -> list[Node]:
        return self.topology.with_role("session")

    @property
    def client_nodes(self) -> list[Node]:
        return self.topology.with_role("client")

    @property
    def job_address(self) -> str:
        """Ray's job server on the head (``ray job submit --address``); needs ``job_server``."""
        if not self.job_server:
            raise RuntimeError("this harness runs no job server (Harness(job_server=True))")
        return f"http://{self.topology.head.address}:{JOB_PORT}"

    @property
    def job_client(self) -> JobServer:
        return JobServer(self.job_address, self.env)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Harness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("the multi-node harness needs root (network namespaces, a bridge)")
        left = leftovers(
            network.links(), network.namespaces(), temp_dirs(self.topology.prefix), self.topology.prefix
        )
        if left:
            raise LeftoverError(
                "a multi-node harness left these behind (or one is running): "
                + ", ".join(left)
                + f"; remove them with `python -m bench.multinode.cleanup --prefix {self.topology.prefix}`"
                " (make multinode-clean)"
            )
        self._stopped = False
        atexit.register(self.stop)
        self.temp_dir = Path(
            tempfile.mkdtemp(prefix=f"{self.topology.prefix}-", dir="/tmp")
        )  # short: socket paths
        deadline = time.monotonic() + self.start_timeout_s
        try:
            network.create(self.topology)
            network.check_isolated(self.topology)
            self._start_redis()
            self._start_ray(deadline)
            if self.job_server:
                self.job_client.wait_up(deadline)
            if self.serve_config is not None:
                self._deploy(deadline)
                for node in self.session_nodes:
                    self.wait_ready(node.name, timeout_s=max(1.0, deadline - time.monotonic()))
            self._start_balancer(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End every process the harness started, remove its namespaces, interfaces and temp
        dir.  Safe to call twice, and after a failed start."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for d in self.drains:
            d.cancel()
        errors: list[BaseException] = []  # every step is tried; the first error is raised after
        steps: list[Callable[[], object]] = [functools.partial(processes.stop, j.proc) for j in self.jobs]
        steps += [functools.partial(processes.stop, p) for p in self.procs.get("balancer", [])]
        steps += [functools.partial(processes.kill_namespace, n.namespace) for n in self.topology.nodes]
        steps += [
            lambda: processes.reap(p for ps in self.procs.values() for p in ps),
            lambda: network.destroy(self.topology.prefix),
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the rest must still be torn down
                errors.append(exc)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        atexit.unregister(self.stop)
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ set-up steps

    def _log(self, name: str) -> Path:
        assert self.temp_dir is not None
        return self.temp_dir / f"{name}.log"

    def _launch(self, owner: str, cmd: list[str], namespace: str | None) -> subprocess.Popen:
        proc = processes.launch(cmd, self._log(owner), self.env, namespace)
        self.procs.setdefault(owner, []).append(proc)
        return proc

    def _start_redis(self) -> None:
        head = self.topology.head
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make redis)")
        cmd = services.redis_server_command(
            binary, REDIS_PORT, bind=head.address, extra=["--protected-mode", "no"]
        )
        self._launch("redis", cmd, head.namespace)

    def _ray_start(self, node: Node, incarnation: int = 1) -> list[str]:
        assert self.temp_dir is not None
        temp = self.temp_dir / (node.name if incarnation == 1 else f"{node.name}-{incarnation}")
        head = node.spec.role == "head"
        return services.ray_start_command(
            temp_dir=temp,
            num_cpus=node.spec.num_cpus,
            head_port=GCS_PORT if head else None,
            address=None if head else self.gcs_address,
            dashboard=(node.address, JOB_PORT) if head and self.job_server else None,
            extra=[
                f"--node-ip-address={node.address}",
                f"--resources={json.dumps(node.spec.resources)}",
                f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            ],
        )

    def _wait_started(self, node: Node, deadline: float, owner: str | None = None) -> None:
        owner = owner or node.name
        services.wait_ray_started(self.procs[owner][0], self._log(owner), deadline, node.name)

    def _start_ray(self, deadline: float) -> None:
        head, workers = self.topology.head, self.topology.nodes[1:]
        self._launch(head.name, self._ray_start(head), head.namespace)
        self._wait_started(head, deadline)
        for node in workers:
            self._launch(node.name, self._ray_start(node), node.namespace)
        for node in workers:
            self._wait_started(node, deadline)
        by_address = {n.address: n.name for n in self.topology.nodes}
        while True:
            alive = {n["address"]: n["node_id"] for n in self.nodes() if n["alive"]}
            if set(by_address) <= set(alive):
                self.node_ids = {name: alive[addr] for addr, name in by_address.items()}
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not all alive in Ray: {sorted(alive)}")
            time.sleep(1.0)

    def app_config(self) -> dict[str, Any]:
        """The Serve config deployed: the file's, with the store on the head's Redis (no
        password; its data dir :attr:`data_dir`) and one gateway per session node, then ``edit_args`` applied to
        each application's args."""
        assert self.serve_config is not None
        raw = yaml.safe_load(self.serve_config.read_text())
        for app in raw["applications"]:
            args = app.setdefault("args", {})
            args.setdefault("store", {})["redis_url"] = self.redis_url
            args["store"]["redis_password_file"] = (
                None  # the harness's Redis has no password (its own bridge)
            )
            args["store"].setdefault("data_dir", str(self.data_dir))
            args.setdefault("server", {})["gateway_replicas"] = len(self.session_nodes)
            if self.edit_args is not None:
                self.edit_args(args)
        return raw

    def _deploy(self, deadline: float) -> None:
        """The app, by `serve deploy` with the job server (Serve keeps the config in force:
        its REST API shows it), else through Serve's Python API by a driver on the head."""
        assert self.temp_dir is not None
        path = self.temp_dir / "serve-config.json"
        path.write_text(json.dumps(self.app_config()))
        if self.job_server:  # `serve deploy` to the dashboard, as on a cluster of `ray up`
            self.job_client.serve_deploy(path, deadline)
            return
        timeout = max(10.0, deadline - time.monotonic())
        self.driver("deploy", str(path), "--timeout", str(timeout), timeout_s=timeout + 30)

    def _start_balancer(self, deadline: float) -> None:
        assert self.temp_dir is not None
        binary = shutil.which("haproxy")
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (make haproxy)")
        cfg = self.temp_dir / "haproxy.cfg"
        servers = {n.name: n.address for n in self.session_nodes}
        cfg.write_text(
            balancer.config(self.balancer_settings, self.topology.bridge_address, servers, self.stats_socket)
        )
        check = subprocess.run(
            [binary, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=10, check=False
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {cfg}: {check.stdout}{check.stderr}")
        proc = self._launch("balancer", [binary, "-db", "-f", str(cfg)], None)
        (self.temp_dir / BALANCER_PIDFILE).write_text(str(proc.pid))
        while True:
            states = {}
            if proc.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{self._log('balancer').read_text()[-3000:]}")
            if self.stats_socket.exists():
                states = self.server_states()
                if states and all(s.startswith("UP") for s in states.values()):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"balancer: servers not all up: {states}")
            time.sleep(0.3)

    # ------------------------------------------------------------------ jobs

    def submit_job(self, *entrypoint: str, name: str = "job") -> Job:
        """``ray job submit --address`` :attr:`job_address` ``-- ENTRYPOINT`` from the root
        namespace, as a user submits one (its output in the temp dir's ``NAME.log``); the
        entrypoint runs on the head.  Its CLI is stopped with the harness."""
        assert self.temp_dir is not None
        job = self.job_client.submit(list(entrypoint), self._log(f"{name}-{len(self.jobs) + 1}"))
        self.jobs.append(job)
        return job

    # ------------------------------------------------------------------ queries

    def driver(self, *args: str, timeout_s: float = 120.0) -> Any:
        """Run :mod:`bench.multinode.driver` with ``args`` inside the head's namespace; its
        JSON output."""
        cmd = network.in_namespace(
            self.topology.head.namespace,
            sys.executable,
            "-m",
            "bench.multinode.driver",
            "--address",
            self.gcs_address,
            *args,
        )
        res = subprocess.run(
            cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if res.returncode != 0:
            raise RuntimeError(f"driver {args[0]} failed:\n{res.stderr[-4000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])

    def nodes(self) -> list[dict[str, Any]]:
        """Ray's view of the nodes: id, address, alive, resources."""
        return self.driver("nodes")

    def ready(self, name: str, timeout_s: float = 2.0) -> int | None:
        """The status of the node's ``/readyz`` (None: no answer)."""
        try:
            with urllib.request.urlopen(self.node_url(name) + "/readyz", timeout=timeout_s) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (OSError, urllib.error.URLError):
            return None

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (status := self.ready(name)) != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: /readyz answered {status} for {timeout_s:.0f}s")
            time.sleep(0.5)

    @property
    def stats_socket(self) -> Path:
        assert self.temp_dir is not None
        return self.temp_dir / "haproxy.sock"

    def server_states(self) -> dict[str, str]:
        """Session node → the balancer's view of it (``UP``, ``DOWN``, ``UP 1/2``…)."""
        return balancer.server_states(balancer.command(self.stats_socket, "show stat"))

    def connection_servers(self) -> dict[int, str]:
        """Client source port → the session node the balancer sent that connection to."""
        return balancer.sessions_at(self.stats_socket)

    @property
    def connection_lookup(self) -> Callable[[], dict[int, str]]:
        """:meth:`connection_servers` as a picklable call (a load's client processes make it)."""
        return functools.partial(balancer.sessions_at, self.stats_socket)

    # ------------------------------------------------------------------ faults

    def kill(self, name: str) -> int:
        """SIGKILL every process of the node; how many there were."""
        node = self.node(name)
        self._paused.discard(name)
        n = processes.kill_namespace(node.namespace)
        processes.reap(p for o, ps in self.procs.items() if o.split("#")[0] == name for p in ps)
        return n

    def restart(self, name: str, timeout_s: float = 180.0) -> None:
        """Start a killed node again (``ray start`` in its namespace, a new Ray node id) and
        wait until its gateway answers ``/readyz`` 200 (Serve places one there again).  A
        drain of the node whose kill is still pending is waited for first."""
        node = self.node(name)
        for drain in self.drains:
            if drain.node == name and drain.timer is not None and drain.timer.is_alive():
                drain.timer.join(timeout=max(0.0, drain.deadline_at - time.monotonic()) + 10.0)
        if network.namespace_pids(node.namespace):
            raise RuntimeError(f"{name} still has processes: kill it first")
        deadline = time.monotonic() + timeout_s
        incarnation = 1 + sum(1 for owner in self.procs if owner == name or owner.startswith(f"{name}#"))
        owner = f"{name}#{incarnation}"
        self._launch(owner, self._ray_start(node, incarnation), node.namespace)
        self._wait_started(node, deadline, owner)
        while True:
            old = self.node_ids.get(name)
            alive = [
                n for n in self.nodes() if n["alive"] and n["address"] == node.address and n["node_id"] != old
            ]
            if alive:
                self.node_ids[name] = alive[0]["node_id"]
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not alive in Ray after its restart")
            time.sleep(1.0)
        self.wait_ready(name, timeout_s=max(1.0, deadline - time.monotonic()))

    def pause(self, name: str) -> int:
        """SIGSTOP every process of the node (:meth:`resume` continues them)."""
        self._paused.add(name)
        return processes.send(network.namespace_pids(self.node(name).namespace), signal.SIGSTOP)

    def resume(self, name: str) -> int:
        self._paused.discard(name)
        return processes.send(network.namespace_pids(self.node(name).namespace), signal.SIGCONT)

    def pause_store(self, paused: bool = True) -> None:
        """SIGSTOP the head's Redis (every store call waits, nothing fails), or, with
        ``paused=False``, SIGCONT it."""
        processes.send([p.pid for p in self.procs["redis"]], signal.SIGSTOP if paused else signal.SIGCONT)

    def link(self, name: str, up: bool) -> None:
        """The node's link down (no packet passes, no reset is sent) or up again."""
        network.set_link(self.node(name), up)

    def partition(self, name: str, heal: bool = False) -> None:
        """Drop traffic between the node and every other node (the balancer still reaches
        it), or, with ``heal``, let it through again."""
        node = self.node(name)
        others = [n for n in self.topology.nodes if n.name != name]
        (network.heal if heal else network.partition)(node, others)

    def drain(
        self, name: str, deadline_s: int, reason_message: str = "multinode harness", kill: bool = True
    ) -> Drain:
        """Ray's drain of the node (``ray drain-node``, reason preemption) with a deadline
        ``deadline_s`` from now; with ``kill``, the node is killed when it has passed."""
        node_id = self.node_ids[name]
        ray = str(Path(sys.executable).parent / "ray")
        cmd = network.in_namespace(
            self.topology.head.namespace,
            ray,
            "drain-node",
            f"--address={self.gcs_address}",
            f"--node-id={node_id}",
            "--reason=DRAIN_NODE_REASON_PREEMPTION",
            f"--reason-message={reason_message}",
            f"--deadline-remaining-seconds={deadline_s}",
        )
        res = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        requested_at = time.monotonic()  # the deadline was set just before: the kill is never early
        if res.returncode != 0:
            raise RuntimeError(f"ray drain-node failed: {res.stdout}{res.stderr}")
        drain = Drain(name, node_id, float(deadline_s), requested_at, res.stdout + res.stderr)
        if kill:

            def kill_at_deadline() -> None:
                drain.killed_at = time.monotonic()
                self.kill(name)

            drain.timer = threading.Timer(deadline_s, kill_at_deadline)
            drain.timer.daemon = True
            drain.timer.start()
        self.drains.append(drain)
        return drain
