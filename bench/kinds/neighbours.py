"""Noisy neighbours on a packed host: how much a turn on an open socket slows while others load the server.

    responses-ws bench neighbours [--rounds 3] [--probe-turns 100] [--http-clients 4] [--http-tokens 75000]
                                  [--sockets 32] [--bursts 4] [--config FILE] [--url URL] [--py-spy DIR]
                                  [--out results/neighbours.json]

One probe WebSocket does small turns (``--probe-model``, a short input, ``--probe-output-tokens``
tokens, ``store:false``, chained with ``previous_response_id``), each timed from the client:
create sent → terminal event read.  Every round measures the probe in three phases, in turn:

- ``idle``: nothing else runs;
- ``http``: ``--http-clients`` HTTP clients (keep-alive, as SDKs are) send ~``--http-tokens``-token
  stateless requests (``store:false``) back to back; the probe's turns start after
  ``--http-warmup-s``;
- ``burst``: ``--sockets`` fresh WebSockets send a resumed first turn at the same moment: the
  ``codex`` preset's instructions and tools, a task, and ``previous_response_id`` of a stored
  ~60k-token response another connection wrote before the run — the host loads the record and
  rebuilds (parses, renders, classifies) the whole history.  ``--bursts`` bursts a round; the
  probe turns that start and end within a burst (go → the last terminal event) count.

The neighbours run in a process of their own, so the probe's client loop does nothing else (the
machine's cores are still shared).  Printed and saved: the probe's p50 (p90) per phase and its
ratio to idle (the target is ≤ 1.5×, docs/performance.md), its non-model time (turn − the
server-reported queue + prefill + decode), the neighbours' own numbers, and — with an embedded
server — the CPU seconds each server process used in each phase.  ``--py-spy DIR`` records each
session host with py-spy (``--threads --nonblocking``, raw collapsed stacks) during every
loaded phase, and the inference replica with them.  Every probe turn is saved too
(``probe_turns``: seconds into the phase, total, model, ``api_overhead`` and ``backend`` ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.embedded import APP_NAME, embedded_server, local_config

from .. import results
from .. import workload as wl
from ..client import ResponsesSocket, connect
from ..conversation import TIMINGS_KEY, model_seconds, server_timings
from ..stats import mean, median, spread

PROBE_KEY = "sk-bench-probe"
NEIGHBOUR_KEY = "sk-bench-neighbour"  # a prefix-cache scope of its own: neighbours never evict the probe's
PHASES = ("idle", "http", "burst")
SERVER_PHASES = ("parse_validate", "history_load", "render", "classify", "api_overhead")
TARGET = 1.5  # the probe's p50 under load over its idle p50, at most (docs/performance.md)


# ---------------------------------------------------------------------------------- the probe
@dataclass
class ProbeTurn:
    started: float  # perf_counter (CLOCK_MONOTONIC: comparable with the neighbours' process)
    total_ms: float
    model_ms: float | None  # server-reported queue + prefill + decode
    api_overhead_ms: float | None
    backend_ms: float | None = None  # of api_overhead: the model call beyond the model's time (the Serve hop)

    @property
    def ended(self) -> float:
        return self.started + self.total_ms / 1000.0

    @property
    def nonmodel_ms(self) -> float | None:
        return None if self.model_ms is None else self.total_ms - self.model_ms


class Probe:
    """The open socket whose turns are measured: one lane, each turn continuing the last."""

    def __init__(self, sock: ResponsesSocket, model: str, output_tokens: int) -> None:
        self.sock = sock
        self.body = {
            "model": model,
            "input": "ping",
            "store": False,
            "max_output_tokens": output_tokens,
            "metadata": {
                TIMINGS_KEY: "1",
                "emulator.tool_rounds": "0",
                "emulator.text_tokens": str(output_tokens),
            },
        }
        self.prev: str | None = None

    async def turn(self) -> ProbeTurn:
        answer = await self.sock.create(**self.body, previous_response_id=self.prev)
        response = answer.response
        if response is None:
            raise RuntimeError(f"a probe turn failed: {answer.last}")
        self.prev = response["id"]
        timings = server_timings(response)
        model = model_seconds(timings)
        return ProbeTurn(
            answer.sent_at,
            answer.total_s * 1000.0,
            None if model is None else model * 1000.0,
            (timings or {}).get("api_overhead"),
            (timings or {}).get("backend"),
        )

    async def run(self, turns: int | None = None, stop: asyncio.Event | None = None) -> list[ProbeTurn]:
        """``turns`` turns, or turns until ``stop`` is set."""
        out: list[ProbeTurn] = []
        while (turns is None or len(out) < turns) and not (stop is not None and stop.is_set()):
            out.append(await self.turn())
        return out


# ---------------------------------------------------------------------- the neighbours' process
def http_body(tokens: int, output_tokens: int) -> bytes:
    """A stateless request of ~``tokens`` tokens (a user message of numbered words)."""
    words = " ".join(f"word{i % 997}" for i in range(int(tokens / 2.2)))
    return json.dumps(
        {
            "model": "emu-fast",
            "input": [{"role": "user", "content": words}],
            "store": False,
            "max_output_tokens": output_tokens,
            "metadata": {
                TIMINGS_KEY: "1",
                "emulator.tool_rounds": "0",
                "emulator.text_tokens": str(output_tokens),
            },
        }
    ).encode()


class HttpLoad:
    """``clients`` keep-alive HTTP clients sending the same large stateless request back to back."""

    def __init__(self, url: str, clients: int, tokens: int, output_tokens: int) -> None:
        self.url, self.clients = url, clients
        self.body = http_body(tokens, output_tokens)
        self.stop = asyncio.Event()
        self.done: list[dict[str, Any]] = []  # per request: started, ms, input tokens, server phases
        self.errors: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def _client(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {NEIGHBOUR_KEY}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=120) as http:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = await http.post(f"{self.url}/v1/responses", content=self.body, headers=headers)
                    r.raise_for_status()
                except Exception as exc:  # noqa: BLE001 - counted; the load goes on
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    await asyncio.sleep(0.1)
                    continue
                response = r.json()
                self.done.append(
                    {
                        "started": t0,
                        "ms": (time.perf_counter() - t0) * 1000.0,
                        "input_tokens": (response.get("usage") or {}).get("input_tokens", 0),
                        "server": server_timings(response) or {},
                    }
                )

    async def finish(self, since: float) -> dict[str, Any]:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        counted = [d for d in self.done if d["started"] >= since]
        return {
            "requests": len(self.done),
            "requests_measured": len(counted),
            "errors": self.errors[:5],
            "error_count": len(self.errors),
            "input_tokens": median([d["input_tokens"] for d in self.done]),
            "ms": quantiles([d["ms"] for d in counted]),
            "server_ms_median": {p: median([d["server"].get(p) for d in counted]) for p in SERVER_PHASES},
        }


async def store_histories(url: str, w: wl.Workload, count: int) -> list[str]:
    """Write ``count`` stored responses holding rollout ``r``'s resumed history (no model
    output: ``generate:false``) from one connection; their ids."""
    sock = await connect(url, api_key=NEIGHBOUR_KEY)
    ids = []
    try:
        for r in range(count):
            answer = await sock.create(**wl.fixed(w), input=wl.history(w, r), store=True, generate=False)
            if answer.response is None or answer.response.get("status") != "completed":
                raise RuntimeError(f"storing rollout {r}'s history failed: {answer.last}")
            ids.append(answer.response["id"])
    finally:
        await sock.close()
    return ids


async def resumed_first_turn(
    sock: ResponsesSocket, w: wl.Workload, rollout: int, previous: str, output_tokens: int
) -> dict[str, Any]:
    task = {"role": "user", "content": [{"type": "input_text", "text": wl.task(w, rollout)}]}
    metadata = {TIMINGS_KEY: "1", "emulator.tool_rounds": "0", "emulator.text_tokens": str(output_tokens)}
    answer = await sock.create(
        **wl.fixed(w),
        input=[task],
        previous_response_id=previous,
        store=False,
        max_output_tokens=output_tokens,
        metadata=metadata,
    )
    if answer.response is None:
        raise RuntimeError(f"rollout {rollout}'s resumed first turn failed: {answer.last}")
    types = [e.get("type") for e in answer.events]
    return {
        "created_ms": (answer.stamps[types.index("response.created")] - answer.sent_at) * 1000.0,
        "total_ms": answer.total_s * 1000.0,
        "ended": answer.stamps[-1],
        "input_tokens": (answer.response.get("usage") or {}).get("input_tokens", 0),
        "server": server_timings(answer.response) or {},
    }


async def _neighbours(url: str, conn: Any) -> None:
    """The neighbours' process: runs what the parent asks for, one command at a time."""
    loop = asyncio.get_running_loop()
    w = wl.PRESETS["codex"]
    stored: list[str] = []
    http: HttpLoad | None = None
    while True:
        cmd, arg = await loop.run_in_executor(None, conn.recv)
        if cmd == "store":
            stored = await store_histories(url, w, arg)
            conn.send(len(stored))
        elif cmd == "http":
            http = HttpLoad(url, **arg)
            http.start()
            conn.send(os.getpid())
        elif cmd == "http_stop":
            assert http is not None
            conn.send(await http.finish(arg))
            http = None
        elif cmd == "burst":
            socks = await asyncio.gather(*(connect(url, api_key=NEIGHBOUR_KEY) for _ in stored))
            conn.send("ready")
            await loop.run_in_executor(None, conn.recv)  # go
            go = time.perf_counter()
            try:
                turns = await asyncio.gather(
                    *(
                        resumed_first_turn(s, w, r, prev, arg)
                        for r, (s, prev) in enumerate(zip(socks, stored))
                    )
                )
            finally:
                await asyncio.gather(*(s.close() for s in socks), return_exceptions=True)
            conn.send({"go": go, "end": max(t["ended"] for t in turns), "turns": turns})
        else:
            conn.send(None)
            return


