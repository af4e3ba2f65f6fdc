"""Admission at scale: bursts, arrival ramps, held connections, memory and CPU per connection.

Against an embedded server on the default configuration (or ``--url``, or ``--cluster``),
from one client process on the same machine, in this order:

- ``warm``: sequential connects to a warm, idle server;
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
- ``http_load``: a fresh connect and ``/healthz`` while concurrent HTTP clients send
  ~75k-token stateless requests (the gateway hands HTTP work to session hosts).

Server CPU per admitted connection is split by process: the gateway (accept, peek, handoff)
and the session hosts (WebSocket handshake, session set-up).  Prints a summary, writes JSON
and a PNG (connect latency against arrival rate; memory against connections).
docs/scaling.md has the results and the fd limits the large phases need.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

from .. import plotting, results
from ..client import ResponsesSocket, connect
from ..processes import actor_pids, cpu_by_pid, session_host_pids, uss_mb
from ..stats import pct

SHORT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "8"}
PHASES = ("warm", "burst", "ramp", "idle", "http_load")


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


@dataclass
class Opened:
    sockets: list[ResponsesSocket] = field(default_factory=list)
    connect_s: list[float] = field(default_factory=list)
    started_s: list[float] = field(default_factory=list)  # each connect's start (perf_counter)
    failures: dict[str, int] = field(default_factory=dict)
    turn_s: list[float] = field(default_factory=list)  # the create sent on open (``--ramp-create``)
    turn_failures: dict[str, int] = field(default_factory=dict)

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, websockets.InvalidStatus):
            kind = f"http {exc.response.status_code}"
        elif isinstance(exc, TimeoutError):
            kind = "open timeout"
        else:
            kind = type(exc).__name__
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def summary(self) -> dict[str, Any]:
        ms = sorted(s * 1000 for s in self.connect_s)
        return {
            "opened": len(self.connect_s),
            "failures": self.failures,
            "connect_ms": {
                "p50": pct(ms, 0.5),
                "p90": pct(ms, 0.9),
                "p99": pct(ms, 0.99),
                "max": ms[-1] if ms else None,
            },
            "per_second": per_second(self.started_s, self.connect_s),
            **({"create_on_open": self.turns()} if self.turn_s or self.turn_failures else {}),
        }

    def turns(self) -> dict[str, Any]:
        """The creates sent as the connections opened: completed, failures by cause, and the
        turn's time (create sent to its terminal event) percentiles."""
        ms = sorted(s * 1000 for s in self.turn_s)
        return {
            "completed": len(ms),
            "failures": self.turn_failures,
            "turn_ms": {
                "p50": pct(ms, 0.5),
                "p90": pct(ms, 0.9),
                "p99": pct(ms, 0.99),
                "max": ms[-1] if ms else None,
            },
        }


def per_second(started: list[float], took: list[float]) -> list[list[float]]:
    """[second of the arrival, connects started in it, their p50 ms, their max ms] for each
    second from the first start: where in a ramp the slow connects were (a host starting)."""
    if not started:
        return []
    t0 = min(started)
    bins: dict[int, list[float]] = {}
    for t, s in zip(started, took):
        bins.setdefault(int(t - t0), []).append(s * 1000)
    return [
        [sec, len(v), round(pct(sorted(v), 0.5) or 0.0, 1), round(max(v), 1)]
        for sec, v in sorted(bins.items())
    ]


async def open_one(url: str, opened: Opened, open_timeout: float, create: bool = False) -> None:
    """Open one connection (``create``: and send one short create as soon as it is open)."""
    t0 = time.perf_counter()
    try:
        sock = await connect(url, open_timeout=open_timeout)
    except Exception as exc:  # noqa: BLE001 - counted by kind
        opened.fail(exc)
        return
    opened.connect_s.append(time.perf_counter() - t0)
    opened.started_s.append(t0)
    opened.sockets.append(sock)
    if create:
        failed, took = await one_turn(sock)
        if failed is None:
            opened.turn_s.append(took)
        else:
            opened.turn_failures[failed] = opened.turn_failures.get(failed, 0) + 1


async def _memory_curve(meter: ServerMeter, before: dict, opened: Opened, curve: list) -> None:
    """(connections open, server MiB added) about once a second while a ramp runs."""
    if not before:
        return
    while True:
        await asyncio.sleep(1.0)
        now = await asyncio.to_thread(meter.sample)
        added = (now["hosts_uss_mb"] + now["gateway_uss_mb"]) - (
            before["hosts_uss_mb"] + before["gateway_uss_mb"]
        )
        curve.append((len(opened.sockets), added))


