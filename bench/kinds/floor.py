"""The protocol's floor: this server's non-model time per turn against a minimal server.

    responses-ws bench floor [--turns 40] [--rounds 1] [--url URL] [--out results/floor.json]

One Codex-like socket (instructions of ``--instruction-words`` words and ``--tools`` function
tools resent with every create, a ~``--tool-output-tokens`` tool output per turn,
``store=false``, each turn chained with ``previous_response_id``) runs ``--turns`` turns
against this server; a turn's non-model time is what the client measured (from the create
handed to the socket, after the client encoded and compressed it, to the terminal event's
arrival, before the client parses it) less the server's reported queue + prefill + decode.
Then a minimal
reference server (the same ``websockets`` library with its default permessage-deflate
settings, in a process of its own) answers the very same creates with the very same frames: it parses each
create and re-encodes and sends the recorded events of that turn, nothing else, so its turn
time is the bare protocol's cost on this machine.  Both run with the client offering
permessage-deflate and without (the reference always accepts the offer; this server, by its
``session.deflate`` policy, declines it from a loopback peer unless set to ``always``, and the
output says which); the ratio of the medians is the number to drive down
(docs/performance.md).  The server's own ``api_overhead`` is printed beside the client's
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import processes, results
from .. import workload as wl
from ..client import ResponsesSocket, connect, is_final
from ..rollouts import TIMINGS_KEY, model_seconds, server_timings
from ..stats import median

MODES = {"deflate": "deflate", "plain": None}  # name → the client's `compression`


@dataclass
class Turn:
    create: str  # the create as sent (replayed to the reference verbatim)
    frames: list[str]  # the server's answer, as received
    total_ms: float
    model_ms: float | None = None  # server-reported queue + prefill + decode
    api_overhead_ms: float | None = None
    backend_ms: float | None = None  # the server's model call beyond the model's time
    phases: dict[str, float] = field(default_factory=dict)  # the server's timings, all of them


@dataclass
class Run:
    mode: str
    turns: list[Turn] = field(default_factory=list)
    deflate: bool = False  # the server accepted the client's permessage-deflate offer
    cpu_ms: float | None = None  # the server's processes' CPU over the run (embedded server only)


def workload_tools(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` function tools in the flat Responses shape (the benchmark's tool shapes,
    numbered past the first eight)."""
    base = wl.tools(wl.Workload(tool_def_tokens=150 * count, seed=seed))
    out = []
    for i in range(count):
        tool = dict(base[i % len(base)])
        if i >= len(base):
            tool["name"] = f"{tool['name']}_{i // len(base)}"
        out.append(tool)
    return out


def instructions(words: int, seed: int) -> str:
    rng = random.Random(f"floor/{seed}")
    return " ".join(rng.choice(wl.WORDS) for _ in range(words))


