"""``responses-ws bench scaling --cluster ADDRESS|auto``: the scaling experiment on the user's
own Ray cluster (docs/scaling.md, "Run a scaling experiment on your cluster").

The driver (normally a Ray job on the head) finds the deployment through Serve's REST API,
starts a sampler on every server node (bench/experiment/sampler.py) and a store meter, then
runs the sweep's steps in order: the gateway pinned to the step's count of session nodes,
the load runner's actors on the client nodes (bench/runner) sending the step's loops to the
session nodes in service, evenly; after each step its figures, a progress line and the live
page's update.  At the end, or on Ctrl-C or a failed step (the load actors are ended), the
gateway's config in force at the start is deployed again and the report is written:
``scaling.json`` (validated against its schema), ``report.html``, the CSV and markdown
tables (bench/report); ``complete`` says whether every step ran."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from serve.embedded import readiness

from .. import results
from ..report import LivePage, progress_line, validate, write_report
from ..runner import CPU_LIMIT, LAG_P99_LIMIT_MS, LoadSpec, NoClientNodes, run_on_cluster
from . import capacity, figures, window
from .deployment import Deployment, InService, ServeRest
from .errors import SetupError
from .nodes import addresses_distinct, alive_nodes, require_client_nodes, targets, url_of, with_role
from .options import Options
from .plan import PlannedStep, Sweep, steps
from .sampler import sampler_actor_class
from .store_meter import StoreMeter

READY_TIMEOUT_S = 60.0
GCS_CONNECT_TIMEOUT_S = 5.0
SETTLE_TIMEOUT_S = 120.0  # for a deployment change under way at the start (a gateway stopping) to end
PIN_TIMEOUT_S = 180.0  # for the gateways of a new count to run, on nodes that are up
AUTOSCALE_TIMEOUT_S = 900.0  # ... on nodes Ray's autoscaler has to add
ROOT = Path(__file__).resolve().parents[2]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """The commit of the checkout the lab runs from (None for an installed wheel)."""
    if not (ROOT / ".git").exists():
        return None
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or None


def require_gcs(address: str, timeout_s: float = GCS_CONNECT_TIMEOUT_S) -> None:
    """A TCP connection to the GCS at ``address`` (``HOST:PORT``; ``auto`` is Ray's to find)
    opens, else :class:`SetupError` in one line: ``ray.init`` would retry for minutes."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SetupError(f"--cluster {address!r} is not HOST:PORT (the head's GCS address) or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise SetupError(
            f"no Ray cluster answers at {address} ({exc}); --cluster takes the head's GCS address "
            "(HOST:6379 by default) or auto inside a Ray job or on the head"
        ) from None


def wait_ready(nodes: list[InService], port: int, timeout_s: float) -> None:
    """Every node's ``/readyz`` answers 200; SetupError naming the first that does not."""
    deadline = time.monotonic() + timeout_s
    for n in nodes:
        url = url_of(n.node_ip, port)
        while True:
            status, report = readiness(url)
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise SetupError(
                    f"session node {n.node_ip} is not ready: GET {url}/readyz answered {status} {report}"
                )
            time.sleep(0.5)


class Experiment:
    def __init__(self, opts: Options) -> None:
        import ray

        self.opts = opts
        require_gcs(opts.address)
        context = ray.init(address=opts.address, log_to_driver=False, logging_level=logging.WARNING)
        if not context.dashboard_url:
            raise SetupError(
                "the cluster runs no Ray dashboard: the experiment changes the deployment through Serve's "
                "REST API on it (start the head with --include-dashboard=true, as `ray up` does)"
            )
        self.gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
        self.host_cpus: dict[str, int] = {}  # node id -> its machine's cores, from its sampler
        self.nodes = alive_nodes(ray.nodes())
        require_client_nodes(self.nodes)
        self.session = with_role(self.nodes, "session")
        self.deployment = Deployment(ServeRest(f"http://{context.dashboard_url}"))
        self.in_service = self.deployment.settled(SETTLE_TIMEOUT_S)
        counts = opts.session_nodes or tuple(range(1, len(self.session) + 1))
        if not counts:
            raise SetupError("no session nodes: no live node has the `session` resource")
        # more than are up: the pinned gateways wait for Ray's autoscaler to add their nodes
        self.pin_timeout_s = PIN_TIMEOUT_S if max(counts) <= len(self.session) else AUTOSCALE_TIMEOUT_S
        wait_ready(self.in_service, self.deployment.port, 10.0)
        targets(self.in_service, self.session, self.deployment.port, opts.url, opts.url_is_balancer)
        s = opts.sweep
        self.sweep = Sweep(counts, s.loops_per_node, s.transports, s.repeats, s.duration_s, s.warmup_s)
        self.doc: dict[str, Any] = {
            "provenance": {
                "command": opts.command,
                "project_version": results.version(results.PROJECT),
                "git_commit": git_commit(),
                "ray_version": ray.__version__,
                "started_at": now_iso(),
                "finished_at": None,
                "nodes": [n.as_dict() for n in self.nodes],
                "serve_config": self.deployment.original,
            },
            "load_nodes": [],
            "sweep": {
                **self.sweep.as_dict(),
                "saturation": {"lag_p99_ms": LAG_P99_LIMIT_MS, "cpu_fraction": CPU_LIMIT},
            },
            "complete": False,
            "steps": [],
        }

    # ------------------------------------------------------------------ samplers

    def start_samplers(self, period_s: float) -> dict[str, Any]:
        import os

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = sampler_actor_class()
        out = {}
        for n in self.nodes:
            if not {"head", "session", "accelerator"} & set(n.roles):
                continue
            metrics = f"http://{n.node_ip}:{n.metrics_port}/metrics" if n.metrics_port else None
            out[n.node_id] = cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)
            ).remote(self.gcs_port if "head" in n.roles else None, metrics, (os.getpid(),), period_s)
        started = ray.get([a.start.remote() for a in out.values()], timeout=120)
        self.host_cpus.update({s["node_id"]: s["host_cpus"] for s in started})
        for n in self.doc["provenance"]["nodes"]:
            if n["node_id"] in self.host_cpus:
                n["host_cpus"] = self.host_cpus[n["node_id"]]
        return out

    # ------------------------------------------------------------------ one step

    def measure(
        self,
        planned: PlannedStep,
        in_service: list[InService],
        samplers: dict[str, Any],
        store: StoreMeter | None,
    ) -> dict[str, Any]:
        import ray

        tg = targets(in_service, self.session, self.deployment.port, self.opts.url, self.opts.url_is_balancer)
        spec = LoadSpec(
            targets=tg,
            loops=planned.loops,
            transport=planned.transport,
            workload=self.opts.workload,
            duration_s=self.sweep.duration_s,
            warmup_s=self.sweep.warmup_s,
            seed=self.opts.seed + planned.index,
            api_key=self.opts.api_key,
            store=self.opts.store,
        )
        try:
            result = run_on_cluster(spec)
        except NoClientNodes as exc:
            raise SetupError(str(exc)) from None
        t0, t1 = result.window
        ids = list(samplers)
        got = ray.get([samplers[i].since.remote(t0 - 5) for i in ids], timeout=60)
        deltas = {i: window.scaled(s, t0, t1)[0] for i, s in zip(ids, got)}
        by_id = {n.node_id: n for n in self.nodes}
        server_side = self.opts.url_is_balancer or not addresses_distinct(self.session)
        nodes = [
            figures.SessionNode(n.node_id, n.node_ip, url_of(n.node_ip, self.deployment.port))
            for n in in_service
        ]
        counted = None
        if server_side:
            counted = {}
            for i, s in zip(ids, got):
                ins = window.inside(s, t0, t1)
                counted[i] = (deltas[i].get("metrics/served", 0.0), window.gauge_mean(ins, "metrics/sockets"))
        cpu = {i: window.cpu_ms_by_role(deltas[i]) for i in ids if i in {n.node_id for n in in_service}}
        accs = [
            figures.Accelerator(
                i,
                by_id[i].node_ip,
                window.cpu_ms_by_role(deltas[i]).get("inference", 0.0),
                window.running_per_replica(window.inside(s, t0, t1)),
            )
            for i, s in zip(ids, got)
            if "accelerator" in by_id[i].roles
        ]
        blocks = [b for i in ids if (b := window.prefix_blocks(deltas[i])) is not None]
        head = next((i for i in ids if "head" in by_id[i].roles), None)
        measured = figures.Measured(
            turns=result.in_window(),
            duration_s=t1 - t0,
            clients=result.clients,
            saturated=result.saturated,
            saturated_reason=result.reason,
            nodes=nodes,
            cpu_ms=cpu,
            accelerators=accs,
            prefix_blocks=(sum(b[0] for b in blocks), sum(b[1] for b in blocks)) if blocks else None,
            store=store.window(t0, t1) if store is not None else None,
            shared_ms_per_s=window.busiest_thread_ms_per_s(deltas[head], t1 - t0) if head else {},
            counted=counted,
            connect_failures=result.connect_failures,
            unconnected=result.loops - result.connected,
        )
        step = figures.step_figures(
            {
                "index": planned.index,
                "repeat": planned.repeat,
                "transport": planned.transport,
                "session_nodes": planned.session_nodes,
                "loops_per_node": planned.loops_per_node,
                "loops": planned.loops,
            },
            measured,
        )
        # the session nodes out of service, as their own metrics count them: no turn should reach them
        serving = {n.node_id for n in in_service}
        step["out_of_service"] = [
            {
                "node_id": n.node_id,
                "node_ip": n.node_ip,
                "turns": round(deltas.get(n.node_id, {}).get("metrics/served", 0.0)),
            }
            for n in self.session
            if n.node_id not in serving
        ]
        step["actors_per_session_node"] = self.actors_per_node(in_service)
        for c in result.clients:
            entry = {"node_id": c.node_id, "node_ip": c.node_ip}
            if entry not in self.doc["load_nodes"]:
                self.doc["load_nodes"].append(entry)
        return step

    def store_meter(self) -> StoreMeter | None:
        """The store's meter, or None (not Redis, or not reachable from the driver: noted)."""
        import redis

        settings = self.deployment.config.get("args", {}).get("store") or {}
        try:
            meter = StoreMeter.for_config(settings)
            return meter.start() if meter is not None else None
        except (redis.RedisError, OSError) as exc:
            self.doc.setdefault("notes", []).append(f"store not measured: {type(exc).__name__}: {exc}"[:300])
            return None

    def sampler_errors(self, samplers: dict[str, Any]) -> dict[str, list[str]]:
        """What each node's sampler could not read (kept in scaling.json)."""
        import ray

        ids = list(samplers)
        try:
            got = ray.get([samplers[i].errors.remote() for i in ids], timeout=30)
        except Exception as exc:  # noqa: BLE001 - the report is written anyway
            return {"driver": [f"{type(exc).__name__}: {exc}"[:200]]}
        return {i: e for i, e in zip(ids, got) if e}

    def actors_per_node(self, in_service: list[InService]) -> float | None:
        from ray.util.state import list_actors

        try:
            alive = list_actors(
                address=self.deployment.rest.base,
                filters=[("state", "=", "ALIVE")],
                limit=10000,
                raise_on_missing_output=False,
            )
        except Exception as exc:  # noqa: BLE001 - a figure of the model, not of the step
            self.doc.setdefault("notes", []).append(f"actors per node: {type(exc).__name__}: {exc}"[:300])
            return None
        ids = {n.node_id for n in in_service}
        here = [a for a in alive if a.node_id in ids and not a.class_name.endswith("NodeSampler")]
        return round(len(here) / len(ids), 2) if ids else None

    # ------------------------------------------------------------------ the run

    def run(self) -> int:
        import ray

        planned = steps(self.sweep)
        period = max(0.25, min(1.0, self.sweep.duration_s / 8))
        live = LivePage(self.opts.live_host, self.opts.live_port)
        print(f"live page: {live.start()}", flush=True)
        samplers: dict[str, Any] = {}
        store: StoreMeter | None = None
        status, error = 0, None
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            samplers = self.start_samplers(period)
            store = self.store_meter()
            current = len(self.in_service)
            in_service = self.in_service
            for p in planned:
                if p.session_nodes != current or len(in_service) != p.session_nodes:
                    in_service = self.deployment.pin(p.session_nodes, self.pin_timeout_s)
                    self.session = with_role(alive_nodes(ray.nodes()), "session")  # the autoscaler's too
                    wait_ready(in_service, self.deployment.port, READY_TIMEOUT_S)
                    current = p.session_nodes
                step = self.measure(p, in_service, samplers, store)
                self.doc["steps"].append(step)
                live.update(self.doc)
                print(progress_line(step, len(planned)), flush=True)
            self.doc["complete"] = True
        except KeyboardInterrupt:
            status, error = 130, "interrupted"
        except SetupError as exc:  # a session node not ready after a change: the step failed
            status, error = 2, exc.message
        except Exception as exc:  # noqa: BLE001 - a failed step ends the run with a partial report
            status, error = 1, f"{type(exc).__name__}: {exc}"[:500]
        finally:
            signal.signal(signal.SIGTERM, previous)
            try:
                self.deployment.restore()
            except Exception as exc:  # noqa: BLE001 - said in one line; the report is written anyway
                print(f"responses-ws bench scaling: restoring the deployment: {exc}"[:500], file=sys.stderr)
                status = status or 1
            finally:
                self.doc["sampler_errors"] = self.sampler_errors(samplers)
                for a in samplers.values():
                    ray.kill(a)
                if store is not None:
                    store.close()
                status = self.finish(status, error, live)
                live.stop()
        return status

    def finish(self, status: int, error: str | None, live: LivePage) -> int:
        doc = self.doc
        doc["provenance"]["finished_at"] = now_iso()
        if error is not None:
            doc["error"] = error
            print(
                f"responses-ws bench scaling: the run ended early ({error}); writing the partial report",
                file=sys.stderr,
            )
        cores, source = capacity.node_cores(self.session, self.host_cpus)
        model = capacity.refit(doc["steps"], cores, source)
        if model is not None:
            doc["model"] = model
            for line in capacity.lines_text(model):
                print(line)
        try:
            validate(doc)
            live.update(doc)
            paths = write_report(doc, self.opts.out)
        except ValueError as exc:  # kept as measured, for the record; the report needs a valid one
            print(f"responses-ws bench scaling: scaling.json does not validate: {exc}", file=sys.stderr)
            self.opts.out.mkdir(parents=True, exist_ok=True)
            paths = {"scaling.json": self.opts.out / "scaling.json"}
            paths["scaling.json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
            status = status or 1
        for name, path in sorted(paths.items()):
            print(f"{name}: {path}")
        return status


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(opts: Options) -> int:
    try:
        return Experiment(opts).run()
    except SetupError as exc:
        print(f"responses-ws bench scaling: {exc.message}", file=sys.stderr)
        return 2
