"""The protocol's floor: this server's non-model time and CPU per turn against a minimal server.

    responses-ws bench floor [--turns 40] [--rounds 5] [--modes plain] [--url URL]
                             [--out results/floor.json]

One Codex-like socket (instructions of ``--instruction-words`` words and ``--tools`` function
tools resent with every create, a ~``--tool-output-tokens`` tool output per turn,
``store=false``, each turn chained with ``previous_response_id``) against this server, and
a minimal reference server (the same ``websockets`` library with its default
permessage-deflate settings, in a process of its own) that parses each create and re-encodes
and sends the frames this server answered that turn with, nothing else: the bare protocol's
cost on this machine.

A warm-up run on this server records the creates and the frames.  Then ``--rounds`` rounds,
each on a fresh socket to each server, go **turn by turn**: turn i on this server, then turn
i on the reference, the order swapped every other turn and every other round, so the
machine's load (shared, noisy) falls on both alike.  Every round is printed; the summary is
the median over rounds with the spread (p25-p75 and min-max of the rounds' medians).

A turn's non-model time is what the client measured (from the create handed to the socket
to the terminal event's arrival, before the client parses it) less the server's reported
queue + prefill + decode.  CPU per turn is read from /proc over each round, by process role
(:data:`bench.processes.ROLES`: the gateway, the session hosts, the inference emulator and
Ray's own processes; the API tier is the gateway and the session hosts) for an embedded
server, beside the reference process's; Ray's background (its roles' idle CPU rate, measured
before the rounds, times the round's length) is printed beside it.  After the rounds, once
the server's processes are back at their idle CPU rate, the reference runs the recorded
creates again ``--rounds`` times in a block of its own: its CPU per turn with nothing of this
server's work running beside it.  The summary prints each role's CPU against its budget
(:data:`bench.floor_budgets.BUDGETS`: all the server's processes, the API tier against the reference both ways,
the emulator replica, and the idle server's every process) with the rounds' range.  The client's own cost
is measured in the client over the recorded frames: parsing each turn's frames with
``json.loads`` (the raw client's) and with the openai SDK's event types (what
``client.responses.connect()`` does on every ``recv()``), and encoding the create both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import processes, results
from .. import workload as wl
from ..client import ResponsesSocket, connect, is_final
from ..conversation import TIMINGS_KEY, model_seconds, server_timings
from ..floor_budgets import budgets, print_budgets
from ..floor_reference import Reference
from ..floor_report import Run, Turn, client_costs, fmt, over_rounds, summarise
from ..texts import WORDS

MODES = {"deflate": "deflate", "plain": None}  # name → the client's `compression`


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
    return " ".join(rng.choice(WORDS) for _ in range(words))


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
    await sock.send_raw(create)
    t0 = time.perf_counter()
    while True:
        raw = await sock.recv_raw()
        arrived = time.perf_counter()
        event = json.loads(raw)
        got.append(raw)
        if len(got) == frames or (frames is None and is_final(event)):
            return got, (arrived - t0) * 1000


def build_create(fixed: dict[str, Any], output: str, prev: dict[str, Any] | None) -> str:
    """Turn's create: the task on the first turn, then the previous call's output, chained."""
    body: dict[str, Any] = {"type": "response.create", **fixed}
    if prev is None:
        body["input"] = "The test suite fails after the last change. Find the cause and fix it."
    else:
        call = next((o for o in prev["output"] if o["type"] == "function_call"), None)
        if call is None:
            raise RuntimeError("the model answered without a tool call")
        body["input"] = [{"type": "function_call_output", "call_id": call["call_id"], "output": output}]
        body["previous_response_id"] = prev["id"]
    return json.dumps(body)


async def server_turn(sock: ResponsesSocket, create: str) -> tuple[Turn, dict[str, Any]]:
    """One turn on this server: the :class:`Turn` and the response it ended with."""
    frames, total_ms = await exchange(sock, create)
    last = json.loads(frames[-1])
    if last.get("type") != "response.completed":
        raise RuntimeError(f"the turn did not complete: {frames[-1][:300]}")
    response = last["response"]
    timings = server_timings(response)
    model = model_seconds(timings)
    turn = Turn(
        create,
        frames,
        total_ms,
        None if model is None else model * 1000,
        (timings or {}).get("api_overhead"),
        (timings or {}).get("backend"),
        dict(timings or {}),
    )
    return turn, response


async def drive(url: str, mode: str, fixed: dict[str, Any], outputs: list[str]) -> Run:
    """The turns against this server alone, recording each create and what came back."""
    run = Run(mode)
    async with connect(url, compression=MODES[mode]) as sock:
        run.deflate = sock.deflate
        prev: dict[str, Any] | None = None
        for output in outputs:
            turn, prev = await server_turn(sock, build_create(fixed, output, prev))
            run.turns.append(turn)
    return run


async def drive_reference(url: str, run: Run) -> list[float]:
    """The same creates against the reference alone; each turn's client-observed time (ms)."""
    async with connect(url, compression=MODES[run.mode]) as sock:
        return [(await exchange(sock, t.create, len(t.frames)))[1] for t in run.turns]