def creates_for(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The fixed part of every create, and the tool output of each turn."""
    w = wl.Workload(tool_output_tokens=args.tool_output_tokens, seed=args.seed)
    fixed = {
        "model": args.model,
        "store": False,
        "instructions": instructions(args.instruction_words, args.seed),
        "tools": workload_tools(args.tools, args.seed),
        "metadata": {TIMINGS_KEY: "1", "emulator.tool_rounds": "10000"},
    }
    outputs = [wl.tool_output(w, 0, turn, 0, "shell") for turn in range(args.turns)]
    return fixed, outputs


async def exchange(sock: ResponsesSocket, create: str, frames: int | None = None) -> tuple[list[str], float]:
    """Send ``create`` and read its answer — ``frames`` frames, or up to the final event —
    parsing each frame as any client does; the frames as received, and the turn's ms: from
    the create handed to the socket (encoded, and compressed if deflate was negotiated) to the
    last frame's arrival (before the client parses it) — the client's own work on either side
    is left out, the same for this server and the reference."""
    got: list[str] = []
    await sock.ws.send(create)
    t0 = time.perf_counter()
    while True:
        raw = await sock.ws.recv()
        arrived = time.perf_counter()
        event = json.loads(raw)
        assert isinstance(raw, str)  # the server sends text frames
        got.append(raw)
        if len(got) == frames or (frames is None and is_final(event)):
            return got, (arrived - t0) * 1000


async def drive(url: str, mode: str, fixed: dict[str, Any], outputs: list[str]) -> Run:
    """Run the turns against this server, recording each create and what came back."""
    run = Run(mode)
    async with connect(url, compression=MODES[mode]) as sock:
        run.deflate = bool(sock.ws.protocol.extensions)
        prev: dict[str, Any] | None = None
        for i, output in enumerate(outputs):
            body: dict[str, Any] = {"type": "response.create", **fixed}
            if prev is None:
                body["input"] = "The test suite fails after the last change. Find the cause and fix it."
            else:
                call = next((o for o in prev["output"] if o["type"] == "function_call"), None)
                if call is None:
                    raise RuntimeError(f"turn {i}: the model answered without a tool call")
                body["input"] = [
                    {"type": "function_call_output", "call_id": call["call_id"], "output": output}
                ]
                body["previous_response_id"] = prev["id"]
            create = json.dumps(body)
            frames, total_ms = await exchange(sock, create)
            last = json.loads(frames[-1])
            if last.get("type") != "response.completed":
                raise RuntimeError(f"turn {i} did not complete: {frames[-1][:300]}")
            prev = last["response"]
            timings = server_timings(prev)
            model = model_seconds(timings)
            run.turns.append(
                Turn(
                    create,
                    frames,
                    total_ms,
                    None if model is None else model * 1000,
                    (timings or {}).get("api_overhead"),
                    (timings or {}).get("backend"),
                    dict(timings or {}),
                )
            )
    return run


def _reference_main(turns: list[list[str]], ready: Any) -> None:
    """The reference server (its own process): answers the i-th create of a connection with
    turn i's frames, re-encoded from parsed events, and does nothing else.  It offers
    permessage-deflate with the library's defaults, as a minimal ``websockets`` server does;
    the client's mode decides whether it is negotiated."""
    from websockets.asyncio.server import serve

    events = [[json.loads(f) for f in frames] for frames in turns]

    async def handler(ws: Any) -> None:
        for answer in events:
            json.loads(await ws.recv())
            for event in answer:  # encoded as the server encodes (compact, UTF-8)
                await ws.send(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression="deflate", max_size=None) as server:
            ready.send(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    asyncio.run(main())


async def drive_reference(url: str, run: Run) -> list[float]:
    """The same creates against the reference; each turn's client-observed time (ms)."""
    async with connect(url, compression=MODES[run.mode]) as sock:
        return [(await exchange(sock, t.create, len(t.frames)))[1] for t in run.turns]


def reference_laps(run: Run) -> tuple[list[float], float]:
    """Each turn's time against the reference, and the reference process's CPU ms."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_reference_main, args=([t.frames for t in run.turns], child), daemon=True)
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError("the reference server did not start")
        port = parent.recv()
        assert proc.pid is not None  # started
        cpu = processes.cpu_s([proc.pid])
        laps = asyncio.run(drive_reference(f"http://127.0.0.1:{port}", run))
        return laps, (processes.cpu_s([proc.pid]) - cpu) * 1000
    finally:
        proc.terminate()
        proc.join(10)


def summarise(run: Run, reference: list[float], reference_cpu_ms: float, skip: int) -> dict[str, Any]:
    turns = run.turns[skip:]
    ours = [t.total_ms - t.model_ms for t in turns if t.model_ms is not None]
    ref = reference[skip:]
    api = [t.api_overhead_ms for t in turns if t.api_overhead_ms is not None]
    out: dict[str, Any] = {
        "turns": len(turns),
        "server_nonmodel_ms": median(ours, 3),
        "reference_ms": median(ref, 3),
        "ratio": round(statistics.median(ours) / statistics.median(ref), 2) if ours and ref else None,
        "server_api_overhead_ms": median(api, 3),
        "server_backend_ms": median([t.backend_ms for t in turns if t.backend_ms is not None], 3),
        "frames_per_turn": median([len(t.frames) for t in turns], 3),
        "bytes_per_turn": median([sum(len(f) for f in t.frames) for t in turns], 3),
        "server_deflate": run.deflate,
        # CPU a turn (all turns, warm-up too; the kernel counts it in 10 ms ticks, so it
        # needs ~100 turns), which the machine's load moves far less than time
        "server_cpu_ms_per_turn": None if run.cpu_ms is None else round(run.cpu_ms / len(run.turns), 3),
        "reference_cpu_ms_per_turn": round(reference_cpu_ms / len(run.turns), 3),
    }
    client, server = out["server_nonmodel_ms"], out["server_api_overhead_ms"]
    out["client_minus_server_ms"] = None if client is None or server is None else round(client - server, 3)
    names = sorted({k for t in turns for k in t.phases})
    out["server_phases_ms"] = {k: median([t.phases[k] for t in turns if k in t.phases], 3) for k in names}
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--rounds", type=int, default=1, help="alternate server and reference this many times")
    p.add_argument("--skip", type=int, default=2, help="leading turns left out of the medians (warm-up)")
    p.add_argument("--modes", default="deflate,plain", help="comma-separated: deflate, plain")
    p.add_argument("--model", default="emu-fast")
    p.add_argument("--instruction-words", type=int, default=8000)
    p.add_argument("--tools", type=int, default=20)
    p.add_argument("--tool-output-tokens", type=int, default=350)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--url", help="a running server's base URL, http://host:port (default: start an embedded one)"
    )
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/floor.json"))


SERVER_PROCESSES = (processes.SESSION_ACTOR, "InferenceDeployment")  # a WebSocket turn's processes


async def measure_server(
    url: str, modes: list[str], fixed: dict[str, Any], outputs: list[str], pids: list[int] | None = None
) -> list[Run]:
    """Each mode's run; with ``pids`` (the embedded server's session hosts and inference
    replicas), also their CPU over the run."""
    runs = []
    for mode in modes:
        cpu = processes.cpu_s(pids) if pids else 0.0
        run = await drive(url, mode, fixed, outputs)
        if pids:
            run.cpu_ms = (processes.cpu_s(pids) - cpu) * 1000
        runs.append(run)
    return runs


def run(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        print(f"unknown mode(s) {sorted(unknown)}: one of {sorted(MODES)}")
        return 2
    fixed, outputs = creates_for(args)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        if args.url:
            runs = asyncio.run(measure_server(args.url, modes, fixed, outputs))
        else:
            with embedded_server(local_config(args.config)) as url:
                pids = [pid for name in SERVER_PROCESSES for pid in processes.actor_pids(name)]
                runs = asyncio.run(measure_server(url, modes, fixed, outputs, pids))
        result = {run.mode: summarise(run, *reference_laps(run), args.skip) for run in runs}
        rounds.append(result)
        for mode, s in result.items():
            print(
                f"round {r + 1} {mode:>7}: server {s['server_nonmodel_ms']:.2f} ms outside the model per turn, "
                f"reference {s['reference_ms']:.2f} ms -> {s['ratio']}x; the server reports "
                f"api_overhead {s['server_api_overhead_ms']:.2f} ms (backend {s['server_backend_ms']:.2f}) "
                f"({s['frames_per_turn']:.0f} frames, {s['bytes_per_turn'] / 1000:.0f} KB a turn"
                f"{'' if mode == 'plain' else '; deflate ' + ('accepted' if s['server_deflate'] else 'declined')})"
                + (
                    ""
                    if s["server_cpu_ms_per_turn"] is None
                    else f"; CPU a turn: server {s['server_cpu_ms_per_turn']:.2f} ms, "
                    f"reference {s['reference_cpu_ms_per_turn']:.2f} ms"
                )
            )
    results.write(
        args.out,
        {
            "command": args.command,
            "rounds": rounds,
            "workload": {
                k: getattr(args, k)
                for k in ("turns", "model", "instruction_words", "tools", "tool_output_tokens", "seed")
            },
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0
