"""The floor's hot path: per-turn server overhead and sustained streaming rate.

    responses-ws bench floor hotpath [--turns 200] [--streams 8] [--out results/hotpath.json]

Starts an embedded server with two bench-only profiles next to the normal ones:
``bench-zero`` (no prefill overhead, effectively instant decode) so that a one-token turn's
round trip is the server's own overhead, and ``bench-1k`` (1000 tok/s sustained, no burst)
for the streaming-rate check.  The plain WebSocket client (bench/client.py, with
permessage-deflate as these numbers were always measured) keeps client cost low.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from inference.emulator.profiles import load_inference_config
from serve.config import AppConfig
from serve.embedded import embedded_server, local_config

from .. import results
from ..client import connect
from ..stats import median, pct


def bench_config(warm_actors: int = 1) -> AppConfig:
    inference = load_inference_config().model_dump()
    inference["profiles"] += [
        {
            "id": "bench-zero",
            "decode_tokens_per_s": 1e9,
            "prefill_tokens_per_s": 1e12,
            "prefill_overhead_ms": 0,
        },
        {
            "id": "bench-1k",
            "decode_tokens_per_s": 1000,
            "prefill_tokens_per_s": 1e9,
            "prefill_overhead_ms": 0,
        },
    ]
    inference["policy"]["text_tokens"] = 2000
    # The parallel streams measure streaming, not actor start-up: they start on warm actors.
    return local_config(
        **{"session.warm_actors": warm_actors, **{f"inference.{k}": v for k, v in inference.items()}}
    )


async def overhead(url: str, turns: int, store: bool = False) -> tuple[list[float], list[float], list[float]]:
    """Round trip of a one-token continuation turn (``store:false`` unless ``store``) on the
    zero-latency profile, the time until its ``response.created`` (the path without
    inference), and the gap between its last output event and its terminal event (the
    terminal event waits there for the response's ledger line, and record if stored)."""
    out, created, gaps = [], [], []
    async with connect(url, compression="deflate") as sock:
        prev = None
        for i in range(turns + 10):
            answer = await sock.create(
                model="bench-zero", input="go", store=store, max_output_tokens=1, previous_response_id=prev
            )
            prev = answer.response["id"] if answer.response else None
            if i >= 10:  # warm-up turns excluded
                out.append(answer.total_s * 1000)
                created.append((answer.stamps[0] - answer.sent_at) * 1000)
                gaps.append((answer.stamps[-1] - answer.stamps[-2]) * 1000)
    return out, created, gaps


async def stream_rate(url: str, tokens: int) -> float:
    async with connect(url, compression="deflate") as sock:
        answer = await sock.create(model="bench-1k", input="write", store=False, max_output_tokens=tokens)
        stamps = [
            t for e, t in zip(answer.events, answer.stamps) if e["type"] == "response.output_text.delta"
        ]
        assert answer.response is not None  # create returns on its final event
        out_tokens = answer.response["usage"]["output_tokens"]
        return out_tokens / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


async def measure(url: str, turns: int, streams: int, tokens: int, store: bool = False) -> dict:
    laps, created, gaps = await overhead(url, turns, store)
    rates = await asyncio.gather(*(stream_rate(url, tokens) for _ in range(streams))) or [0.0]
    return {
        "turn_ms": {
            "median": median(laps, None),
            "p90": pct(laps, 0.9),
            "min": min(laps),
            "n": len(laps),
        },
        "created_ms": {"median": median(created, None)},
        "terminal_gap_ms": {"median": median(gaps, None), "p90": pct(gaps, 0.9)},
        "store": store,
        "streams": streams,
        "stream_tokens_per_s": {
            "each": [round(r, 1) for r in rates],
            "median": median(rates, None),
            "min": min(rates),
            "target": 1000.0,
        },
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--store", action="store_true", help="store:true overhead turns (default store:false)")
    p.add_argument("--out", type=Path, default=Path("results/hotpath.json"))


def run(args: argparse.Namespace) -> int:
    with embedded_server(bench_config(warm_actors=args.streams + 1)) as url:
        result = asyncio.run(measure(url, args.turns, args.streams, args.tokens, args.store))
    result["command"] = args.command
    results.write(args.out, result, args.run)
    print(json.dumps(result, indent=2))
    return 0
