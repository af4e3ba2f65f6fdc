"""Admission at scale: bursts, arrival ramps, held connections, memory and CPU per connection.

Against an embedded server on the default configuration (or ``--url``, or ``--cluster``),
its connections opened by the lab's load runner (bench/runner, ``start_local``: one client
process of this machine, ``--idle-clients`` in the idle phase), in this order:

- ``warm``: connects to a warm, idle server, one every :data:`WARM_GAP_S`, each closed;
- ``ramp`` (first of the loads, so its memory is measured on a fresh server): connections
  arriving at R/s, held open; connect latency percentiles; the server's private memory (USS
  of the session hosts and the gateway) per held connection, measured as a delta from before
  the ramp so the baselines of hosts started for it count; then one turn on every held
  connection at once; with ``--ramp-create`` each connection also sends one short create as
  soon as it is open (arrivals that each start a turn), timed beside its connect;
- ``burst``: N connections opened at once (``--open-timeout``, 10 s like websockets and the
  openai SDK), then T turns on each;
- ``idle`` (opt-in): many mostly idle connections held for a while: memory and idle CPU,
  then one turn on every one of them;
- ``http_load``: fresh connects and ``/healthz`` while concurrent HTTP clients (the runner's
  ``http-full`` loops, until stopped) send ~75k-token stateless requests (the gateway hands
  HTTP work to session hosts).

A connect is not retried here (the runner's ``connect_attempts=1``): a refusal is what these
phases measure, counted by type.  Server CPU per admitted connection is split by process:
the gateway (accept, peek, handoff) and the session hosts (WebSocket handshake, session
set-up).  Prints a summary, writes JSON and a PNG (connect latency against arrival rate;
memory against connections).  docs/admission.md has the results and the fd limits the large
phases need.
"""

from __future__ import annotations

import argparse
import resource
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import admission_report as report
from .. import results
from .. import workload as wl
from ..processes import actor_pids, cpu_by_pid, session_host_pids, uss_mb
from ..runner import LoadRun, LoadSpec, start_local
from ..stats import pct

PHASES = ("warm", "burst", "ramp", "idle", "http_load")
# one short create (``emu-fast``, no instructions or tools, no tool call, 8 tokens of text)
SHORT = wl.Workload(
    tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=1, text_tokens=8, tool_output_tokens=1
)
DEADLINE_S = 900.0  # a phase's runs stop by then whatever happens (the runner's deadline)
WARM_GAP_S = 0.02  # between the warm phase's connects (each ~2-10 ms: one at a time)
PROBE_GAP_S = 0.1  # between the http_load probe's connects
POLL_S = 0.1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=None,
        help="a running server's base URL, http://host:port (default: start an embedded one)",
    )
    p.add_argument("--config", type=Path, default=None, help="server config file for the embedded server")
    p.add_argument(
        "--phases",
        default="warm,ramp,burst,http_load",
        help=f"comma-separated, from {','.join(PHASES)} (idle is heavy: opt in)",
    )
    p.add_argument("--burst", type=int, default=1000, help="connections opened at once")
    p.add_argument("--burst-turns", type=int, default=5, help="turns on each burst connection")
    p.add_argument("--open-timeout", type=float, default=10.0, help="client open timeout in the burst (s)")
    p.add_argument("--rates", default="200", help="ramp arrival rates (connections/s), comma-separated")
    p.add_argument("--ramp", type=int, default=2000, help="connections per ramp")
    p.add_argument(
        "--ramp-create",
        action="store_true",
        help="ramp: each connection sends one short create as it opens (its turn timed beside the connect)",
    )
    p.add_argument("--idle", type=int, default=5000, help="connections held in the idle phase")
    p.add_argument("--idle-s", type=float, default=30.0, help="how long the idle connections are held")
    p.add_argument("--idle-rate", type=float, default=500.0, help="idle phase: connections opened per second")
    p.add_argument(
        "--idle-clients",
        type=int,
        default=1,
        help="idle phase: client processes sharing the connections (each has its own open-file limit)",
    )
    p.add_argument("--warm-connects", type=int, default=50, help="sequential connects in the warm phase")
    p.add_argument("--http-clients", type=int, default=4, help="concurrent HTTP clients in http_load")
    p.add_argument("--http-tokens", type=int, default=75_000, help="approximate tokens per HTTP request")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="run against a simulated cluster on this machine (head + 2 session nodes + an "
        "accelerator node, configs/serve-cluster.yaml): the storm spreads over both gateways",
    )
    p.add_argument("--port", type=int, default=8799, help="--cluster: the port both gateways share")
    p.add_argument("--out", type=Path, default=Path("results/admission.json"))


