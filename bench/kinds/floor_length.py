"""Per-turn API overhead against conversation length: WebSocket vs HTTP, in one run.

    responses-ws bench floor length [--sizes 1k,2k,...,128k] [--turns 5] [--out results/overhead.json]

Three conversations grow side by side to each target size (in prompt tokens): ``ws`` (one
socket, ``store:false``, ``previous_response_id``, only new items), ``http-chained``
(``previous_response_id`` to a stored response) and ``http-full`` (the whole history resent,
``store:false``), each over bench/transports.py's transport of that name (one turn at a time;
the HTTP ones stream, SSE).  At every size each transport runs ``--turns`` small turns (one tool
output of a few dozen tokens), interleaved, and reads the server's own per-phase timings
from the response metadata (``responses_ws.timings``).  "API overhead" is the server's time
on a turn outside waiting for inference.  Prints a table, writes JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import plotting, results
from ..stats import median
from ..transports import TRANSPORTS

MODEL = "emu-fast"
API_KEY = "sk-bench"
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file from the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
META = {"responses_ws.timings": "1", "emulator.tool_rounds": "10000", "emulator.text_tokens": "8"}
# What every create sends besides its input (the transport adds ``store`` and the chaining).
BASE = {
    "model": MODEL,
    "tools": [TOOL],
    "metadata": META,
    "instructions": "You are a coding agent. Use the tools.",
}
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "parser",
    "module",
    "function",
    "returns",
    "value",
    "config",
    "build",
    "test",
    "error",
    "line",
    "import",
    "class",
    "method",
    "cache",
    "token",
    "stream",
    "socket",
    "request",
    "response",
    "handler",
    "server",
    "client",
]
PHASES = ("parse_validate", "history_load", "render", "classify", "model_resolution", "post", "other")


def filler(n_words: int, rng: random.Random) -> str:
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) == 12:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines + [" ".join(line)])


class Chain:
    """One growing conversation over one transport of bench/transports.py."""

    def __init__(self, name: str, base: str) -> None:
        self.name = name
        self.transport = TRANSPORTS[name](base, API_KEY)
        self.calls: list[str] = []
        self.prompt_tokens = 0

    async def turn(self, text: str) -> dict[str, float]:
        new = (
            [{"type": "function_call_output", "call_id": self.calls[0], "output": text}]
            if self.calls
            else [{"role": "user", "content": text}]
        )
        out = await self.transport.turn(BASE, new)
        if out.error or out.response is None:
            raise RuntimeError(f"{self.name}: {out.error}")
        response = out.response
        self.calls = [o["call_id"] for o in response["output"] if o["type"] == "function_call"]
        self.prompt_tokens = response["usage"]["input_tokens"]
        return json.loads(response["metadata"]["responses_ws.timings"])


async def measure(base: str, sizes: list[int], turns: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    chains = [Chain(n, base) for n in ("ws", "http-chained", "http-full")]
    rows: list[dict[str, Any]] = []
    try:
        for chain in chains:
            await chain.transport.open()
        for size in sizes:
            while min(c.prompt_tokens for c in chains) < size:  # grow all three alike
                gap = size - min(c.prompt_tokens for c in chains)
                text = filler(min(max(gap * 3 // 4, 10), 6000), rng)
                for chain in chains:
                    await chain.turn(text)
            samples: dict[str, list[dict[str, float]]] = {c.name: [] for c in chains}
            for _ in range(turns):
                text = filler(30, rng)
                for chain in chains:
                    samples[chain.name].append(await chain.turn(text))
            for chain in chains:
                t = samples[chain.name]
                row = {
                    "size": size,
                    "transport": chain.name,
                    "prompt_tokens": chain.prompt_tokens,
                    "api_overhead_ms": median((x["api_overhead"] for x in t), None),
                }
                row.update({p: median((x[p] for x in t), None) for p in PHASES})
                rows.append(row)
                print(
                    f"{size:>7} {chain.name:<13} prompt {chain.prompt_tokens:>7}  "
                    f"overhead {row['api_overhead_ms']:8.2f} ms  "
                    + " ".join(f"{p}={row[p]:.2f}" for p in PHASES),
                    flush=True,
                )
    finally:
        for chain in chains:
            with contextlib.suppress(Exception):  # a transport that never opened
                await chain.transport.close()
    return {"sizes": sizes, "turns_per_size": turns, "rows": rows}


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = plotting.pyplot().subplots(figsize=(7, 4.5))
    for name in ("ws", "http-chained", "http-full"):
        rows = [r for r in result["rows"] if r["transport"] == name]
        ax.plot(
            [r["prompt_tokens"] for r in rows], [r["api_overhead_ms"] for r in rows], marker="o", label=name
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("conversation length (prompt tokens)")
    ax.set_ylabel("per-turn API overhead, median (ms)")
    ax.set_title("Server time outside inference per turn")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    plotting.save(fig, path, dpi=120)


def parse_size(text: str) -> int:
    return int(float(text[:-1]) * 1024) if text.lower().endswith("k") else int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="1k,2k,4k,8k,16k,32k,64k,128k")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--url",
        default=None,
        help="a running server's base URL, http://host:port (default: start an embedded one)",
    )
    p.add_argument("--out", type=Path, default=Path("results/overhead.json"))


def run(args: argparse.Namespace) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    t0 = time.time()
    if args.url:
        result = asyncio.run(measure(args.url, sizes, args.turns, args.seed))
    else:
        config = local_config(None, **{"store.data_dir": str(Path("results/overhead-store").resolve())})
        with embedded_server(config) as url:
            result = asyncio.run(measure(url, sizes, args.turns, args.seed))
    result["wall_s"] = round(time.time() - t0, 1)
    result["command"] = args.command
    results.write(args.out, result, args.run)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0
