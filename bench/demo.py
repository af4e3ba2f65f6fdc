"""``responses-ws demo``: a short agent-loop benchmark against an embedded server.

Starts Ray and the app in-process and runs the same Codex-like tool loop (a few thousand
tokens of instructions and tools, tool outputs of file reads and test logs) over a
WebSocket — one socket, ``store=False``, only new items plus ``previous_response_id`` each
turn — and over stateless HTTP with the full history resent, interleaved; prints each
turn of the WebSocket rollout and a side-by-side table, then shuts everything down.
``responses-ws bench`` is the full benchmark (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import asyncio

from serve.embedded import embedded_server, local_config

from . import report
from .agentloop import TurnRecord, run_bench
from .client import ws_url
from .workload import Workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--model", default="emu-fast")
    p.add_argument("--rollouts", type=int, default=2, help="rollouts per transport")


def run(args: argparse.Namespace) -> int:
    console = report.console()
    console.print("starting an embedded Ray and the responses-ws app …")
    with embedded_server(local_config()) as url:
        console.print(f"serving on {url}; WebSocket {ws_url(url)}\n")
        summary = agent_loops(console, url, args.turns, args.model, args.rollouts)
    return 1 if report.failed(summary) else 0


def agent_loops(console, url: str, turns: int, model: str, rollouts: int) -> dict:  # noqa: ANN001 - a rich Console
    """WebSocket and HTTP-full rollouts, interleaved; prints the first WebSocket rollout turn
    by turn and the side-by-side table; returns the summary."""
    w = Workload(model=model, tool_rounds=max(turns - 1, 0))
    console.print(f"{rollouts} rollouts per transport of {turns} turns ({w.tool_rounds} tool calls, then text); "
                  "first WebSocket rollout turn by turn:")
    console.print(f"{'turn':>4} {'ttft ms':>8} {'total ms':>9} {'input':>6} {'cached':>6} {'out':>4} {'server overhead ms':>19}")
    shown: list[int] = []

    def on_turn(transport: str, t: TurnRecord) -> None:
        if transport == "ws" and len(shown) < turns:
            shown.append(t.turn)
            over = report.overhead_ms(t)
            console.print(f"{t.turn:>4} {t.ttft_ms or 0:>8.1f} {t.total_ms:>9.1f} {t.input_tokens:>6} "
                          f"{t.cached_tokens:>6} {t.output_tokens:>4} {'–' if over is None else f'{over:.1f}':>19}")

    records = asyncio.run(run_bench(url, w, ["ws", "http-full"], rollouts=rollouts, settle_s=1.5,
                                    on_turn=on_turn))
    summary = report.summarise(records)
    console.print()
    console.print(report.render_table(summary, f"{model}, {turns} turns per rollout"))
    console.print("\nover the WebSocket each turn sent only its new items and the connection's actor kept the"
                  "\nrest; over HTTP the whole history went every turn and the server re-rendered it.")
    return summary