def _neighbours_main(url: str, conn: Any) -> None:
    asyncio.run(_neighbours(url, conn))


class Neighbours:
    """The handle on the neighbours' process (spawned, so it shares nothing with the probe)."""

    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_neighbours_main, args=(url, child), daemon=True)
        self.process.start()

    async def ask(self, cmd: str, arg: Any = None) -> Any:
        self._conn.send((cmd, arg))
        return await self.answer()

    async def answer(self) -> Any:
        while not await asyncio.to_thread(self._conn.poll, 1.0):
            if not self.process.is_alive():
                raise RuntimeError("the neighbours' process died")
        return self._conn.recv()

    def send(self, cmd: str, arg: Any = None) -> None:
        self._conn.send((cmd, arg))

    def close(self) -> None:
        try:
            self._conn.send(("quit", None))
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()


# ------------------------------------------------------------------------ server processes
class ServerCpu:
    """CPU seconds of the server's processes (session hosts one by one, the gateway, the
    inference replica) and of the neighbours' process, between two samples; empty when the
    server is not this process's (``--url``)."""

    def __init__(self, embedded: bool, neighbour_pid: int) -> None:
        self.embedded, self.neighbour_pid = embedded, neighbour_pid

    def sample(self) -> dict[str, float]:
        from ..processes import actor_pids, cpu_s, session_host_pids

        out = {"neighbours_client": cpu_s([self.neighbour_pid]), "probe_client": cpu_s([os.getpid()])}
        if self.embedded:
            out |= {f"host:{pid}": cpu_s([pid]) for pid in session_host_pids()}
            out["gateway"] = cpu_s(actor_pids(f"ServeReplica:{APP_NAME}:Gateway"))
            out["inference"] = cpu_s(actor_pids(f"ServeReplica:{APP_NAME}:InferenceDeployment"))
        return out

    @staticmethod
    def used(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, Any]:
        """Per process: CPU seconds between the samples and that as % of one core."""
        return {
            k: {
                "cpu_s": round(v - before.get(k, 0.0), 3),
                "core_pct": round(100 * (v - before.get(k, 0.0)) / wall_s, 1),
            }
            for k, v in after.items()
            if wall_s > 0
        }


