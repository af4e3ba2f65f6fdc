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
import multiprocessing
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from serve.embedded import embedded_server, local_config

from .. import processes, results
from .. import workload as wl
from ..client import ResponsesSocket, connect, is_final
from ..conversation import TIMINGS_KEY, model_seconds, server_timings
from ..floor_budgets import budgets, print_budgets, rounds_spread
from ..stats import median
from ..texts import WORDS

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


class Reference:
    """The reference server in a process of its own, answering a connection's i-th create
    with ``recorded``'s turn i."""

    def __init__(self, recorded: Run) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_reference_main, args=([t.frames for t in recorded.turns], child), daemon=True
        )
        self.proc.start()
        if not parent.poll(60):
            self.close()
            raise RuntimeError("the reference server did not start")
        self.url = f"http://127.0.0.1:{parent.recv()}"

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def close(self) -> None:
        self.proc.terminate()
        self.proc.join(10)


async def drive_reference(url: str, run: Run) -> list[float]:
    """The same creates against the reference alone; each turn's client-observed time (ms)."""
    async with connect(url, compression=MODES[run.mode]) as sock:
        return [(await exchange(sock, t.create, len(t.frames)))[1] for t in run.turns]


def settle(
    procs: dict[int, str], idle_ms_per_s: float, *, window_s: float = 1.0, timeout_s: float = 15.0
) -> float:
    """Wait until the server's processes are back at their idle CPU rate (a ``window_s``
    window within 25 % or 10 ms/s of ``idle_ms_per_s``, all processes), at most ``timeout_s``;
    the last window's rate (ms of CPU a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        t0, before = time.perf_counter(), sum(processes.cpu_precise_s(pid) for pid in procs)
        time.sleep(window_s)
        rate = (
            (sum(processes.cpu_precise_s(pid) for pid in procs) - before) * 1000 / (time.perf_counter() - t0)
        )
        if rate <= max(idle_ms_per_s * 1.25, idle_ms_per_s + 10) or time.monotonic() > deadline:
            return rate


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


# ----------------------------------------------------------------------------- summaries


def cpu_per_turn(
    cpu_ms: dict[str, float], turns: int, background_ms_per_s: dict[str, float], wall_s: float
) -> dict[str, float]:
    """CPU ms per turn by role over a round, with the API tier (gateway + session hosts),
    all of the server's processes, and Ray's idle background over the round's length."""
    if not cpu_ms or not turns:
        return {}
    out = {role: round(ms / turns, 3) for role, ms in cpu_ms.items()}
    out["api_tier"] = round((cpu_ms.get("gateway", 0.0) + cpu_ms.get("session_host", 0.0)) / turns, 3)
    out["all"] = round(sum(cpu_ms.values()) / turns, 3)
    out["ray_background"] = round(background_ms_per_s.get("ray", 0.0) * wall_s / turns, 3)
    return out


def summarise(
    run: Run,
    reference: list[float],
    reference_cpu_ms: float,
    skip: int,
    *,
    cpu_ms: dict[str, float] | None = None,
    background_ms_per_s: dict[str, float] | None = None,
    wall_s: float = 0.0,
) -> dict[str, Any]:
    """One run's (or round's) figures: medians over its turns past the first ``skip``; CPU
    over all its turns."""
    turns = run.turns[skip:]
    ours = [t.total_ms - t.model_ms for t in turns if t.model_ms is not None]
    ref = reference[skip:]
    api = [t.api_overhead_ms for t in turns if t.api_overhead_ms is not None]
    n = len(run.turns)
    out: dict[str, Any] = {
        "turns": len(turns),
        "server_nonmodel_ms": median(ours, 3),
        "reference_ms": median(ref, 3),
        "ratio": round(m_ours / m_ref, 2)
        if (m_ours := median(ours, None)) and (m_ref := median(ref, None))
        else None,
        "server_api_overhead_ms": median(api, 3),
        "server_backend_ms": median([t.backend_ms for t in turns if t.backend_ms is not None], 3),
        "frames_per_turn": median([len(t.frames) for t in turns], 3),
        "bytes_per_turn": median([sum(len(f) for f in t.frames) for t in turns], 3),
        "server_deflate": run.deflate,
        "server_cpu_ms_per_turn": None if run.cpu_ms is None else round(run.cpu_ms / n, 3),
        "reference_cpu_ms_per_turn": round(reference_cpu_ms / n, 3) if n else None,
    }
    if cpu_ms:
        by_role = cpu_per_turn(cpu_ms, n, background_ms_per_s or {}, wall_s)
        out["cpu_ms_per_turn"] = by_role
        out["server_cpu_ms_per_turn"] = by_role["all"]
        ref_cpu = out["reference_cpu_ms_per_turn"]
        out["api_tier_cpu_ratio"] = round(by_role["api_tier"] / ref_cpu, 2) if ref_cpu else None
    out["client_minus_server_ms"] = round(out["server_nonmodel_ms"] - out["server_api_overhead_ms"], 3)
    names = sorted({k for t in turns for k in t.phases})
    out["server_phases_ms"] = {k: median([t.phases[k] for t in turns if k in t.phases], 3) for k in names}
    return out