def reference_block(ref: Reference, recorded: Run, rounds: int) -> list[float]:
    """The reference alone, ``rounds`` runs of the recorded creates on fresh sockets: its CPU
    ms per turn in each (nothing of this server's runs meanwhile)."""
    out = []
    for _ in range(rounds):
        cpu0 = processes.cpu_precise_s(ref.pid)
        asyncio.run(drive_reference(ref.url, recorded))
        out.append((processes.cpu_precise_s(ref.pid) - cpu0) * 1000 / len(recorded.turns))
    return out


def reference_laps(run: Run) -> tuple[list[float], float]:
    """Each turn's time against the reference, and the reference process's CPU ms."""
    ref = Reference(run)
    try:
        cpu = processes.cpu_s([ref.pid])
        laps = asyncio.run(drive_reference(ref.url, run))
        return laps, (processes.cpu_s([ref.pid]) - cpu) * 1000
    finally:
        ref.close()


@dataclass
class Round:
    """One interleaved round: this server's turns, the reference's turn times, and CPU ms
    over the round (by role for an embedded server; empty otherwise)."""

    run: Run
    reference_ms: list[float]
    cpu_ms: dict[str, float]
    reference_cpu_ms: float
    wall_s: float
    ray_cpu_ms: dict[str, float] = field(default_factory=dict)  # Ray's own processes', by title


async def interleaved_round(
    number: int,
    url: str,
    ref: Reference,
    recorded: Run,
    fixed: dict[str, Any],
    outputs: list[str],
    procs: dict[int, str],
) -> Round:
    """Turn by turn on a fresh socket to each server; who goes first swaps every turn and
    every round."""
    mode = recorded.mode
    run = Run(mode)
    ref_ms: list[float] = []
    async with (
        connect(url, compression=MODES[mode]) as sock,
        connect(ref.url, compression=MODES[mode]) as rsock,
    ):
        run.deflate = sock.deflate
        titles = processes.titles({pid: role for pid, role in procs.items() if role == "ray"})
        ray0 = processes.cpu_by_role(titles)
        cpu0, rcpu0, t0 = processes.cpu_by_role(procs), processes.cpu_precise_s(ref.pid), time.perf_counter()
        prev: dict[str, Any] | None = None
        for i, output in enumerate(outputs):
            recorded_turn = recorded.turns[i]
            for ours in (True, False) if (i + number) % 2 == 0 else (False, True):
                if ours:
                    turn, prev = await server_turn(sock, build_create(fixed, output, prev))
                    run.turns.append(turn)
                else:
                    frames = len(recorded_turn.frames)
                    ref_ms.append((await exchange(rsock, recorded_turn.create, frames))[1])
        wall = time.perf_counter() - t0
        cpu = processes.role_delta(processes.cpu_by_role(procs), cpu0) if procs else {}
        rcpu = (processes.cpu_precise_s(ref.pid) - rcpu0) * 1000
        ray = {
            k: v for k, v in processes.role_delta(processes.cpu_by_role(titles), ray0).items() if k in ray0
        }
    return Round(run, ref_ms, cpu, rcpu, wall, {k: ray[k] for k in set(titles.values())})


