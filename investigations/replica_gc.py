"""What garbage collection costs an emulator replica's event loop under a crowd, with this
checkout's prefix cache and with an earlier commit's, each in a fresh process, alternating.

    python -m investigations.replica_gc [--against 0d52c0d] [--rounds 2] [--sessions 256] [--seconds 30]

One process per run drives the replica's ``Engine`` on the real clock (no Ray, no sockets):
``--sessions`` conversations that share a 7500-token prefix (instructions and tools), each
turn adding 420 tokens of tool output and the model's answer, one turn every 1-3 s, a new
conversation every 20 turns (the ``crowd`` preset's shape), until the default 1M-token prefix
cache is full and evicts as many blocks as it adds.  It prints each run's collections (count,
total and longest pause by generation, CPU time, from ``gc.callbacks``) and how late each
answer's last item left after its deadline (p50/p99/max, ms; the first fifth of the turns
left out): the replica's part of a turn's ``backend`` timing (docs/emulator.md, "The model").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import subprocess
import sys
import time
from array import array
from typing import Any

from investigations.earlier import earlier_module

PREFIX_CACHE = "inference/emulator/prefix_cache.py"


def run(sessions: int, seconds: float, against: str | None) -> dict[str, Any]:
    from inference import collector
    from inference.emulator import engine as engine_module
    from inference.emulator.pacing import AsyncioSleeper, MonotonicClock
    from inference.emulator.profiles import load_inference_config
    from inference.types import Done, InferenceRequest, Prefilled

    if against is not None:
        earlier = earlier_module(against, PREFIX_CACHE, "prefix_cache_earlier")
        vars(engine_module)["PrefixCache"] = earlier.PrefixCache  # the engine's cache, as of ``against``
    clock = MonotonicClock()
    engine = engine_module.Engine(load_inference_config(), clock, AsyncioSleeper(clock))
    collector.freeze_startup()
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            pauses.append((info["generation"], (time.thread_time() - started[0]) * 1000.0))

    rng = random.Random(1)
    pool = array("I", [rng.randrange(100_000) for _ in range(200_000)])
    shared = pool[:7500]
    late: list[float] = []

    async def conversation(i: int, stop: asyncio.Event) -> None:
        history = array("I", shared)
        await asyncio.sleep(rng.random() * 2)
        n = 0
        while not stop.is_set():
            if n % 20 == 0:
                history = array("I", shared)
            k = rng.randrange(len(pool) - 420)
            history.extend(pool[k : k + 420])
            request = InferenceRequest(
                request_id=f"r{i}-{n}",
                model="emu-fast",
                prompt_token_ids=array("I", history),
                session_key=f"s{i}",
                cache_scope="key",
            )
            n += 1
            t0, model_ms = clock.now(), 0.0
            async for item in engine.generate(request):
                if isinstance(item[0], Prefilled):
                    model_ms += item[0].queue_ms + item[0].prefill_ms
                done = item[-1]
                if isinstance(done, Done):
                    late.append((clock.now() - t0) * 1000.0 - model_ms - done.decode_ms)
                    if done.context_token_ids:
                        history.extend(done.context_token_ids)
            await asyncio.sleep(1 + 2 * rng.random())

    async def crowd() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(conversation(i, stop)) for i in range(sessions)]
        await asyncio.sleep(seconds)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    gc.callbacks.append(on_gc)
    asyncio.run(crowd())
    gc.callbacks.remove(on_gc)
    tail = sorted(late[len(late) // 5 :])
    by_gen = {
        g: {"count": len(v), "total_ms": round(sum(v), 1), "max_ms": round(max(v), 2)}
        for g in (0, 1, 2)
        if (v := [ms for gen, ms in pauses if gen == g])
    }
    return {
        "turns": len(late),
        "evicted_blocks": engine.prefix_cache.evicted_blocks,
        "gc": by_gen,
        "last_item_late_ms": {
            "p50": round(tail[len(tail) // 2], 2),
            "p99": round(tail[int(0.99 * (len(tail) - 1))], 2),
            "max": round(tail[-1], 2),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="0d52c0d", help="the earlier commit")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--child", help=argparse.SUPPRESS)  # "this" or a commit: one run, JSON out
    args = p.parse_args()
    if args.child:
        against = None if args.child == "this" else args.child
        print(json.dumps(run(args.sessions, args.seconds, against)))
        return
    for r in range(args.rounds):
        for variant in (args.against, "this"):
            out = subprocess.run(
                [sys.executable, "-m", "investigations.replica_gc", "--child", variant]
                + ["--sessions", str(args.sessions), "--seconds", str(args.seconds)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            print(f"round {r + 1}, {variant}: {out.strip()}", flush=True)


if __name__ == "__main__":
    main()