# ----------------------------------------------------------------------------- measuring


@dataclass
class ServerMeter:
    """USS and CPU of the session hosts and the gateway; a set of processes that changes
    between samples is counted as it is at each (new hosts count from zero)."""

    enabled: bool

    def sample(self) -> dict[str, Any]:
        if not self.enabled:
            return {}
        hosts, gateways = session_host_pids(), actor_pids(":Gateway")
        host_cpu, gateway_cpu = cpu_by_pid(hosts), cpu_by_pid(gateways)
        return {
            "hosts": len(hosts),
            "hosts_uss_mb": uss_mb(hosts),
            "gateway_uss_mb": uss_mb(gateways),
            "host_cpu": host_cpu,
            "hosts_cpu_s": sum(host_cpu.values()),
            "gateway_cpu_s": sum(gateway_cpu.values()),
            "t": time.perf_counter(),
        }


def delta(after: dict, before: dict, n: int) -> dict[str, Any]:
    if not after or not before or n <= 0:
        return {}
    mem = (after["hosts_uss_mb"] + after["gateway_uss_mb"]) - (
        before["hosts_uss_mb"] + before["gateway_uss_mb"]
    )
    # CPU of hosts live at both samples is admission work; hosts that appeared in between
    # count separately (their start-up and warm-up: scaling out, not admitting).
    old = {pid: cpu for pid, cpu in after["host_cpu"].items() if pid in before["host_cpu"]}
    new = {pid: cpu for pid, cpu in after["host_cpu"].items() if pid not in before["host_cpu"]}
    return {
        "connections": n,
        "hosts_before": before["hosts"],
        "hosts_after": after["hosts"],
        "existing_hosts_cpu_ms_per_conn": sum(old[p] - before["host_cpu"][p] for p in old) * 1000 / n,
        "new_hosts_cpu_s": sum(new.values()),
        "server_mib_per_conn": mem / n,
        "hosts_mib_per_conn": (after["hosts_uss_mb"] - before["hosts_uss_mb"]) / n,
        "gateway_mib_per_conn": (after["gateway_uss_mb"] - before["gateway_uss_mb"]) / n,
        "gateway_cpu_ms_per_conn": (after["gateway_cpu_s"] - before["gateway_cpu_s"]) * 1000 / n,
        "hosts_cpu_ms_per_conn": (after["hosts_cpu_s"] - before["hosts_cpu_s"]) * 1000 / n,
    }


CLIENT_OPEN_FILES = 65536


def raise_open_files(wanted: int = CLIENT_OPEN_FILES) -> int:
    """Raise this client process's open-file limit (its sockets) towards ``wanted``: the hard
    limit too where the process may, else the soft one up to the hard; the soft limit after.
    The server raises its own (``session.open_files``, docs/scaling.md)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = hard == resource.RLIM_INFINITY
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard if unlimited else max(hard, wanted)))
        except (ValueError, OSError):  # may not raise the hard limit: up to it
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(wanted, hard)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        resp.read()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- phases


def arrivals(
    url: str,
    n: int,
    *,
    rate: float | None,
    open_timeout: float,
    create_turns: int = 0,
    hold: bool = True,
) -> LoadSpec:
    """``n`` connections arriving at ``rate`` a second (None: all at once), none retried,
    each sending ``create_turns`` short creates as it opens, then held (or closed)."""
    return LoadSpec(
        targets=(url,),
        loops=n,
        custom_workload=SHORT,
        arrivals=True,
        ramp_s=n / rate if rate else 0.0,
        rollouts_per_loop=create_turns,
        hold=hold,
        open_timeout_s=open_timeout,
        connect_attempts=1,
        duration_s=DEADLINE_S,
        warmup_s=0.0,
    )


def arrived(run: LoadRun, every: Callable[[], None] | None = None, period_s: float = POLL_S) -> None:
    """Until every connection of ``run`` arrived (and its creates were answered): ``every``
    each ``period_s`` meanwhile.  Bounded by the run's deadline."""
    while run.running() and time.time() < run.deadline:
        time.sleep(period_s)
        if every is not None:
            every()


def turns_on_held(run: LoadRun, turns: int) -> tuple[int, float]:
    """``turns`` turns on every held connection at once: (connections held, wall seconds)."""
    held = run.opened()
    t0 = time.perf_counter()
    run.held_turns(turns)
    return held, time.perf_counter() - t0


def warm_phase(url: str, n: int) -> dict[str, Any]:
    """Connects to a warm, idle server, one every :data:`WARM_GAP_S`, each closed at once."""
    with start_local(arrivals(url, n, rate=1 / WARM_GAP_S, open_timeout=10.0, hold=False)) as run:
        arrived(run)
        result = run.stop()
    return report.connects(result)


