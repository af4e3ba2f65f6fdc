"""``responses-ws demo``: where an agent loop's time goes, over a WebSocket and over HTTP.

Starts Ray and the app in-process and runs the ``codex`` workload preset (sizes from
published Codex CLI traces, docs/benchmark.md) resuming a ~60k-token session: the same
rollouts over a WebSocket — one socket, ``store=False``, only new items plus
``previous_response_id`` each turn — and over stateless HTTP with the whole history resent
(``http-full``), interleaved.  Prints, per turn, how the time splits into tool, prefill,
decode and API overhead, the end-to-end gain measured in this run, and saves the details
(``demo.json``) and a stacked-bar chart (``demo.png``).  ``responses-ws bench`` is the full
benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

from serve.embedded import embedded_server, local_config

from .. import agentloop_report as report
from .. import breakdown, results
from ..rollouts import run_bench
from ..workload import PRESETS, rounds

TRANSPORTS = ("ws", "http-full")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="codex", choices=sorted(PRESETS))
    p.add_argument("--model", default="emu-fast")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per transport (the same ones on each)")
    p.add_argument(
        "--resume-tokens",
        type=int,
        default=None,
        help="size of the resumed session's history (default: the preset's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/demo"))


def run(args: argparse.Namespace) -> int:
    w = replace(PRESETS[args.preset], model=args.model, seed=args.seed)
    if args.resume_tokens is not None:
        w = replace(w, resume_tokens=args.resume_tokens)
    turns = sum(rounds(w, r) + 1 for r in range(args.rollouts))
    print(
        f"{args.preset} preset on {w.model}, resuming a ~{w.resume_tokens // 1000}k-token session; "
        f"{args.rollouts} rollouts ({turns} turns) on each of {' and '.join(TRANSPORTS)}"
    )
    print("starting an embedded Ray and the responses-ws app …", flush=True)
    t0 = time.time()
    with embedded_server(local_config()) as url:
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # no "Deleting app" at the end
        print(f"serving on {url}; running (a few seconds per rollout) …", flush=True)
        records = asyncio.run(run_bench(url, w, TRANSPORTS, rollouts=args.rollouts, settle_s=1.5))
    failed = [r for r in records if r.error]
    cmp = breakdown.compare(records, TRANSPORTS)
    shown = min(range(args.rollouts), key=lambda r: abs(rounds(w, r) - 8))  # a typical length
    rows = breakdown.turn_rows(records, shown, TRANSPORTS)
    print()
    for line in (*breakdown.render_turns(rows, TRANSPORTS, shown), "", *breakdown.render_summary(cmp)):
        print(line)
    for r in failed:
        print(f"  rollout {r.rollout} on {r.transport} failed: {r.error}")
    payload = {
        "command": args.command,
        "duration_s": time.time() - t0,
        "workload": w.as_dict(),
        "transports": TRANSPORTS,
        "comparison": cmp,
        "turns_of_rollout": {"rollout": shown, "rows": rows},
        "summary": report.summarise(records),
        "rollouts": [r.as_dict() for r in records],
    }
    out_json = results.write(args.out / "demo.json", payload, args.run)
    png = breakdown.plot(
        args.out / "demo.png",
        cmp,
        rows,
        shown,
        f"{args.preset} preset, {w.model}, resumed ~{w.resume_tokens // 1000}k tokens: where the time goes",
    )
    print(f"\nsaved {out_json} and {png}")
    return 1 if failed or not cmp["rollouts"] else 0