async def open_many(
    url: str,
    n: int,
    *,
    rate: float | None,
    open_timeout: float,
    progress=None,
    into: Opened | None = None,
    create: bool = False,
) -> Opened:
    """``n`` connections, all at once (``rate`` None) or arriving at ``rate`` per second;
    ``create``: each sends one short create as it opens."""
    opened = into if into is not None else Opened()
    tasks = []
    start = time.perf_counter()
    for i in range(n):
        if rate:
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(open_one(url, opened, open_timeout, create)))
        if progress is not None:
            tasks[-1].add_done_callback(lambda _: progress())
    await asyncio.gather(*tasks)
    return opened


def failure_kind(exc: BaseException) -> str:
    """A failed turn's cause, as counted: the close's code and reason, or the exception's type."""
    if isinstance(exc, websockets.ConnectionClosed):
        rcvd, sent = exc.rcvd, exc.sent
        by = "server" if rcvd is not None and (sent is None or exc.rcvd_then_sent) else "client"
        frame = rcvd if by == "server" else sent
        if frame is None:
            return "closed without a close frame"
        return f"closed by {by}: {frame.code} {frame.reason}".strip()
    return type(exc).__name__


async def one_turn(sock: ResponsesSocket) -> tuple[str | None, float]:
    """One short turn: (None, its time) if it completed, else (why, the time to the failure)."""
    t0 = time.perf_counter()
    try:
        answer = await sock.create(model="emu-fast", input="hi", store=False, metadata=SHORT)
    except Exception as exc:  # noqa: BLE001 - a closed socket counts as a failed turn, by cause
        return failure_kind(exc), time.perf_counter() - t0
    last = answer.last or {}
    if last.get("type") == "response.completed":
        return None, time.perf_counter() - t0
    error = (last.get("error") or (last.get("response") or {}).get("error") or {}).get("code")
    return f"{last.get('type')}: {error}", time.perf_counter() - t0


async def turns_on_all(sockets: list[ResponsesSocket], turns: int) -> dict[str, Any]:
    failures: dict[str, int] = {}

    async def chain(sock: ResponsesSocket) -> tuple[int, list[float]]:
        done, times = 0, []
        for _ in range(turns):
            failed, s = await one_turn(sock)
            times.append(s)
            if failed is not None:
                failures[failed] = failures.get(failed, 0) + 1
                break
            done += 1
        return done, times

    t0 = time.perf_counter()
    chains = await asyncio.gather(*(chain(s) for s in sockets))
    wall = time.perf_counter() - t0
    ms = sorted(t * 1000 for _, ts in chains for t in ts)
    return {
        "turns_completed": sum(d for d, _ in chains),
        "turns_wanted": turns * len(sockets),
        "failures": failures,
        "wall_s": wall,
        "turns_per_s": sum(d for d, _ in chains) / wall if wall else None,
        "turn_ms": {"p50": pct(ms, 0.5), "p99": pct(ms, 0.99)},
        "all_ms": ms,
    }


