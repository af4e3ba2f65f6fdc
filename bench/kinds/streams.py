"""Concurrent streams end to end: N WebSocket clients each read one long answer at once.

    responses-ws bench streams [--streams 64] [--tokens 2000] [--repeats 3]
                               [--compression deflate|none] [--client-procs 2] [--max-items-per-s N|none]
                               [--out results/streams.json]

Starts an embedded server whose inference config adds the bench profiles
(:mod:`bench.bench_profiles`); the streams use ``bench-flat``, the ideal hardware (1000 tok/s per
stream whatever the batch, up to 64 running), on the one inference replica the default
config has, so ``--streams`` × 1000 tok/s is what the machine is asked to deliver.  The
clients run in ``--client-procs`` processes of their own (outside the server, and not
sharing one event loop among 64 sockets); each stream is one WebSocket (permessage-deflate
negotiated by default, as Codex does) that opens, warms up with a one-token turn, waits for
the common start and sends one ``store:false`` create for ``--tokens`` tokens of text.

Per stream, as its client receives it: delivered rate = tokens after the first / time from
the first ``response.output_text.delta`` to the last (the tokens are the terminal event's
``usage.output_tokens``; the first delta holds the first token alone).  Per round: the
minimum, the 10th percentile and the median of those rates, the aggregate (all tokens / the
time from the first create sent to the last delta), TTFT, deltas per stream, and the CPU the
session host, the inference replica and the clients used (cores = CPU seconds / wall time).
The target (docs/performance.md): every stream at >= 95 % of 1000 tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import bench_profiles as profiles
from .. import results
from ..client import connect
from ..processes import actor_pids, cpu_by_pid, session_host_pids
from ..stats import median

MODEL = "bench-flat"
TARGET_TOK_S = 1000.0
DELTA = "response.output_text.delta"
REPLICA_CLASS = "InferenceDeployment"


def server_config(streams: int, max_items_per_s: str | None) -> Any:
    inference = profiles.bench_inference_config().model_dump()
    if max_items_per_s is not None:  # the replica's item budget for the streams' profile
        flat = next(p for p in inference["profiles"] if p["id"] == MODEL)
        flat["max_items_per_s"] = None if max_items_per_s == "none" else float(max_items_per_s)
    return local_config(
        **{"session.warm_actors": streams + 1, **{f"inference.{k}": v for k, v in inference.items()}}
    )


# --- the clients (in processes of their own) ------------------------------------------------


async def one_stream(sock, tokens: int, start_at: float) -> dict[str, Any]:
    """Wait for ``start_at`` (``time.monotonic``, shared by every process on this machine),
    send the create and stamp the deltas on arrival."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    sent = time.monotonic()
    await sock.ws.send(
        json.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "input": "write",
                "store": False,
                "max_output_tokens": tokens,
                "metadata": {"emulator.text_tokens": str(tokens)},
            }
        )
    )
    first = last = None
    deltas = 0
    while True:
        event = json.loads(await sock.ws.recv())
        now = time.monotonic()
        kind = event.get("type")
        if kind == DELTA:
            deltas += 1
            last = now
            if first is None:
                first = now
        elif kind in ("response.completed", "response.incomplete", "response.failed", "error"):
            usage = (event.get("response") or {}).get("usage") or {}
            return {
                "sent": sent,
                "first": first,
                "last": last,
                "deltas": deltas,
                "output_tokens": usage.get("output_tokens", 0),
                "error": None if kind in ("response.completed", "response.incomplete") else kind,
            }


async def client_main(url: str, count: int, tokens: int, compression: str | None, pipe: Connection) -> None:
    socks = [await connect(url, compression=compression, open_timeout=60) for _ in range(count)]
    for sock in socks:  # the path is warm before the round
        await sock.create(model=MODEL, input="hi", store=False, max_output_tokens=1)
    pipe.send("ready")
    loop = asyncio.get_running_loop()
    while (msg := await loop.run_in_executor(None, pipe.recv)) != "stop":
        pipe.send(await asyncio.gather(*(one_stream(s, tokens, msg) for s in socks)))
    await asyncio.gather(*(s.close() for s in socks), return_exceptions=True)


def client_process(url: str, count: int, tokens: int, compression: str | None, pipe: Connection) -> None:
    asyncio.run(client_main(url, count, tokens, compression, pipe))


# --- the run ---------------------------------------------------------------------------------