class PySpy:
    """``py-spy record`` of every session host and the inference replica while a phase runs
    (``--py-spy DIR``)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.procs: list[subprocess.Popen[bytes]] = []
        beside = Path(sys.executable).with_name("py-spy")  # in this environment, if not on PATH
        self.exe = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
        if out is not None and self.exe is None:
            raise SystemExit("--py-spy needs py-spy (pip install py-spy)")

    def start(self, label: str) -> None:
        if self.out is None:
            return
        from ..processes import actor_pids, session_host_pids

        self.out.mkdir(parents=True, exist_ok=True)
        targets = [(f"host{pid}", pid) for pid in session_host_pids()]
        targets += [
            (f"inference{pid}", pid) for pid in actor_pids(f"ServeReplica:{APP_NAME}:InferenceDeployment")
        ]
        for name, pid in targets:
            self.procs.append(
                subprocess.Popen(
                    [
                        str(self.exe),
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        "200",
                        "--threads",
                        "--nonblocking",
                        "--format",
                        "raw",
                        "--output",
                        str(self.out / f"{label}-{name}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


# ------------------------------------------------------------------------------- phases
def quantiles(values: list[float]) -> dict[str, float | int | None]:
    """p50, p90, the mean and the largest (a turn that met a stall weighs in the mean and max
    but hardly in the p50: fewer turns fit while the loop stalls), and how many."""
    m = mean(values)
    return {
        **spread(values, ("p50", "p90"), 2),
        "mean": None if m is None else round(m, 2),
        **spread(values, ("max", "n"), 2),
    }


def probe_summary(turns: list[ProbeTurn]) -> dict[str, Any]:
    return {
        "turn_ms": quantiles([t.total_ms for t in turns]),
        "nonmodel_ms": quantiles([t.nonmodel_ms for t in turns if t.nonmodel_ms is not None]),
        "api_overhead_ms": median([t.api_overhead_ms for t in turns]),
    }


def ratios(phases: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each loaded phase's probe p50 over the idle phase's."""
    idle = phases.get("idle", {}).get("probe", {}).get("turn_ms", {}).get("p50")
    return {
        name: (
            round(p["probe"]["turn_ms"]["p50"] / idle, 2) if idle and p["probe"]["turn_ms"]["p50"] else None
        )
        for name, p in phases.items()
        if name != "idle"
    }


