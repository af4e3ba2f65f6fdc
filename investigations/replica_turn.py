"""An inference replica's CPU per steady turn under a crowd, without Ray: its engine behind
its direct channel in a process of its own, driven from another over the channel.

    python -m investigations.replica_turn [--sessions 256] [--seconds 20] [--rounds 2] [--pause S]

A replica process serves :class:`inference.channel.ChannelServer` over ``Engine.generate``
(the deployment's pair, with its allocator and collector settings, and no Ray); a driver
process runs ``--sessions`` conversations over one :class:`inference.channel.ChannelClient`,
as a session host's calls go: the ``crowd`` preset's shape (7500 shared prompt tokens, the 8
function tools and the knobs of ``bench/workload.py``, ~450 tokens of tool output a turn,
1-3 s between turns, each answer's ids appended; ``--pause S``: S seconds instead, so
``--sessions 1 --pause 0`` is one conversation's turns back to back, as ``bench floor`` sends them).  After ``--seconds`` / 4 of warm-up it
reads the replica's CPU (``/proc/<pid>/stat``, every thread) over ``--seconds`` and prints
milliseconds per turn, how long its threads waited for a core per turn (``schedstat``), the
turns, and how late the answers' last items arrived after their deadline (the replica's
loop and the channel; p50/p99, ms).  ``--profile FILE``: the replica
runs under ``cProfile`` and writes its statistics to ``FILE`` when the driver stops it
(read them with ``python -m pstats FILE``; the profiler slows the replica several-fold, so
that round's CPU figure is not the replica's own).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import random
import signal
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any


def serve(profile: str | None = None) -> None:
    """The replica process: prints its endpoint as one JSON line, serves until terminated
    (``SIGTERM``; with ``profile``, its ``cProfile`` statistics are written there first)."""
    from inference import allocator, collector
    from inference.channel import ChannelServer
    from inference.emulator import policy
    from inference.emulator.engine import Engine
    from inference.emulator.pacing import AsyncioSleeper, MonotonicClock
    from inference.emulator.profiles import load_inference_config

    allocator.tune()

    async def main() -> None:
        clock = MonotonicClock()
        engine = Engine(load_inference_config(), clock, AsyncioSleeper(clock))
        server = ChannelServer(engine.generate, "replica")
        endpoint = await server.start("127.0.0.1")
        policy.text_answer(1, random.Random(0))
        collector.freeze_startup()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(
            json.dumps({"port": endpoint.port, "token": endpoint.token.hex(), "pid": os.getpid()}), flush=True
        )
        await stop.wait()

    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    asyncio.run(main())
    if profiler is not None and profile:
        profiler.disable()
        profiler.dump_stats(profile)


def _schedstat_ms(pid: int) -> tuple[float, float]:
    """The process's threads' time on a core and waiting for one (ms, ``schedstat``)."""
    run = wait = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:  # a thread that ended
            continue
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e6, wait / 1e6


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(
    sessions: int, seconds: float, profile: str | None = None, pause: float | None = None
) -> dict[str, Any]:
    from bench import workload
    from inference.channel import ChannelClient, Endpoint
    from inference.types import Done, InferenceRequest, Prefilled, ToolSpec

    serving = ["--serve"] + (["--profile", profile] if profile else [])
    replica = subprocess.Popen(
        [sys.executable, "-m", "investigations.replica_turn", *serving], stdout=subprocess.PIPE, text=True
    )
    try:
        assert replica.stdout is not None
        where = json.loads(replica.stdout.readline())
        print(f"replica pid {where['pid']}", flush=True)
        w = workload.PRESETS["crowd"]
        tools = tuple(ToolSpec(t["name"], t["parameters"]) for t in workload.tools(w))
        rng = random.Random(1)
        pool = array("I", [rng.randrange(100_000) for _ in range(200_000)])
        shared = pool[:7500]
        turns: list[float] = []  # when each turn ended
        late: list[tuple[float, float]] = []  # (end, ms after the model's own time)

        async def conversation(client: ChannelClient, i: int, stop: asyncio.Event) -> None:
            await asyncio.sleep(rng.random() * 2)
            n = 0
            while not stop.is_set():
                rollout, turn = divmod(n, w.tool_rounds + 1)
                if turn == 0:
                    history = array("I", shared)
                    knobs = tuple(workload.metadata(w, i * 1000 + rollout).items())
                k = rng.randrange(len(pool) - 450)
                history.extend(pool[k : k + 450])
                request = InferenceRequest(
                    request_id=f"r{i}-{n}",
                    model=w.model,
                    prompt_token_ids=array("I", history),
                    tools=tools,
                    tool_results_in_context=turn,
                    session_key=f"s{i}",
                    cache_scope="key",
                    metadata=knobs,
                )
                n += 1
                t0, model_ms = time.monotonic(), 0.0
                async for chunk in client.stream(request):
                    if isinstance(chunk[0], Prefilled):
                        model_ms += chunk[0].queue_ms + chunk[0].prefill_ms
                    done = chunk[-1]
                    if isinstance(done, Done):
                        end = time.monotonic()
                        turns.append(end)
                        late.append((end, (end - t0) * 1000.0 - model_ms - done.decode_ms))
                        if done.context_token_ids:
                            history.extend(done.context_token_ids)
                await asyncio.sleep(1 + 2 * rng.random() if pause is None else pause)

        async def crowd() -> dict[str, Any]:
            client = ChannelClient(
                Endpoint("replica", "127.0.0.1", where["port"], bytes.fromhex(where["token"]))
            )
            await client.connect()
            stop = asyncio.Event()
            tasks = [asyncio.create_task(conversation(client, i, stop)) for i in range(sessions)]
            await asyncio.sleep(seconds / 4)
            t0, cpu0, sched0 = time.monotonic(), _cpu_s(where["pid"]), _schedstat_ms(where["pid"])
            await asyncio.sleep(seconds)
            t1, cpu1, sched1 = time.monotonic(), _cpu_s(where["pid"]), _schedstat_ms(where["pid"])
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            client.close()
            n = sum(1 for t in turns if t0 <= t < t1)
            tail = sorted(ms for t, ms in late if t0 <= t < t1)
            return {
                "turns": n,
                "turns_per_s": round(n / (t1 - t0), 1),
                "replica_cpu_ms_per_turn": round((cpu1 - cpu0) * 1000.0 / max(n, 1), 3),
                "replica_waited_for_a_core_ms_per_turn": round((sched1[1] - sched0[1]) / max(n, 1), 3),
                "late_ms": {
                    "p50": round(tail[len(tail) // 2], 2),
                    "p99": round(tail[int(0.99 * (len(tail) - 1))], 2),
                },
            }

        return asyncio.run(crowd())
    finally:
        replica.terminate()
        try:
            replica.wait(timeout=30)
        except subprocess.TimeoutExpired:
            replica.kill()
            replica.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", help="write the replica's cProfile statistics to this file")
    p.add_argument("--pause", type=float, help="seconds between a conversation's turns (1-3 s by default)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the replica process
    args = p.parse_args()
    if args.serve:
        serve(args.profile)
        return
    for r in range(args.rounds):
        print(
            f"round {r + 1}: {json.dumps(drive(args.sessions, args.seconds, args.profile, args.pause))}",
            flush=True,
        )


if __name__ == "__main__":
    main()
