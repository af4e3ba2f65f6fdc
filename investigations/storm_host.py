"""A crowd's first turns released at once on one session host, in this process, with real
sockets: the host's CPU a first create, its event-loop lag, and the storm's wall time, round
after round.

    python -m investigations.storm_host [--loops 256] [--rounds 8] [--stages] [--profile FILE]
                                        [--out results/storm_host.json]

This process is the host's event loop (uvloop, as a Ray actor's), put together as
:mod:`investigations.host_turn` puts it (the product's WebSocket, Connection, Sender and
session cores sharing one host's prompt parts, a SQLite store writer journaling the
``store:false`` ledger lines, the loop-lag watch); the model is canned (no Ray, no channel:
the call's start over the channel is not in these figures): each call answers a tool call
in an emulator replica's chunks a few milliseconds apart.  A client subprocess opens
``--loops`` sockets, then sends each its first create of ``bench capacity``'s ``crowd``
workload (the same ~30 KB of instructions and tools, each loop's own task and metadata: the
bench's own :class:`bench.runner.loop.Loop` builds them, asking for the server's figures as
the bench does unless ``--no-timings``) at once, and waits for every
terminal event; then it closes them.  Per round, over the storm (the release to the last
terminal event the client read): this process's CPU (every thread) and this thread's,
each per first create, the host's worst event-loop stall (:class:`~actors.host.loop_watch.LoopWatch`),
its garbage collections (``gc.callbacks``: how many, their time by generation),
and the client's p50/p99/max turn time (the canned model's ~6 ms included).  The first
round pays the host's one-time renderings and is reported apart.

``--stages`` adds this thread's CPU in each stage per first create, and how often each ran
(:data:`investigations.host_turn.STAGES`, measurement only); ``--profile FILE`` records this
process with ``py-spy`` (speedscope, ``--rate`` a second) over the rounds after the first
(their sockets' opening and closing too); ``--cprofile FILE`` keeps :mod:`cProfile`'s stats
of the storms after the first alone (its own cost inflates small, frequent calls).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

CALL = json.dumps({"command": ["bash", "-lc", "rg -n 'def main' src/"]})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loops", type=int, default=256)
    p.add_argument("--rounds", type=int, default=8, help="storms, each on fresh sockets")
    p.add_argument("--stages", action="store_true", help="the CPU of each stage per first create too")
    p.add_argument("--profile", type=Path, default=None, help="a py-spy recording (speedscope) here")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    p.add_argument(
        "--cprofile", type=Path, default=None, help="cProfile's stats of the storms after the first here"
    )
    p.add_argument("--session", default="{}", help="the session config's fields to set (JSON)")
    p.add_argument(
        "--no-timings", action="store_true", help="creates that do not ask for the server's figures"
    )
    p.add_argument(
        "--no-gc-pacing", action="store_true", help="young collections not held while the loop is behind"
    )
    p.add_argument("--out", type=Path, default=Path("results/storm_host.json"))
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)


# ----------------------------------------------------------------------------- the client


def client(args: argparse.Namespace) -> None:
    """The loops (the client subprocess): for each round, opens ``--loops`` sockets, prints
    ``open``, waits for a line on stdin, sends every first create at once, prints the turn
    times (JSON) once every terminal event is read, closes the sockets."""
    import websockets

    from bench.conversation import TIMINGS_KEY
    from bench.runner.channels import Channel
    from bench.runner.loop import Encoder, Loop, Pace
    from bench.runner.loop import workload as loop_workload

    enc = Encoder.build(loop_workload("crowd", 0, None), "ws", False, "storm")
    url = f"ws://127.0.0.1:{args.port}/v1/responses"

    async def one(ws: Any, create: str) -> float:
        t0 = time.perf_counter()
        await ws.send(create)
        while True:
            message = await ws.recv()
            head = message[:60] if isinstance(message, str) else message[:60].decode()
            if '"response.completed"' in head or '"response.failed"' in head or '"error"' in head:
                return (time.perf_counter() - t0) * 1000

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for r in range(args.rounds):
            creates = [
                Loop(r * args.loops + i, url, enc, Pace(1), [], Channel).first_create()
                for i in range(args.loops)
            ]
            if args.no_timings:  # the metadata's key as bench.runner.loop encodes it
                creates = [c.replace(f', "{TIMINGS_KEY}": "1"', "") for c in creates]
                assert TIMINGS_KEY not in creates[0]
            sockets = [
                await websockets.connect(url, max_size=None, compression=None) for _ in range(args.loops)
            ]
            print("open", flush=True)
            await loop.run_in_executor(None, sys.stdin.readline)
            times = await asyncio.gather(*(one(ws, c) for ws, c in zip(sockets, creates, strict=True)))
            print(json.dumps(times), flush=True)
            await asyncio.gather(*(ws.close() for ws in sockets))

    asyncio.run(main())


# ----------------------------------------------------------------------------- the host


async def host(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    from actors.config import SessionConfig
    from actors.core.cache_budget import CacheBudget
    from actors.core.lanes import HostBudget
    from inference import collector, tokenizer
    from inference.types import Done, FunctionCallDelta, InferenceEvent, InferenceRequest, Prefilled
    from investigations import host_turn

    async def answer(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        n = len(request.prompt_token_ids)
        await asyncio.sleep(0.004)
        yield [Prefilled(n, 0, 0.0, 4.0, replica="r"), FunctionCallDelta(0, "shell", CALL[:10], 3)]
        await asyncio.sleep(0.002)
        yield [FunctionCallDelta(0, "shell", CALL[10:], 12)]
        await asyncio.sleep(0.001)
        yield [Done("tool_calls", 15, 3.0)]

    if args.stages:
        host_turn.wrap_stages()

    tokenizer.encode("warm up")
    collector.freeze_startup()
    collector.serving()
    config = SessionConfig(**json.loads(args.session))
    cache: HostBudget = CacheBudget(config.host_max_cached_tokens)
    server, port, watch = await host_turn.serve(
        data_dir, answer, config, cache=cache, gc_pacing=not args.no_gc_pacing
    )
    argv = [sys.executable, "-m", "investigations.storm_host", "--client", "--port", str(port)]
    argv += ["--loops", str(args.loops), "--rounds", str(args.rounds)]
    argv += ["--no-timings"] if args.no_timings else []
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    collections: list[tuple[int, float]] = []  # (generation, seconds) of each garbage collection
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            collections.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    spy: subprocess.Popen[bytes] | None = None
    profiler = cProfile.Profile(time.thread_time) if args.cprofile is not None else None
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if line.strip() != b"open":
                raise RuntimeError(f"the client process said {line!r}")
            await asyncio.sleep(0.2)  # the upgrades' aftermath settles
            if r == 1 and args.profile is not None:
                spy = _record(args.profile, args.rate)
                await asyncio.sleep(1.0)  # py-spy attached
            collections.clear()
            before = {name: entry[1] for name, entry in host_turn.ACC.items()}
            calls = {name: entry[0] for name, entry in host_turn.ACC.items()}
            since = time.perf_counter()
            cpu0, thread0 = time.process_time(), time.thread_time()
            if profiler is not None and r > 0:
                profiler.enable()
            proc.stdin.write(b"go\n")
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if profiler is not None:
                profiler.disable()
            cpu, thread = time.process_time() - cpu0, time.thread_time() - thread0
            wall = time.perf_counter() - since
            times = sorted(json.loads(line))
            n = len(times)
            row: dict[str, Any] = {
                "cpu_ms_per_first_create": round(cpu * 1000 / n, 3),
                "loop_thread_ms_per_first_create": round(thread * 1000 / n, 3),
                "storm_s": round(wall, 3),
                "loop_lag_max_ms": round(watch.worst_since(since) * 1000, 1),
                "gc_ms_by_generation": {
                    g: round(sum(s for gen, s in collections if gen == g) * 1000, 1)
                    for g in sorted({gen for gen, _ in collections})
                },
                "gc_collections": len(collections),
                "turn_ms": {
                    "p50": round(times[n // 2], 1),
                    "p99": round(times[min(n - 1, int(0.99 * n))], 1),
                    "max": round(times[-1], 1),
                },
            }
            if args.stages:
                row["stages_ms_per_first_create"] = {
                    name: round((host_turn.ACC[name][1] - before.get(name, 0.0)) * 1000 / n, 3)
                    for name, *_ in host_turn.STAGES
                    if name in host_turn.ACC
                }
                row["stage_calls_per_first_create"] = {
                    name: round((host_turn.ACC[name][0] - calls.get(name, 0.0)) / n, 2)
                    for name, *_ in host_turn.STAGES
                    if name in host_turn.ACC
                }
            rounds.append(row)
            print(json.dumps({"round": r, **row}), file=sys.stderr, flush=True)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(timeout=60)
        proc.kill()
        await proc.wait()
        server.close()
        if profiler is not None:
            profiler.dump_stats(args.cprofile)
    later = rounds[1:] or rounds
    return {
        "loops": args.loops,
        "first_round": rounds[0] if rounds else None,
        "later_rounds": {
            key: {
                "median": round(statistics.median(r[key] for r in later), 3),
                "min": min(r[key] for r in later),
                "max": max(r[key] for r in later),
            }
            for key in (
                "cpu_ms_per_first_create",
                "loop_thread_ms_per_first_create",
                "storm_s",
                "loop_lag_max_ms",
            )
        },
        "turn_p99_ms_median": round(statistics.median(r["turn_ms"]["p99"] for r in later), 1),
        "turn_p50_ms_median": round(statistics.median(r["turn_ms"]["p50"] for r in later), 1),
        "rounds": rounds,
        "load_average": os.getloadavg()[0],
    }


def _record(path: Path, rate: int) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).parent / "py-spy"
    cmd = [str(spy), "record", "-r", str(rate), "-f", "speedscope", "-o", str(path), "-p", str(os.getpid())]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(args: argparse.Namespace) -> int:
    import uvloop

    from bench import results

    with tempfile.TemporaryDirectory() as data_dir:
        payload = uvloop.run(host(args, data_dir))
    print(json.dumps({k: v for k, v in payload.items() if k != "rounds"}, indent=1))
    print(f"wrote {results.write(args.out, payload, args.run)}")
    sys.stdout.flush()
    os._exit(0)  # the writer's thread and the store's: nothing left to flush


if __name__ == "__main__":
    if "--client" in sys.argv:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        client(parser.parse_args())
        raise SystemExit(0)
    from investigations import main

    raise SystemExit(main("investigations.storm_host"))