async def phase(
    name: str,
    args: argparse.Namespace,
    probe: Probe,
    neighbours: Neighbours,
    cpu: ServerCpu,
    spy: PySpy,
    label: str,
) -> tuple[dict[str, Any], list[ProbeTurn]]:
    before, t0 = await asyncio.to_thread(cpu.sample), time.perf_counter()
    out: dict[str, Any] = {}
    if name == "idle":
        turns = await probe.run(args.probe_turns)
    elif name == "http":
        await neighbours.ask(
            "http",
            {
                "clients": args.http_clients,
                "tokens": args.http_tokens,
                "output_tokens": args.neighbour_output_tokens,
            },
        )
        await asyncio.sleep(args.http_warmup_s)
        since = time.perf_counter()
        spy.start(label)
        try:
            turns = await probe.run(args.probe_turns)
        finally:
            spy.stop()
        out["neighbours"] = await neighbours.ask("http_stop", since)
    else:
        turns, bursts = [], []
        spy.start(label)
        try:
            for _ in range(args.bursts):
                assert await neighbours.ask("burst", args.neighbour_output_tokens) == "ready"
                stop = asyncio.Event()
                running = asyncio.create_task(probe.run(stop=stop))
                await asyncio.sleep(0.2)  # the probe is mid-conversation when the burst lands
                neighbours.send("go")
                burst = await neighbours.answer()
                stop.set()
                turns += [t for t in await running if t.started >= burst["go"] and t.ended <= burst["end"]]
                bursts.append(burst)
                await asyncio.sleep(0.5)
        finally:
            spy.stop()
        each = [t for b in bursts for t in b["turns"]]
        out["neighbours"] = {
            "bursts": len(bursts),
            "sockets": len(each) // max(1, len(bursts)),
            "window_ms": quantiles([(b["end"] - b["go"]) * 1000.0 for b in bursts]),
            "input_tokens": median([t["input_tokens"] for t in each]),
            "created_ms": quantiles([t["created_ms"] for t in each]),
            "total_ms": quantiles([t["total_ms"] for t in each]),
            "server_ms_median": {p: median([t["server"].get(p) for t in each]) for p in SERVER_PHASES},
        }
    wall = time.perf_counter() - t0
    out["probe"] = probe_summary(turns)
    # Every turn: seconds into the phase, total, model (server-reported), api_overhead and backend ms.
    out["probe_turns"] = [
        [
            round(t.started - t0, 3),
            round(t.total_ms, 2),
            t.model_ms and round(t.model_ms, 2),
            t.api_overhead_ms,
            t.backend_ms,
        ]
        for t in turns
    ]
    out["cpu"] = ServerCpu.used(before, await asyncio.to_thread(cpu.sample), wall)
    out["wall_s"] = round(wall, 2)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out, turns