def burst_phase(url: str, args, meter: ServerMeter, progress) -> dict[str, Any]:
    before = meter.sample()
    with start_local(arrivals(url, args.burst, rate=None, open_timeout=args.open_timeout)) as run:
        arrived(run, lambda: progress(run.opened()))
        after_open = meter.sample()
        held, wall = turns_on_held(run, args.burst_turns)
        result = run.stop()
    out = {
        "connections": args.burst,
        **report.connects(result),
        "admission": delta(after_open, before, len(result.connects)),
        "turns": report.held_turns(result.records, args.burst_turns * held, wall),
    }
    return out


def ramp_phase(
    url: str, rate: float, args, meter: ServerMeter, progress, on_held: Any = None
) -> dict[str, Any]:
    time.sleep(2.0)  # let the previous phase's connections finish closing
    before = meter.sample()
    curve: list[tuple[int, float]] = []
    create = int(getattr(args, "ramp_create", False))
    spec = arrivals(url, args.ramp, rate=rate, open_timeout=30.0, create_turns=create)
    with start_local(spec) as run:

        def sample() -> None:  # (connections open, server MiB added) about once a second
            n = run.opened()
            progress(n)
            if before:
                now = meter.sample()
                curve.append(
                    (
                        n,
                        (now["hosts_uss_mb"] + now["gateway_uss_mb"])
                        - (before["hosts_uss_mb"] + before["gateway_uss_mb"]),
                    )
                )

        arrived(run, sample, period_s=1.0)
        time.sleep(1.0)
        held_sample = meter.sample()
        placement = on_held() if on_held is not None else None  # simulated cluster: per node role
        held, wall = turns_on_held(run, 1)
        after_turn = meter.sample()
        result = run.stop()
    out: dict[str, Any] = {
        "rate": rate,
        "connections": args.ramp,
        **report.connects(result),
        "held": delta(held_sample, before, len(result.connects)),
        "memory_curve": curve,
    }
    if placement is not None:
        out["placement"] = placement
    out["one_turn_on_all"] = turns = report.held_turns(result.records, held, wall)
    if held_sample and after_turn:
        n = max(turns["turns_completed"], 1)
        turns["server_cpu_ms_per_turn"] = (
            (
                (after_turn["hosts_cpu_s"] + after_turn["gateway_cpu_s"])
                - (held_sample["hosts_cpu_s"] + held_sample["gateway_cpu_s"])
            )
            * 1000
            / n
        )
    return out


def idle_phase(url: str, args, meter: ServerMeter, progress) -> dict[str, Any]:
    """Many connections held idle (from ``--idle-clients`` client processes: each has its own
    open-file limit), then one turn on each."""
    time.sleep(2.0)
    before = meter.sample()
    k = max(1, args.idle_clients)
    spec = arrivals(url, args.idle, rate=args.idle_rate, open_timeout=30.0)
    with start_local(spec, processes=k) as run:
        arrived(run)
        held = run.opened()
        time.sleep(2.0)
        start = meter.sample()
        time.sleep(args.idle_s)
        end = meter.sample()
        _, wall = turns_on_held(run, 1)  # every held one still works: the turns start together
        result = run.stop()
    out: dict[str, Any] = {
        "connections": args.idle,
        "client_processes": k,
        **report.connects(result),
        "held": delta(start, before, held),
    }
    if start and end and held:
        cpu = (end["hosts_cpu_s"] + end["gateway_cpu_s"]) - (start["hosts_cpu_s"] + start["gateway_cpu_s"])
        out["idle_cpu_pct_of_a_core"] = 100 * cpu / (end["t"] - start["t"])
        out["idle_cpu_us_per_conn_per_s"] = 1e6 * cpu / (end["t"] - start["t"]) / held
    out["one_turn_on_all"] = report.held_turns(result.records, held, wall)
    progress(1)
    return out


