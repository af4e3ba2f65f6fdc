"""Hot-path benchmark: per-turn server overhead and sustained streaming rate.

    python -m bench.hotpath [--turns 200] [--streams 8] [--out results/hotpath.json]

Starts an embedded server with two bench-only profiles next to the normal ones:
``bench-zero`` (no prefill overhead, effectively instant decode) so that a one-token turn's
round trip is the server's own overhead, and ``bench-1k`` (1000 tok/s sustained, no burst)
for the streaming-rate check.  Raw ``websockets`` clients keep client cost low.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import websockets

from serve.builder import start, stop
from serve.cli import free_port
from serve.config import load_app_config
from inference.profiles import load_inference_config

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def bench_config(port: int, warm_actors: int = 1):
    inference = load_inference_config().model_dump()
    inference["profiles"] += [
        {"id": "bench-zero", "decode_tokens_per_s": 1e9, "prefill_tokens_per_s": 1e12, "prefill_overhead_ms": 0},
        {"id": "bench-1k", "decode_tokens_per_s": 1000, "prefill_tokens_per_s": 1e9, "prefill_overhead_ms": 0},
    ]
    inference["policy"]["text_tokens"] = 2000
    # The parallel streams measure streaming, not actor start-up: they start on warm actors.
    return load_app_config(None, **{"server.port": port, "session.warm_actors": warm_actors,
                                    **{f"inference.{k}": v for k, v in inference.items()}})


async def one_turn(ws, body: dict) -> tuple[float, list[dict], list[float]]:
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create", **body}))
    events, stamps = [], []
    while True:
        ev = json.loads(await ws.recv())
        events.append(ev)
        stamps.append(time.perf_counter())
        if ev["type"] in TERMINAL:
            return time.perf_counter() - t0, events, stamps


async def overhead(url: str, turns: int) -> tuple[list[float], list[float]]:
    """Round trip of a one-token, store:false continuation turn on the zero-latency profile,
    and the time until its ``response.created`` (the path without inference)."""
    out, created = [], []
    async with websockets.connect(url, max_size=None) as ws:
        prev = None
        for i in range(turns + 10):
            t0 = time.perf_counter()
            dt, events, stamps = await one_turn(ws, {"model": "bench-zero", "input": "go", "store": False,
                                                     "max_output_tokens": 1, "previous_response_id": prev})
            prev = events[-1]["response"]["id"] if events[-1]["type"] != "error" else None
            if i >= 10:  # warm-up turns excluded
                out.append(dt * 1000)
                created.append((stamps[0] - t0) * 1000)
    return out, created


async def stream_rate(url: str, tokens: int) -> float:
    async with websockets.connect(url, max_size=None) as ws:
        _, events, stamps = await one_turn(ws, {"model": "bench-1k", "input": "write", "store": False,
                                                "max_output_tokens": tokens})
        deltas = [i for i, e in enumerate(events) if e["type"] == "response.output_text.delta"]
        out_tokens = events[-1]["response"]["usage"]["output_tokens"]
        return out_tokens / (stamps[deltas[-1]] - stamps[deltas[0]]) if len(deltas) > 1 else 0.0


async def main_async(url: str, turns: int, streams: int, tokens: int) -> dict:
    laps, created = await overhead(url, turns)
    rates = await asyncio.gather(*(stream_rate(url, tokens) for _ in range(streams))) or [0.0]
    return {
        "turn_ms": {"median": statistics.median(laps), "p90": statistics.quantiles(laps, n=10)[-1],
                    "min": min(laps), "n": len(laps)},
        "created_ms": {"median": statistics.median(created)},
        "streams": streams,
        "stream_tokens_per_s": {"each": [round(r, 1) for r in rates], "median": statistics.median(rates),
                                "min": min(rates), "target": 1000.0},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--out", type=Path, default=Path("results/hotpath.json"))
    args = p.parse_args()
    url = start(bench_config(free_port(), warm_actors=args.streams + 1))
    try:
        result = asyncio.run(main_async(url.replace("http", "ws", 1) + "/v1/responses",
                                        args.turns, args.streams, args.tokens))
    finally:
        stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