async def measure(url: str, args: argparse.Namespace, embedded: bool) -> dict[str, Any]:
    neighbours = Neighbours(url)
    try:
        phases = [p for p in args.phases.split(",") if p]
        if "burst" in phases:
            await neighbours.ask("store", args.sockets)
        spy = PySpy(args.py_spy)
        assert neighbours.process.pid is not None  # started
        cpu = ServerCpu(embedded, neighbours.process.pid)
        rounds: list[dict[str, Any]] = []
        pooled: dict[str, list[ProbeTurn]] = {p: [] for p in phases}
        async with connect(url, api_key=PROBE_KEY) as sock:
            probe = Probe(sock, args.probe_model, args.probe_output_tokens)
            await probe.run(args.warmup_turns)
            for r in range(args.rounds):
                result: dict[str, Any] = {}
                for name in phases:
                    result[name], turns = await phase(
                        name, args, probe, neighbours, cpu, spy, f"round{r + 1}-{name}"
                    )
                    pooled[name] += turns
                result["ratio_to_idle"] = ratios(result)
                rounds.append(result)
                print(
                    f"round {r + 1}: "
                    + "; ".join(f"{name} p50 {result[name]['probe']['turn_ms']['p50']} ms" for name in phases)
                    + "; ratio to idle "
                    + ", ".join(f"{k} {v}x" for k, v in result["ratio_to_idle"].items())
                )
    finally:
        neighbours.close()
    overall = {name: probe_summary(turns) for name, turns in pooled.items()}
    per_round = {
        name: median([rd["ratio_to_idle"].get(name) for rd in rounds]) for name in phases if name != "idle"
    }
    return {
        "rounds": rounds,
        "overall": {
            "probe": overall,
            "ratio_to_idle": ratios({k: {"probe": v} for k, v in overall.items()}),
            "ratio_to_idle_median_of_rounds": per_round,
            "target": TARGET,
        },
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rounds", type=int, default=3, help="idle, http and burst phases, this many times in turn"
    )
    p.add_argument(
        "--phases", default=",".join(PHASES), help="comma-separated: idle, http, burst (idle first)"
    )
    p.add_argument("--probe-turns", type=int, default=100, help="probe turns in the idle and http phases")
    p.add_argument("--warmup-turns", type=int, default=20)
    p.add_argument("--probe-model", default="emu-fast")
    p.add_argument("--probe-output-tokens", type=int, default=8)
    p.add_argument("--http-clients", type=int, default=4)
    p.add_argument("--http-tokens", type=int, default=75_000, help="approximate tokens per HTTP request")
    p.add_argument(
        "--http-warmup-s", type=float, default=3.0, help="HTTP load before the probe's turns count"
    )
    p.add_argument("--sockets", type=int, default=32, help="resumed first turns per burst")
    p.add_argument("--bursts", type=int, default=4, help="bursts per round")
    p.add_argument("--neighbour-output-tokens", type=int, default=16)
    p.add_argument(
        "--url", help="a running server's base URL, http://host:port (default: start an embedded one)"
    )
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record each session host and the inference replica with py-spy in loaded phases",
    )
    p.add_argument("--out", type=Path, default=Path("results/neighbours.json"))


def run(args: argparse.Namespace) -> int:
    phases = [p for p in args.phases.split(",") if p]
    if not phases or phases[0] != "idle" or set(phases) - set(PHASES):
        print(f"--phases: idle first, then any of {', '.join(PHASES[1:])}")
        return 2
    if args.url:
        result = asyncio.run(measure(args.url, args, embedded=False))
    else:
        with embedded_server(local_config(args.config)) as url:
            result = asyncio.run(measure(url, args, embedded=True))
    overall = result["overall"]
    print(
        "all rounds: "
        + "; ".join(
            f"{name} p50 {s['turn_ms']['p50']} ms (non-model {s['nonmodel_ms']['p50']})"
            for name, s in overall["probe"].items()
        )
        + "; ratio to idle "
        + ", ".join(f"{k} {v}x" for k, v in overall["ratio_to_idle"].items())
        + f" (target <= {TARGET}x)"
    )
    results.write(
        args.out,
        {
            "command": args.command,
            **result,
            "workload": {
                k: getattr(args, k)
                for k in (
                    "rounds",
                    "probe_turns",
                    "probe_model",
                    "probe_output_tokens",
                    "http_clients",
                    "http_tokens",
                    "sockets",
                    "bursts",
                    "neighbour_output_tokens",
                )
            },
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0