def merge_turns(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One :func:`turns_on_all` result from those of several client processes (run at once)."""
    ms = sorted(t for p in parts for t in p["all_ms"])
    failures: dict[str, int] = {}
    for p in parts:
        for kind, n in p["failures"].items():
            failures[kind] = failures.get(kind, 0) + n
    done, wall = sum(p["turns_completed"] for p in parts), max(p["wall_s"] for p in parts)
    return {
        "turns_completed": done,
        "turns_wanted": sum(p["turns_wanted"] for p in parts),
        "failures": failures,
        "wall_s": wall,
        "turns_per_s": done / wall if wall else None,
        "turn_ms": {"p50": pct(ms, 0.5), "p99": pct(ms, 0.99)},
    }


async def close_all(sockets: list[ResponsesSocket]) -> None:
    await asyncio.gather(*(s.close() for s in sockets), return_exceptions=True)


# ----------------------------------------------------------------------------- phases


async def warm_phase(url: str, n: int) -> dict[str, Any]:
    """Sequential connects to a warm, idle server (each closed before the next)."""
    opened = Opened()
    for _ in range(n):
        await open_one(url, opened, 10.0)
        if opened.sockets:
            await opened.sockets.pop().close()
    return {**opened.summary(), "opened": len(opened.connect_s)}


async def burst_phase(url: str, args, meter: ServerMeter, progress) -> dict[str, Any]:
    before = meter.sample()
    opened = await open_many(url, args.burst, rate=None, open_timeout=args.open_timeout, progress=progress)
    after_open = meter.sample()
    out = {
        "connections": args.burst,
        **opened.summary(),
        "admission": delta(after_open, before, len(opened.sockets)),
    }
    out["turns"] = await turns_on_all(opened.sockets, args.burst_turns)
    del out["turns"]["all_ms"]
    await close_all(opened.sockets)
    return out


async def ramp_phase(
    url: str, rate: float, args, meter: ServerMeter, progress, on_held: Any = None
) -> dict[str, Any]:
    await asyncio.sleep(2.0)  # let the previous phase's connections finish closing
    before = meter.sample()
    curve: list[tuple[int, float]] = []
    opened = Opened()
    sampling = asyncio.create_task(_memory_curve(meter, before, opened, curve))
    create = getattr(args, "ramp_create", False)
    opened = await open_many(
        url, args.ramp, rate=rate, open_timeout=30.0, progress=progress, into=opened, create=create
    )
    await asyncio.sleep(1.0)
    sampling.cancel()
    held = meter.sample()
    out = {
        "rate": rate,
        "connections": args.ramp,
        **opened.summary(),
        "held": delta(held, before, len(opened.sockets)),
        "memory_curve": curve,
    }
    if on_held is not None:  # where the hosts holding them run (simulated cluster: per node role)
        out["placement"] = on_held()
    out["one_turn_on_all"] = await turns_on_all(opened.sockets, 1)
    del out["one_turn_on_all"]["all_ms"]  # the percentiles are kept
    after_turn = meter.sample()
    if held and after_turn:
        n = max(out["one_turn_on_all"]["turns_completed"], 1)
        out["one_turn_on_all"]["server_cpu_ms_per_turn"] = (
            (
                (after_turn["hosts_cpu_s"] + after_turn["gateway_cpu_s"])
                - (held["hosts_cpu_s"] + held["gateway_cpu_s"])
            )
            * 1000
            / n
        )
    await close_all(opened.sockets)
    return out


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


def _idle_client(url: str, n: int, rate: float, conn: Any) -> None:
    """A client process of the idle phase: open ``n`` at ``rate``/s, say so, hold them; on
    the word, one turn on each; on the next, close them."""
    raise_open_files()

    async def main() -> None:
        opened = await open_many(url, n, rate=rate, open_timeout=30.0)
        conn.send((opened.connect_s, opened.started_s, opened.failures))
        await asyncio.to_thread(conn.recv)
        conn.send(await turns_on_all(opened.sockets, 1))
        await asyncio.to_thread(conn.recv)
        await close_all(opened.sockets)

    asyncio.run(main())
    conn.send("closed")


async def idle_phase(url: str, args, meter: ServerMeter, progress) -> dict[str, Any]:
    """Many connections held idle (from ``--idle-clients`` processes: each has its own
    open-file limit), then one turn on each."""
    await asyncio.sleep(2.0)
    before = meter.sample()
    k = max(1, args.idle_clients)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for i in range(k):
        parent, child = ctx.Pipe()
        share = args.idle // k + (i < args.idle % k)
        proc = ctx.Process(target=_idle_client, args=(url, share, args.idle_rate / k, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    opened = Opened()
    try:
        for p in pipes:
            connect_s, started_s, failures = await asyncio.to_thread(p.recv)
            opened.connect_s += connect_s
            opened.started_s += started_s
            for kind, n in failures.items():
                opened.failures[kind] = opened.failures.get(kind, 0) + n
        held = len(opened.connect_s)
        await asyncio.sleep(2.0)
        start = meter.sample()
        await asyncio.sleep(args.idle_s)
        end = meter.sample()
        out = {
            "connections": args.idle,
            "client_processes": k,
            **opened.summary(),
            "held": delta(start, before, held),
        }
        if start and end and held:
            cpu = (end["hosts_cpu_s"] + end["gateway_cpu_s"]) - (
                start["hosts_cpu_s"] + start["gateway_cpu_s"]
            )
            out["idle_cpu_pct_of_a_core"] = 100 * cpu / (end["t"] - start["t"])
            out["idle_cpu_us_per_conn_per_s"] = 1e6 * cpu / (end["t"] - start["t"]) / held
        for p in pipes:  # every held one still works: the turns start together
            p.send("turn")
        out["one_turn_on_all"] = merge_turns([await asyncio.to_thread(p.recv) for p in pipes])
        for p in pipes:
            p.send("close")
        for p in pipes:
            await asyncio.to_thread(p.recv)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
    progress()
    return out


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        resp.read()
    return time.perf_counter() - t0


async def http_load_phase(url: str, args) -> dict[str, Any]:
    """Connect and /healthz latency, idle and while HTTP clients send large stateless requests."""
    import httpx

    words = " ".join(f"word{i % 997}" for i in range(int(args.http_tokens / 2.2)))
    body = {
        "model": "emu-fast",
        "input": [{"role": "user", "content": words}],
        "store": False,
        "metadata": SHORT,
    }

    async def probe(n: int) -> dict[str, Any]:
        connects, health = [], []
        for _ in range(n):
            opened = Opened()
            await open_one(url, opened, 10.0)
            connects += opened.connect_s
            await close_all(opened.sockets)
            health.append(await asyncio.to_thread(_get, f"{url}/healthz"))
            await asyncio.sleep(0.05)
        c, h = sorted(s * 1000 for s in connects), sorted(s * 1000 for s in health)
        return {
            "connect_ms": {"p50": pct(c, 0.5), "p90": pct(c, 0.9)},
            "healthz_ms": {"p50": pct(h, 0.5), "p90": pct(h, 0.9)},
        }

    idle = await probe(20)
    stop = asyncio.Event()
    requests = 0

    async def client() -> None:
        nonlocal requests
        async with httpx.AsyncClient(timeout=120) as http:
            while not stop.is_set():
                r = await http.post(f"{url}/v1/responses", json=body)
                r.raise_for_status()
                requests += 1

    clients = [asyncio.create_task(client()) for _ in range(args.http_clients)]
    await asyncio.sleep(2.0)
    loaded = await probe(20)
    stop.set()
    await asyncio.gather(*clients, return_exceptions=True)
    return {
        "http_clients": args.http_clients,
        "http_tokens": args.http_tokens,
        "http_requests": requests,
        "idle": idle,
        "under_http_load": loaded,
    }


# ----------------------------------------------------------------------------- the command


def _plot(result: dict, path: Path) -> None:
    ramps = result.get("ramp", [])
    fig, (ax1, ax2) = plotting.pyplot().subplots(1, 2, figsize=(11, 4))
    if ramps:
        rates = [r["rate"] for r in ramps]
        for q in ("p50", "p90", "p99"):
            ax1.plot(rates, [r["connect_ms"][q] for r in ramps], marker="o", label=q)
        ax1.set_xlabel("arrival rate (connections/s)")
        ax1.set_ylabel("connect latency (ms)")
        ax1.set_yscale("log")
        ax1.legend()
        ax1.set_title("connect latency vs arrival rate")
    curves = [(r["rate"], r["memory_curve"]) for r in ramps if r.get("memory_curve")]
    for rate, curve in curves[:1]:  # the first ramp starts from the freshest server
        xs, ys = zip(*curve)
        ax2.plot(xs, ys, marker=".", label=f"ramp at {rate:.0f}/s")
        ax2.set_xlabel("connections open")
        ax2.set_ylabel("server private memory added (MiB)")
        ax2.legend()
        ax2.set_title("memory vs connections")
    plotting.save(fig, path)


def _print_summary(result: dict) -> None:
    from rich.console import Console

    c = Console(width=110)
    if "warm" in result:
        c.print(
            f"warm, idle server: connect p50 {result['warm']['connect_ms']['p50']:.1f} ms "
            f"(p90 {result['warm']['connect_ms']['p90']:.1f})"
        )
    if "burst" in result:
        b = result["burst"]
        t = b["turns"]
        c.print(
            f"burst {b['connections']}: opened {b['opened']}, failures {b['failures'] or 'none'}, connect p50 "
            f"{b['connect_ms']['p50']:.0f} / p99 {b['connect_ms']['p99']:.0f} ms; turns {t['turns_completed']}/"
            f"{t['turns_wanted']} in {t['wall_s']:.1f} s"
        )
    for r in result.get("ramp", []):
        h, t = r.get("held", {}), r["one_turn_on_all"]
        c.print(
            f"ramp {r['connections']} at {r['rate']:.0f}/s: opened {r['opened']}, failures {r['failures'] or 'none'}, "
            f"connect p50 {r['connect_ms']['p50']:.1f} / p99 {r['connect_ms']['p99']:.1f} ms; "
            + (
                f"{h['server_mib_per_conn']:.2f} MiB/conn held ({h['hosts_before']}→{h['hosts_after']} hosts), "
                f"CPU per conn: gateway {h['gateway_cpu_ms_per_conn']:.2f} + hosts {h['existing_hosts_cpu_ms_per_conn']:.2f} ms "
                f"(+ {h['new_hosts_cpu_s']:.1f} s starting hosts); "
                if h
                else ""
            )
            + f"one turn on all: {t['turns_completed']}/{t['turns_wanted']} in {t['wall_s']:.1f} s"
            + (f" (failed: {t['failures']})" if t.get("failures") else "")
        )
        if "create_on_open" in r:
            o = r["create_on_open"]
            c.print(
                f"  the create sent on open: {o['completed']} completed, failures {o['failures'] or 'none'}, "
                f"turn p50 {o['turn_ms']['p50']:.1f} / p99 {o['turn_ms']['p99']:.1f} ms"
            )
        c.print(
            "  per second of the ramp (connects started, p50 / max ms): "
            + " ".join(f"{sec}:{n} {p50:.0f}/{mx:.0f}" for sec, n, p50, mx in r.get("per_second", []))
        )
    if "idle" in result:
        i = result["idle"]
        h = i.get("held", {})
        c.print(
            f"idle {i['connections']}: opened {i['opened']}, failures {i['failures'] or 'none'}; "
            + (
                f"{h['server_mib_per_conn']:.2f} MiB/conn, idle CPU {i.get('idle_cpu_pct_of_a_core', 0):.1f}% of a core "
                f"({i.get('idle_cpu_us_per_conn_per_s', 0):.1f} µs/conn/s)"
                if h
                else ""
            )
            + (
                f"; one turn on all: {i['one_turn_on_all']['turns_completed']}/{i['one_turn_on_all']['turns_wanted']} "
                f"in {i['one_turn_on_all']['wall_s']:.1f} s (failed: {i['one_turn_on_all']['failures'] or 'none'})"
                if "one_turn_on_all" in i
                else ""
            )
        )
    if "http_load" in result:
        hl = result["http_load"]
        c.print(
            f"under {hl['http_clients']} HTTP clients (~{hl['http_tokens'] // 1000}k tokens, {hl['http_requests']} requests): "
            f"connect p50 {hl['idle']['connect_ms']['p50']:.1f} → {hl['under_http_load']['connect_ms']['p50']:.1f} ms, "
            f"/healthz p50 {hl['idle']['healthz_ms']['p50']:.1f} → {hl['under_http_load']['healthz_ms']['p50']:.1f} ms"
        )


async def _measure(url: str, args, meter: ServerMeter, on_held: Any = None) -> dict[str, Any]:
    from rich.progress import Progress

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases: {sorted(unknown)}")
    result: dict[str, Any] = {}
    with Progress(transient=True) as bar:
        if "warm" in phases:
            result["warm"] = await warm_phase(url, args.warm_connects)
        if "ramp" in phases:
            result["ramp"] = []
            for rate in [float(r) for r in args.rates.split(",")]:
                task = bar.add_task(f"ramp {args.ramp} at {rate:.0f}/s", total=args.ramp)
                result["ramp"].append(
                    await ramp_phase(url, rate, args, meter, lambda task=task: bar.advance(task), on_held)
                )
        if "burst" in phases:
            task = bar.add_task(f"burst of {args.burst}", total=args.burst)
            result["burst"] = await burst_phase(url, args, meter, lambda: bar.advance(task))
        if "idle" in phases:
            task = bar.add_task(f"idle {args.idle}", total=1)
            result["idle"] = await idle_phase(url, args, meter, lambda: bar.advance(task))
        if "http_load" in phases:
            result["http_load"] = await http_load_phase(url, args)
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
            result = asyncio.run(_measure(url, args, ServerMeter(enabled=True), on_held=cluster.placement))
    else:
        with nullcontext(args.url) if config is None else embedded_server(config, name="admission") as url:
            result = asyncio.run(_measure(url, args, ServerMeter(enabled=args.url is None)))
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
    _plot(result, png)
    _print_summary(result)
    print(f"wrote {args.out} and {png}")
    failed = any(p.get("failures") for p in [result.get("burst", {}), *result.get("ramp", [])])
    return 1 if failed else 0