def summarise(streams: list[dict[str, Any]], cpu: dict[str, float]) -> dict[str, Any]:
    ok = [s for s in streams if s["error"] is None and s["first"] is not None and s["last"] > s["first"]]
    rates = sorted((s["output_tokens"] - 1) / (s["last"] - s["first"]) for s in ok)
    wall = max(s["last"] for s in ok) - min(s["sent"] for s in streams)
    ttft = [(s["first"] - s["sent"]) * 1000 for s in ok]
    t0 = min(s["sent"] for s in streams)
    total = sum(s["output_tokens"] for s in ok)
    return {
        "streams": len(streams),
        "errors": [s["error"] for s in streams if s["error"] is not None],
        "rate_tok_s": {
            "min": round(rates[0], 1),
            "p10": round(rates[len(rates) // 10], 1),
            "median": median(rates, 1),
            "max": round(rates[-1], 1),
            "each": [round(r, 1) for r in rates],
        },
        # per stream, in start order: ms from the round's first create to its first and last delta
        "streams_ms": [
            [round((s["first"] - t0) * 1000, 1), round((s["last"] - t0) * 1000, 1), s["deltas"]]
            for s in sorted(ok, key=lambda s: s["first"])
        ],
        "at_95pct": sum(r >= 0.95 * TARGET_TOK_S for r in rates),
        "aggregate_tok_s": round(total / wall, 1),
        "wall_s": round(wall, 3),
        "ttft_ms": {"median": median(ttft, 1), "max": round(max(ttft), 1)},
        "deltas_per_stream_median": median((s["deltas"] for s in ok), None),
        "tokens_per_delta": round(total / sum(s["deltas"] for s in ok), 2),
        "cpu_cores": {k: round(v / wall, 3) for k, v in cpu.items()},
        "cpu_ms_per_1k_tokens": {k: round(v * 1e6 / total, 1) for k, v in cpu.items()},
    }


def run_rounds(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")  # this process is a Ray driver: never fork it
    procs = max(1, min(args.client_procs, args.streams))
    shares = [args.streams // procs + (i < args.streams % procs) for i in range(procs)]
    compression = None if args.compression == "none" else args.compression
    pipes, workers = [], []
    for share in shares:
        here, there = ctx.Pipe()
        p = ctx.Process(
            target=client_process, args=(url, share, args.tokens, compression, there), daemon=True
        )
        p.start()
        pipes.append(here)
        workers.append(p)
    try:
        for pipe in pipes:
            assert pipe.recv() == "ready"
        groups: dict[str, list[int]] = {
            "host": session_host_pids(),
            "replica": actor_pids(REPLICA_CLASS),
            "clients": [p.pid for p in workers if p.pid is not None],  # all: started
        }
        print("pids: " + ", ".join(f"{k} {v}" for k, v in groups.items()), flush=True)
        rounds = []
        for i in range(args.repeats):
            before = {k: cpu_by_pid(v) for k, v in groups.items()}
            start_at = time.monotonic() + 0.3
            for pipe in pipes:
                pipe.send(start_at)
            streams = [s for pipe in pipes for s in pipe.recv()]
            after = {k: cpu_by_pid(v) for k, v in groups.items()}
            cpu = {k: sum(after[k][p] - before[k][p] for p in after[k]) for k in groups}
            r = summarise(streams, cpu)
            rounds.append(r)
            rate = r["rate_tok_s"]
            print(
                f"round {i + 1}: {args.streams} streams  per-stream tok/s min {rate['min']:.0f}  p10 "
                f"{rate['p10']:.0f}  median {rate['median']:.0f}  ({r['at_95pct']} at >= 95 %)  aggregate "
                f"{r['aggregate_tok_s']:.0f} tok/s  TTFT median/max {r['ttft_ms']['median']:.0f}/"
                f"{r['ttft_ms']['max']:.0f} ms  {r['tokens_per_delta']:.1f} tokens/delta  cores "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores"].items())
                + (f"  errors {r['errors']}" if r["errors"] else ""),
                flush=True,
            )
            time.sleep(1.0)
        for pipe in pipes:
            pipe.send("stop")
        return rounds
    finally:
        for p in workers:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2000, help="output tokens per stream")
    p.add_argument("--repeats", type=int, default=3, help="rounds, on the same sockets")
    p.add_argument("--compression", choices=("deflate", "none"), default="deflate")
    p.add_argument("--client-procs", type=int, default=2, help="client processes the streams are spread over")
    p.add_argument(
        "--max-items-per-s",
        default=None,
        help="the replica's item budget for bench-flat (a number, or none: no cap); default: the profile's",
    )
    p.add_argument("--out", type=Path, default=Path("results/streams.json"))


def run(args: argparse.Namespace) -> int:
    with embedded_server(server_config(args.streams, args.max_items_per_s)) as url:
        rounds = run_rounds(url, args)
    mins = [r["rate_tok_s"]["min"] for r in rounds]
    medians = [r["rate_tok_s"]["median"] for r in rounds]
    result = {
        "command": args.command,
        "model": MODEL,
        "target_tok_s_per_stream": TARGET_TOK_S,
        "streams": args.streams,
        "tokens": args.tokens,
        "compression": args.compression,
        "client_procs": args.client_procs,
        "max_items_per_s": args.max_items_per_s,
        "rounds": rounds,
        "summary": {
            "min_tok_s_median_of_rounds": median(mins, None),
            "median_tok_s_median_of_rounds": median(medians, None),
            "aggregate_tok_s_median_of_rounds": median((r["aggregate_tok_s"] for r in rounds), None),
            "all_at_95pct_rounds": sum(r["at_95pct"] == args.streams for r in rounds),
        },
    }
    results.write(args.out, result, args.run)
    s = result["summary"]
    print(
        f"median of {len(rounds)} rounds: slowest stream {s['min_tok_s_median_of_rounds']:.0f} tok/s, median stream "
        f"{s['median_tok_s_median_of_rounds']:.0f} tok/s, aggregate {s['aggregate_tok_s_median_of_rounds']:.0f} tok/s;"
        f" rounds with every stream >= 95 %: {s['all_at_95pct_rounds']}/{len(rounds)}  (saved {args.out})"
    )
    return 0
