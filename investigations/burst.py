"""First turns of resumed sessions, all at once: how long each socket waits.

    python -m investigations.burst [--sockets 32] [--config FILE] [--out results/burst.json]

``--sockets`` WebSockets open; each rollout's resumed history (the ``codex`` preset, ~60k
tokens) is put in the prefix cache first (``generate:false``, as ``bench agentloop`` does);
then every socket sends its first turn — history plus task — at the same moment.  Per socket
it reports when ``response.created`` arrived, the turn's total time, the server's model time
(queue + prefill + decode) and API phases (``responses_ws.timings``), and the non-model time
(total − model).  Before the burst it times tokenising one such history with tiktoken on this
process's main thread and on a worker thread (``--config`` with
``session.render_offload_chars: 0`` keeps the server's tokenising on its event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench import results
from bench import workload as wl
from bench.client import connect
from bench.conversation import TIMINGS_KEY
from bench.runner.agent import first_input
from serve.embedded import embedded_server, local_config

API_KEY = "sk-bench"
MODEL_PHASES = ("queue", "prefill", "decode")


def tokenise_where(w: wl.Workload, repeats: int = 10) -> dict[str, float]:
    """Median ms to tokenise rollout 0's first input on the main thread and on a worker."""
    from inference.tokenizer import encode

    text = json.dumps(first_input(w, 0))
    encode(text)

    def median_ms() -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            encode(text)
            times.append((time.perf_counter() - t) * 1000.0)
        return statistics.median(times)

    out = {"main_thread_ms": median_ms()}
    worker = threading.Thread(target=lambda: out.update(worker_thread_ms=median_ms()))
    worker.start()
    worker.join()
    return {k: round(v, 2) for k, v in out.items()}


async def first_turn(url: str, w: wl.Workload, rollout: int, go: asyncio.Event) -> dict[str, Any]:
    socket = await connect(url, api_key=API_KEY)
    try:
        body = {**wl.fixed(w), "metadata": {**wl.metadata(w, rollout), TIMINGS_KEY: "1"}}
        await go.wait()
        t0 = time.perf_counter()
        answer = await socket.create(**body, input=first_input(w, rollout), store=False)
    finally:
        await socket.close()
    types = [e.get("type") for e in answer.events]
    if answer.response is None or "response.created" not in types:
        raise RuntimeError(f"rollout {rollout}'s first turn failed: {answer.last}")
    server = json.loads(answer.response["metadata"][TIMINGS_KEY])
    total = (answer.stamps[-1] - t0) * 1000.0
    model = sum(server[p] for p in MODEL_PHASES)
    return {
        "rollout": rollout,
        "created_ms": round((answer.stamps[types.index("response.created")] - t0) * 1000.0, 1),
        "total_ms": round(total, 1),
        "model_ms": round(model, 1),
        "nonmodel_ms": round(total - model, 1),
        "server": server,
    }


async def warm_resumed(url: str, w: wl.Workload, rollouts: range, api_key: str) -> None:
    """Each rollout's resumed history in the prefix cache first: one ``generate:false`` create
    a rollout (docs/protocol.md §4.11) over one socket."""
    socket = await connect(url, api_key=api_key)
    try:
        for r in rollouts:
            answer = await socket.create(**wl.fixed(w), input=wl.history(w, r), store=False, generate=False)
            if answer.response is None or answer.response.get("status") != "completed":
                raise RuntimeError(f"warming rollout {r}'s history failed: {answer.last}")
    finally:
        await socket.close()


async def measure(url: str, w: wl.Workload, sockets: int) -> list[dict[str, Any]]:
    await warm_resumed(url, w, range(sockets), API_KEY)
    go = asyncio.Event()
    tasks = [asyncio.create_task(first_turn(url, w, r, go)) for r in range(sockets)]
    await asyncio.sleep(1.0)  # every socket open and waiting
    go.set()
    return sorted(await asyncio.gather(*tasks), key=lambda r: r["created_ms"])


def summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    return {
        "created_ms": {
            "min": min(t["created_ms"] for t in turns),
            "median": med([t["created_ms"] for t in turns]),
            "max": max(t["created_ms"] for t in turns),
        },
        "nonmodel_ms_median": med([t["nonmodel_ms"] for t in turns]),
        "server_ms_median": {
            p: med([t["server"][p] for t in turns])
            for p in ("parse_validate", "render", "classify", "api_overhead")
        },
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sockets", type=int, default=32)
    p.add_argument("--config", type=Path, default=None, help="server YAML for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/burst.json"))


def run(args: argparse.Namespace) -> int:
    w = wl.PRESETS["codex"]
    where = tokenise_where(w)
    print(
        f"tokenising one first input (~{w.resume_tokens // 1000}k tokens): main thread "
        f"{where['main_thread_ms']} ms, worker thread {where['worker_thread_ms']} ms (medians)"
    )
    with embedded_server(local_config(args.config)) as url:
        turns = asyncio.run(measure(url, w, args.sockets))
    s = summary(turns)
    print(
        f"{args.sockets} first turns at once: response.created after {s['created_ms']['min']} ms (first) / "
        f"{s['created_ms']['median']} ms (median) / {s['created_ms']['max']} ms (last); "
        f"non-model time per socket, median {s['nonmodel_ms_median']} ms"
    )
    print("server phases, medians (ms): " + ", ".join(f"{k} {v}" for k, v in s["server_ms_median"].items()))
    results.write(
        args.out,
        {"command": args.command, "sockets": args.sockets, "tokenise": where, "summary": s, "turns": turns},
        args.run,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.burst"))