SPREAD_KEYS = ("server_nonmodel_ms", "reference_ms", "ratio", "server_api_overhead_ms", "server_backend_ms")


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread over rounds of each round's medians (and of its CPU per turn by role)."""
    out: dict[str, Any] = {"rounds": len(rounds)}
    for key in (
        *SPREAD_KEYS,
        "reference_cpu_ms_per_turn",
        "api_tier_cpu_ratio",
        "reference_block_cpu_ms_per_turn",
        "api_tier_cpu_ratio_block",
    ):
        out[key] = rounds_spread([r.get(key) for r in rounds])
    roles = sorted({k for r in rounds for k in r.get("cpu_ms_per_turn", {})})
    out["cpu_ms_per_turn"] = {k: rounds_spread([r["cpu_ms_per_turn"].get(k) for r in rounds]) for k in roles}
    ray = sorted({k for r in rounds for k in r.get("ray_cpu_ms_per_turn_by_process", {})})
    out["ray_cpu_ms_per_turn_by_process"] = {
        k: rounds_spread([r["ray_cpu_ms_per_turn_by_process"].get(k) for r in rounds]) for k in ray
    }
    phases = sorted({k for r in rounds for k in r.get("server_phases_ms", {})})
    out["server_phases_ms"] = {
        k: rounds_spread([r["server_phases_ms"].get(k) for r in rounds]) for k in phases
    }
    return out


def fmt(s: dict[str, float] | None, unit: str = " ms") -> str:
    """``median (p25-p75, min-max)``."""
    if not s:
        return "n/a"
    return f"{s['median']:.2f}{unit} (p25-p75 {s['p25']:.2f}-{s['p75']:.2f}, min-max {s['min']:.2f}-{s['max']:.2f})"


# ----------------------------------------------------------------------------- the client's own cost


def client_costs(run: Run, skip: int, repeat: int = 3) -> dict[str, float | None]:
    """ms per turn, median over the recorded turns (each the best of ``repeat``): the raw
    client's ``json.loads`` of every frame against the openai SDK's parse of the same frames
    into its event types (``construct_type_unchecked(..., ResponsesServerEvent)``, what its
    ``recv()`` does), and the create's encoding both ways (``json.dumps`` against the SDK's
    ``maybe_transform`` then ``json.dumps``)."""
    from openai._models import construct_type_unchecked
    from openai._utils import maybe_transform
    from openai.types.responses.responses_client_event_param import ResponsesClientEventParam
    from openai.types.responses.responses_server_event import ResponsesServerEvent

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return min(times)

    rows: dict[str, list[float]] = {
        "raw_parse_ms": [],
        "sdk_parse_ms": [],
        "raw_encode_ms": [],
        "sdk_encode_ms": [],
    }
    for turn in run.turns[skip:]:
        body = json.loads(turn.create)
        rows["raw_parse_ms"].append(best(lambda t=turn: [json.loads(f) for f in t.frames]))
        rows["sdk_parse_ms"].append(
            best(
                lambda t=turn: [
                    construct_type_unchecked(value=json.loads(f), type_=cast(Any, ResponsesServerEvent))
                    for f in t.frames
                ]
            )
        )
        rows["raw_encode_ms"].append(best(lambda b=body: json.dumps(b)))
        rows["sdk_encode_ms"].append(
            best(lambda b=body: json.dumps(maybe_transform(b, ResponsesClientEventParam)))
        )
    return {k: median(v, 3) for k, v in rows.items()}


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
    p.add_argument("--idle-s", type=float, default=3.0, help="idle window measuring the background CPU rate")
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
            settled = settle(procs, sum(idle.values())) if procs else None
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
