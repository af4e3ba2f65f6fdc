"""The floor's hot path: per-turn server overhead and sustained streaming rate.

    responses-ws bench floor hotpath [--turns 200] [--streams 8] [--out results/hotpath.json]

Starts an embedded server with the bench profiles (:mod:`bench.bench_profiles`): on
``bench-zero`` (no prefill overhead, effectively instant decode) a one-token turn's round trip
is the server's own overhead, timed on one socket of the plain WebSocket client
(bench/client.py, offering permessage-deflate as these numbers were always measured).  Then,
unless ``--streams 0``, ``--streams`` streams of ``--tokens`` tokens at once on ``bench-flat``
(1000 tok/s each): one round of ``responses-ws bench streams`` on the load runner, each
stream's delivered rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server

from .. import results
from ..client import connect
from ..runner import run_local
from ..stats import median, pct
from . import streams as streams_kind


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


async def measure(url: str, turns: int, store: bool = False) -> dict[str, Any]:
    laps, created, gaps = await overhead(url, turns, store)
    return {
        "turn_ms": {"median": median(laps, None), "p90": pct(laps, 0.9), "min": min(laps), "n": len(laps)},
        "created_ms": {"median": median(created, None)},
        "terminal_gap_ms": {"median": median(gaps, None), "p90": pct(gaps, 0.9)},
        "store": store,
    }


def stream_rates(url: str, streams: int, tokens: int) -> dict[str, Any]:
    """``streams`` streams of ``tokens`` tokens at once on bench-flat: one round of
    ``responses-ws bench streams`` (one client process), each stream's delivered rate."""
    result = run_local(streams_kind.spec(url, streams, tokens))
    rates = [streams_kind.rate(r) for r in streams_kind.answered(result.records)] or [0.0]
    return {
        "streams": streams,
        "stream_tokens_per_s": {
            "each": [round(r, 1) for r in sorted(rates)],
            "median": median(rates, None),
            "min": min(rates),
            "target": streams_kind.TARGET_TOK_S,
        },
        "stream_clients_valid": not result.saturated,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--store", action="store_true", help="store:true overhead turns (default store:false)")
    p.add_argument("--out", type=Path, default=Path("results/hotpath.json"))


def run(args: argparse.Namespace) -> int:
    with embedded_server(streams_kind.server_config(args.streams, None)) as url:
        result = asyncio.run(measure(url, args.turns, args.store))
        if args.streams:
            result.update(stream_rates(url, args.streams, args.tokens))
    result["command"] = args.command
    results.write(args.out, result, args.run)
    print(json.dumps(result, indent=2))
    return 0