# ----------------------------------------------------------------------------- the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds after the warm-up run")
    p.add_argument("--skip", type=int, default=2, help="leading turns left out of the medians (warm-up)")
    p.add_argument("--modes", default="plain", help="comma-separated: plain, deflate")
    p.add_argument("--model", default="emu-fast")
    p.add_argument("--instruction-words", type=int, default=8000)
    p.add_argument("--tools", type=int, default=20)
    p.add_argument("--tool-output-tokens", type=int, default=350)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--idle-s",
        type=float,
        default=processes.IDLE_WINDOW_S,
        help="idle window measuring the background CPU rate (every process's 10 s metrics export once)",
    )
    p.add_argument(
        "--url", help="a running server's base URL, http://host:port (default: start an embedded one)"
    )
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/floor.json"))


def background(procs: dict[int, str], seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """CPU ms per second while nothing is sent: by role, and by process (its title, e.g.
    ``ray::ServeController`` or the raylet's and the GCS's executable)."""
    if not procs or seconds <= 0:
        return {}, {}
    titles = processes.titles(procs)
    before = processes.cpu_by_role(procs)
    each = {pid: processes.cpu_precise_s(pid) for pid in procs}
    time.sleep(seconds)
    by_role = processes.role_delta(processes.cpu_by_role(procs), before)
    by_process: dict[str, float] = {}
    for pid, t0 in each.items():
        name = titles.get(pid, str(pid))
        by_process[name] = by_process.get(name, 0.0) + (processes.cpu_precise_s(pid) - t0) * 1000 / seconds
    return (
        {k: round(v / seconds, 3) for k, v in by_role.items()},
        dict(sorted(((k, round(v, 2)) for k, v in by_process.items()), key=lambda kv: -kv[1])),
    )


def print_round(label: str, mode: str, s: dict[str, Any]) -> None:
    cpu = s.get("cpu_ms_per_turn")
    print(
        f"{label} {mode:>7}: server {s['server_nonmodel_ms']:.2f} ms outside the model, reference "
        f"{s['reference_ms']:.2f} ms -> {s['ratio']}x; api_overhead {s['server_api_overhead_ms']:.2f} "
        f"(backend {s['server_backend_ms']:.2f}); CPU/turn "
        + (
            f"gateway {cpu['gateway']:.2f} + host {cpu['session_host']:.2f} = API {cpu['api_tier']:.2f} "
            f"({s['api_tier_cpu_ratio']}x ref {s['reference_cpu_ms_per_turn']:.2f}), inference "
            f"{cpu['inference']:.2f}, Ray {cpu['ray']:.2f} (background {cpu['ray_background']:.2f})"
            if cpu
            else f"reference {s['reference_cpu_ms_per_turn']:.2f}"
        ),
        flush=True,
    )


def measure(url: str, modes: list[str], args: argparse.Namespace, embedded: bool) -> dict[str, Any]:
    fixed, outputs = creates_for(args)
    out: dict[str, Any] = {}
    for mode in modes:
        recorded = asyncio.run(drive(url, mode, fixed, outputs))
        ref = Reference(recorded)
        try:
            procs = processes.server_processes(exclude=(ref.pid,)) if embedded else {}
            time.sleep(2.0 if procs else 0.0)  # the warm-up's after-turn work done: the idle window is idle
            idle, idle_by_process = background(procs, args.idle_s)
            rounds = []
            for r in range(args.rounds):
                rnd = asyncio.run(interleaved_round(r, url, ref, recorded, fixed, outputs, procs))
                s = summarise(
                    rnd.run,
                    rnd.reference_ms,
                    rnd.reference_cpu_ms,
                    args.skip,
                    cpu_ms=rnd.cpu_ms,
                    background_ms_per_s=idle,
                    wall_s=rnd.wall_s,
                )
                s["wall_s"] = round(rnd.wall_s, 3)
                n = len(rnd.run.turns)
                s["ray_cpu_ms_per_turn_by_process"] = {k: round(v / n, 3) for k, v in rnd.ray_cpu_ms.items()}
                rounds.append(s)
                print_round(f"round {r + 1}/{args.rounds}", mode, s)
            # The reference alone, once this server's processes are back at their idle rate:
            # interleaved, the server's after-turn work (billing, metrics, the checkpoint)
            # runs while the reference's turn is timed, and the ratio must not depend on it.
            settled = processes.settle(procs, sum(idle.values())) if procs else None
            block = reference_block(ref, recorded, args.rounds)
        finally:
            ref.close()
        for s, ref_cpu in zip(rounds, block):
            s["reference_block_cpu_ms_per_turn"] = round(ref_cpu, 3)
            api = s.get("cpu_ms_per_turn", {}).get("api_tier")
            s["api_tier_cpu_ratio_block"] = round(api / ref_cpu, 2) if api and ref_cpu else None
        summary = over_rounds(rounds)
        summary["settled_cpu_ms_per_s_before_block"] = None if settled is None else round(settled, 1)
        summary["client"] = client_costs(recorded, args.skip)
        summary["background_cpu_ms_per_s"] = idle
        summary["background_cpu_ms_per_s_by_process"] = idle_by_process
        summary["budgets"] = budgets(summary) if embedded else []
        out[mode] = {"rounds": rounds, "summary": summary, "server_deflate": recorded.deflate}
        print_summary(mode, summary)
    return out


def print_summary(mode: str, s: dict[str, Any]) -> None:
    print(f"{mode}, median over {s['rounds']} rounds (p25-p75, min-max of the rounds' medians):")
    print(f"  server outside the model {fmt(s['server_nonmodel_ms'])}")
    print(f"  reference                {fmt(s['reference_ms'])}")
    print(f"  ratio                    {fmt(s['ratio'], 'x')}")
    print(f"  server api_overhead      {fmt(s['server_api_overhead_ms'])}")
    for role, sp in s["cpu_ms_per_turn"].items():
        print(f"  CPU/turn {role:<15} {fmt(sp)}")
    for title, sp in sorted(
        s.get("ray_cpu_ms_per_turn_by_process", {}).items(), key=lambda kv: -kv[1]["median"] if kv[1] else 0
    ):
        print(f"    Ray's own: {title:<30} {fmt(sp)}")
    print(f"  CPU/turn reference, interleaved {fmt(s['reference_cpu_ms_per_turn'])}")
    if s.get("reference_block_cpu_ms_per_turn"):
        print(f"  CPU/turn reference, in a block  {fmt(s['reference_block_cpu_ms_per_turn'])}")
    if s.get("api_tier_cpu_ratio"):
        print(f"  API-tier CPU / reference, interleaved {fmt(s['api_tier_cpu_ratio'], 'x')}")
    if s.get("api_tier_cpu_ratio_block"):
        print(f"  API-tier CPU / reference, in a block  {fmt(s['api_tier_cpu_ratio_block'], 'x')}")
    c = s["client"]
    print(
        f"  client per turn: parse raw {c['raw_parse_ms']:.2f} ms, openai SDK {c['sdk_parse_ms']:.2f} ms; "
        f"encode raw {c['raw_encode_ms']:.2f} ms, SDK {c['sdk_encode_ms']:.2f} ms"
    )
    print(f"  idle background, CPU ms per s, by role: {s['background_cpu_ms_per_s']}")
    top = list(s.get("background_cpu_ms_per_s_by_process", {}).items())
    print("  ... by process: " + ", ".join(f"{k} {v:.1f}" for k, v in top))
    if s.get("budgets"):
        print_budgets(s["budgets"])


def run(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        print(f"unknown mode(s) {sorted(unknown)}: one of {sorted(MODES)}")
        return 2
    if args.url:
        result = measure(args.url, modes, args, embedded=False)
    else:
        with embedded_server(local_config(args.config)) as url:
            result = measure(url, modes, args, embedded=True)
    results.write(
        args.out,
        {
            "command": args.command,
            "modes": result,
            "workload": {
                k: getattr(args, k)
                for k in (
                    "turns",
                    "rounds",
                    "skip",
                    "model",
                    "instruction_words",
                    "tools",
                    "tool_output_tokens",
                    "seed",
                )
            },
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0