def http_load_phase(url: str, args) -> dict[str, Any]:
    """Connect and /healthz latency, idle and while HTTP clients send large stateless requests
    (the runner's ``http-full`` loops, one request a rollout, until stopped)."""

    def probe(n: int) -> dict[str, Any]:
        health = []
        spec = arrivals(url, n, rate=1 / PROBE_GAP_S, open_timeout=10.0, hold=False)
        with start_local(spec) as run:
            time.sleep(max(0.0, run.release_at - time.time()))
            for _ in range(n):
                health.append(_get(f"{url}/healthz") * 1000)
                time.sleep(0.05)
            arrived(run)
            result = run.stop()
        c, h = sorted(ms for _, ms in result.connects), sorted(health)
        return {
            "connect_ms": {"p50": pct(c, 0.5), "p90": pct(c, 0.9)},
            "healthz_ms": {"p50": pct(h, 0.5), "p90": pct(h, 0.9)},
        }

    idle = probe(20)
    big = wl.Workload(
        tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=1, text_tokens=8,
        tool_output_tokens=1, resume_tokens=args.http_tokens,
    )  # fmt: skip
    spec = LoadSpec(
        targets=(url,), loops=args.http_clients, transport="http-full", custom_workload=big,
        duration_s=DEADLINE_S, warmup_s=0.0,
    )  # fmt: skip
    with start_local(spec) as load:
        time.sleep(max(0.0, load.release_at - time.time()) + 2.0)
        loaded = probe(20)
        result = load.stop()
    return {
        "http_clients": args.http_clients,
        "http_tokens": args.http_tokens,
        "http_requests": sum(r.ok for r in result.records),
        "http_failures": report.failures(result.records),
        "idle": idle,
        "under_http_load": loaded,
    }


# ----------------------------------------------------------------------------- the command


def measure(url: str, args, meter: ServerMeter, on_held: Any = None) -> dict[str, Any]:
    from rich.progress import Progress

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases: {sorted(unknown)}")
    result: dict[str, Any] = {}
    with Progress(transient=True) as bar:
        if "warm" in phases:
            result["warm"] = warm_phase(url, args.warm_connects)
        if "ramp" in phases:
            result["ramp"] = []
            for rate in [float(r) for r in args.rates.split(",")]:
                task = bar.add_task(f"ramp {args.ramp} at {rate:.0f}/s", total=args.ramp)
                result["ramp"].append(
                    ramp_phase(
                        url, rate, args, meter, lambda n, task=task: bar.update(task, completed=n), on_held
                    )
                )
        if "burst" in phases:
            task = bar.add_task(f"burst of {args.burst}", total=args.burst)
            result["burst"] = burst_phase(url, args, meter, lambda n: bar.update(task, completed=n))
        if "idle" in phases:
            task = bar.add_task(f"idle {args.idle}", total=1)
            result["idle"] = idle_phase(url, args, meter, lambda n: bar.update(task, completed=n))
        if "http_load" in phases:
            result["http_load"] = http_load_phase(url, args)
    return result


@contextmanager
def simulated_cluster(port: int) -> Iterator[tuple[str, Any]]:
    """configs/serve-cluster.yaml on a simulated cluster (one gateway per session node, both
    on ``port``), with a SQLite store in /tmp; yields the URL and the cluster."""
    from serve.embedded import wait_ready

    from ..cluster import SERVE_CLUSTER_CONFIG, SimulatedCluster, deploy_serve_config

    def edit(a: dict) -> None:
        a["server"]["port"] = port
        a["server"]["gateway_replicas"] = 2  # fixed, one per simulated session node (not autoscaled)
        a["store"] = {"backend": "sqlite", "data_dir": "/tmp/responses-ws-admission"}

    cluster = SimulatedCluster(session_nodes=2, accelerator_nodes=1, accelerators_per_node=2)
    try:
        deploy_serve_config(SERVE_CLUSTER_CONFIG, edit)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout_s=120)
        time.sleep(3)  # both gateways' pools warm up
        yield url, cluster
    finally:
        cluster.shutdown()


def run(args: argparse.Namespace) -> int:
    from serve.embedded import embedded_server, local_config

    raise_open_files()  # the clients' sockets
    config = None if args.url or args.cluster else local_config(args.config)
    started = time.perf_counter()
    if args.cluster:
        with simulated_cluster(args.port) as (url, cluster):
            result = measure(url, args, ServerMeter(enabled=True), on_held=cluster.placement)
    else:
        with nullcontext(args.url) if config is None else embedded_server(config, name="admission") as url:
            result = measure(url, args, ServerMeter(enabled=args.url is None))
    payload = {
        "command": args.command,
        "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "cluster": "head + 2 session nodes + 1 accelerator node on one machine" if args.cluster else None,
        "server": None
        if config is None
        else config.session.model_dump(
            include={
                "connections_per_actor",
                "max_connections_per_actor",
                "warm_actors",
                "max_actors",
                "max_starting_actors",
                "admission_wait_s",
            }
        ),
        "wall_s": time.perf_counter() - started,
        **result,
    }
    results.write(args.out, payload, args.run)
    png = args.out.with_suffix(".png")
    report.plot(result, png)
    report.print_summary(result)
    print(f"wrote {args.out} and {png}")
    failed = any(p.get("failures") for p in [result.get("burst", {}), *result.get("ramp", [])])
    return 1 if failed else 0
