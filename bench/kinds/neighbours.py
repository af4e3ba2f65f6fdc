"""Noisy neighbours on a packed host: how much a turn on an open socket slows while others load the server.

    responses-ws bench neighbours [--rounds 3] [--probe-turns 100] [--http-clients 4] [--http-tokens 68000]
                                  [--sockets 32] [--bursts 4] [--config FILE] [--url URL] [--py-spy DIR]
                                  [--out results/neighbours.json]

One probe WebSocket does small turns (``--probe-model``, a short input, ``--probe-output-tokens``
tokens, ``store:false``, chained with ``previous_response_id``), each timed from the client:
create sent → terminal event read.  Every round measures the probe in three phases, in turn:

- ``idle``: nothing else runs;
- ``http``: ``--http-clients`` loops of the load runner over ``http-full`` send ``--http-tokens``-token
  stateless requests (``store:false``; a document of numbered words, the same every request,
  and a short task)
  back to back over a keep-alive pool; the probe's turns start ``--http-warmup-s`` after their release;
- ``burst``: ``--sockets`` loops of the load runner, each on a fresh WebSocket, send a resumed
  first turn at the same moment: the ``codex`` preset's instructions and tools, a task, and
  ``previous_response_id`` of a stored ~60k-token response written before the run (the runner's
  ``LoadSpec.continues``) — the host loads the record and rebuilds (parses, renders, classifies)
  the whole history.  ``--bursts`` bursts a round; the probe turns that start and end within a
  burst (go → the last terminal event) count.

The neighbours run in the runner's client processes (bench/runner, one a phase or a burst), so
the probe's client loop does nothing else (the machine's cores are still shared); the runner
measures them too, and a saturated one is said so (``clients.saturated``).  Printed and saved:
the probe's p50 (p90) per phase and its ratio to idle (the target is ≤ 1.5×,
docs/performance.md), its non-model time (turn − the server-reported queue + prefill +
decode), the neighbours' own numbers, and — with an embedded server — the CPU seconds each
server process used in each phase.  ``--py-spy DIR`` records each session host with py-spy
(``--threads --nonblocking``, raw collapsed stacks) during every loaded phase, and the
inference replica with them.  Every probe turn is saved too (``probe_turns``: seconds into the
phase, total, model, ``api_overhead`` and ``backend`` ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import results
from .. import workload as wl
from ..client import ResponsesSocket, connect
from ..conversation import TIMINGS_KEY, model_seconds, server_timings
from ..neighbours_report import (
    ProbeTurn,
    burst_summary,
    burst_window,
    http_summary,
    probe_summary,
    ratios,
)
from ..runner import LoadResult, LoadSpec, run_local, start_local
from ..server_watch import PySpy, ServerCpu
from ..stats import median

PROBE_KEY = "sk-bench-probe"
NEIGHBOUR_KEY = "sk-bench-neighbour"  # a prefix-cache scope of its own: neighbours never evict the probe's
PHASES = ("idle", "http", "burst")
TARGET = 1.5  # the probe's p50 under load over its idle p50, at most (docs/performance.md)
DEADLINE_S = 3600.0  # a phase's load stops when told, at the latest this long after its release
TASK_TOKENS = 8  # the HTTP requests' task after their document


# ---------------------------------------------------------------------------------- the probe
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
        started = time.time()
        answer = await self.sock.create(**self.body, previous_response_id=self.prev)
        response = answer.response
        if response is None:
            raise RuntimeError(f"a probe turn failed: {answer.last}")
        self.prev = response["id"]
        timings = server_timings(response)
        model = model_seconds(timings)
        return ProbeTurn(
            started,
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


# ------------------------------------------------------------------ the neighbours (the runner)
def http_spec(url: str, args: argparse.Namespace) -> LoadSpec:
    """The HTTP clients: ``http-full`` loops of one-turn rollouts (a document of
    ``--http-tokens`` and a short task, no instructions, tools or tool calls), a new rollout
    as soon as one ends (after a failed one too: the ``codex`` workload's loop)."""
    w = wl.Workload(
        tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=TASK_TOKENS,
        text_tokens=args.neighbour_output_tokens, document_tokens=args.http_tokens,
    )  # fmt: skip
    return LoadSpec(
        targets=(url,), loops=args.http_clients, transport="http-full", workload="codex",
        custom_workload=w, api_key=NEIGHBOUR_KEY, warmup_s=args.http_warmup_s, duration_s=DEADLINE_S,
    )  # fmt: skip


def burst_workload(output_tokens: int) -> wl.Workload:
    """The ``codex`` preset's instructions, tools and tasks; a text answer at once."""
    return replace(wl.PRESETS["codex"], shape=None, resume_tokens=0, tool_rounds=0, text_tokens=output_tokens)


def burst_spec(url: str, stored: list[str], output_tokens: int) -> LoadSpec:
    """A burst: a loop a stored response, each on its own connection opened before the release,
    one turn continuing it, all released at once; the connections closed once every turn was
    answered (none while the others' turns run)."""
    return LoadSpec(
        targets=(url,), loops=len(stored), custom_workload=burst_workload(output_tokens),
        continues=tuple(stored), rollouts_per_loop=1, warmup_s=0.0, duration_s=DEADLINE_S,
        api_key=NEIGHBOUR_KEY,
    )  # fmt: skip


async def store_histories(url: str, count: int) -> list[str]:
    """Write ``count`` stored responses holding the ``codex`` preset's rollout ``r``'s resumed
    history (no model output: ``generate:false``) one after another on one connection; their ids."""
    w = wl.PRESETS["codex"]
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


# ------------------------------------------------------------------------------- phases
async def http_phase(
    args: argparse.Namespace, url: str, probe: Probe, spy: PySpy, label: str
) -> tuple[dict[str, Any], list[ProbeTurn]]:
    run = await asyncio.to_thread(start_local, http_spec(url, args))
    try:
        await asyncio.sleep(max(0.0, run.release_at + args.http_warmup_s - time.time()))
        since = time.time()
        spy.start(label)
        try:
            turns = await probe.run(args.probe_turns)
        finally:
            spy.stop()
    finally:
        result = await asyncio.to_thread(run.stop)
    return {"neighbours": http_summary(result, since)}, turns


async def burst_phase(
    args: argparse.Namespace, url: str, stored: list[str], probe: Probe, spy: PySpy, label: str
) -> tuple[dict[str, Any], list[ProbeTurn]]:
    turns: list[ProbeTurn] = []
    bursts: list[LoadResult] = []
    spy.start(label)
    try:
        for _ in range(args.bursts):
            stop = asyncio.Event()
            running = asyncio.create_task(probe.run(stop=stop))  # mid-conversation when the burst lands
            try:
                burst = await asyncio.to_thread(
                    run_local, burst_spec(url, stored, args.neighbour_output_tokens)
                )
            finally:
                stop.set()
            go, end = burst_window(burst)
            turns += [t for t in await running if t.started >= go and t.ended <= end]
            bursts.append(burst)
            await asyncio.sleep(0.5)
    finally:
        spy.stop()
    return {"neighbours": burst_summary(bursts)}, turns


async def phase(
    name: str,
    args: argparse.Namespace,
    url: str,
    stored: list[str],
    probe: Probe,
    cpu: ServerCpu,
    spy: PySpy,
    label: str,
) -> tuple[dict[str, Any], list[ProbeTurn]]:
    before, t0 = await asyncio.to_thread(cpu.sample), time.time()
    if name == "idle":
        out: dict[str, Any] = {}
        turns = await probe.run(args.probe_turns)
    elif name == "http":
        out, turns = await http_phase(args, url, probe, spy, label)
    else:
        out, turns = await burst_phase(args, url, stored, probe, spy, label)
    wall = time.time() - t0
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
    phases = [p for p in args.phases.split(",") if p]
    stored = await store_histories(url, args.sockets) if "burst" in phases else []
    spy = PySpy(args.py_spy)
    cpu = ServerCpu(embedded)
    rounds: list[dict[str, Any]] = []
    pooled: dict[str, list[ProbeTurn]] = {p: [] for p in phases}
    async with connect(url, api_key=PROBE_KEY) as sock:
        probe = Probe(sock, args.probe_model, args.probe_output_tokens)
        await probe.run(args.warmup_turns)
        for r in range(args.rounds):
            result: dict[str, Any] = {}
            for name in phases:
                result[name], turns = await phase(
                    name, args, url, stored, probe, cpu, spy, f"round{r + 1}-{name}"
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
    p.add_argument(
        "--http-tokens", type=int, default=68_000, help="cl100k tokens of each HTTP request's document"
    )
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
