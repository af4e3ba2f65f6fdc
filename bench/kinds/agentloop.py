"""``responses-ws bench [agentloop]``: Codex-like agent loops over several transports, side by side.

    responses-ws bench                               # codex preset: ws vs http-chained vs http-full
    responses-ws bench --url http://host:8765 --concurrency 8
    responses-ws bench --preset uniform --sweep 5,10,20,35,50   # the fixed-size loop, turn-count sweep
    responses-ws bench --sweep-speed 65,250,1000,4000 --sweep-context 10000,50000,100000,200000

Prints a table (and a progress bar while it runs), writes ``<out>/agentloop.json`` and PNG
plots next to it.  See docs/benchmark.md for what each column means and measured results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import agentloop_report as report
from .. import breakdown, results, sweeps
from ..rollouts import RolloutRecord, run_bench
from ..transports import TRANSPORTS
from ..workload import PRESETS, Lognormal, Workload, rounds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="server base URL (default: start an embedded server)")
    p.add_argument("--config", type=Path, default=None, help="server YAML for the embedded server")
    p.add_argument(
        "--api-key",
        default="sk-bench-{transport}",
        help="the key of each transport's requests; with {transport} in it each transport has "
        "its own prefix-cache scope (a server with API keys needs one key per transport)",
    )
    p.add_argument(
        "--transports", default="ws,http-chained,http-full", help=f"comma separated, of {sorted(TRANSPORTS)}"
    )
    p.add_argument("--rollouts", type=int, default=6, help="rollouts per transport")
    p.add_argument("--concurrency", type=int, default=1, help="rollouts in flight at once (M)")
    p.add_argument(
        "--preset",
        default="codex",
        choices=sorted(PRESETS),
        help="workload sizes (docs/benchmark.md); the options below override them",
    )
    p.add_argument("--model", default="emu-fast")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="tool rounds per rollout (codex: the median of their distribution)",
    )
    p.add_argument("--system-tokens", type=int, default=None)
    p.add_argument("--tool-def-tokens", type=int, default=None)
    p.add_argument("--tool-output-tokens", type=int, default=None, help="(codex: the median)")
    p.add_argument("--text-tokens", type=int, default=None, help="final answer (uniform preset)")
    p.add_argument("--tool-time-ms", type=float, default=None, help="(codex: the median)")
    p.add_argument("--resume-tokens", type=int, default=None, help="resumed session's history, tokens")
    p.add_argument(
        "--document-tokens",
        type=int,
        default=None,
        help="a document of numbered words before it, the same every rollout, tokens",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--breakpoints",
        choices=("30m", "12h"),
        default=None,
        help="place prompt-cache breakpoints as a client would (bench/breakpoints.py): after the "
        "instructions and tools with this ttl, and at each turn's last tool output (e.g. --model emu-cache)",
    )
    p.add_argument("--sweep", default=None, help="also run these tool-round counts, e.g. 5,10,20,35,50")
    p.add_argument(
        "--sweep-speed",
        default=None,
        help="also run at these decode speeds (tokens/s, prefill scaled alike), e.g. 65,250,1000,4000",
    )
    p.add_argument(
        "--sweep-context",
        default=None,
        help="also run resuming sessions of these sizes (tokens), e.g. 10000,50000,100000,200000",
    )
    p.add_argument("--sweep-rollouts", type=int, default=2, help="rollouts per transport per sweep point")
    p.add_argument("--out", type=Path, default=Path("results/agentloop"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def workload_from(args: argparse.Namespace, tool_rounds: int | None = None) -> Workload:
    """The preset with the options given on the command line; with a shaped preset
    (codex) a size option moves its distribution's median, the spread kept."""
    w = replace(PRESETS[args.preset], model=args.model, seed=args.seed)
    if getattr(args, "breakpoints", None):
        w = replace(w, breakpoints=True, breakpoint_ttl=args.breakpoints)
    given: dict[str, Any] = {
        field: value
        for field, value in (
            ("tool_rounds", args.rounds if tool_rounds is None else tool_rounds),
            ("system_tokens", args.system_tokens),
            ("tool_def_tokens", args.tool_def_tokens),
            ("tool_output_tokens", args.tool_output_tokens),
            ("text_tokens", args.text_tokens),
            ("tool_time_ms", args.tool_time_ms),
            ("resume_tokens", args.resume_tokens),
            ("document_tokens", getattr(args, "document_tokens", None)),
        )
        if value is not None
    }
    if w.shape is not None:
        moved: dict[str, Any] = {
            f: _moved(getattr(w.shape, f), given[f])
            for f in ("tool_rounds", "tool_output_tokens", "tool_time_ms")
            if f in given
        }
        w = replace(w, shape=replace(w.shape, **moved))
    return replace(w, **given)


def _moved(d: Lognormal, median: float) -> Lognormal:
    f = median / d.median
    return Lognormal(median, d.p90 * f, max(d.cap, d.p90 * f), d.low)


async def _run_with_progress(
    url: str,
    w: Workload,
    transports: list[str],
    rollouts: int,
    concurrency: int,
    api_key: str,
    quiet: bool,
    label: str,
    clients: list[dict[str, Any]] | None = None,
) -> list[RolloutRecord]:
    if quiet:
        return await run_bench(
            url, w, transports, rollouts=rollouts, concurrency=concurrency, api_key=api_key, clients=clients
        )
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("turns"),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        total = sum(rounds(w, r) + 1 for r in range(rollouts))
        tasks = {t: progress.add_task(f"{label} {t}", total=total) for t in transports}

        def on_turn(transport: str, _turn) -> None:
            progress.advance(tasks[transport])

        return await run_bench(
            url,
            w,
            transports,
            rollouts=rollouts,
            concurrency=concurrency,
            api_key=api_key,
            on_turn=on_turn,
            clients=clients,
        )


def floor_line(summary: dict[str, Any]) -> str | None:
    """``above the floor: ws 2.1 % median (p90 3.0 %, 1.4 ms/turn), append …`` for the
    transports whose server reported timings; ``None`` when none did."""
    parts = []
    for name, s in summary.items():
        a = s.get("above_floor") or {}
        if a.get("median") is not None:
            per_turn = s["above_floor_ms_per_turn"]["median"]
            parts.append(f"{name} {a['median']:.1%} median (p90 {a['p90']:.1%}, {per_turn:.1f} ms/turn)")
    return "above the floor per rollout (model + tool time): " + ", ".join(parts) if parts else None


def run(args: argparse.Namespace) -> int:
    console = report.console()
    if args.url:
        payload = measure(args, args.url, console)
    else:
        console.print("starting an embedded Ray and the responses-ws app …")
        config = local_config(args.config)
        if args.sweep_speed:
            config = config.model_copy(
                update={
                    "inference": sweeps.with_speeds(config.inference, args.model, _ints(args.sweep_speed))
                }
            )
        with embedded_server(config) as url:
            payload = measure(args, url, console)
    return 1 if report.failed(payload["summary"]) else 0


def measure(args: argparse.Namespace, url: str, console: Any) -> dict[str, Any]:
    """The main run and the sweep against ``url``; prints tables, writes JSON and plots."""
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    w = workload_from(args)
    shape = f"{args.preset} preset" + (f", resumed {w.resume_tokens // 1000}k" if w.resume_tokens else "")
    label = f"{w.model}, {shape}, M={args.concurrency}"
    t0 = time.time()
    clients: list[dict[str, Any]] = []  # the client process's own figures (bench/runner)
    records = asyncio.run(
        _run_with_progress(
            url, w, transports, args.rollouts, args.concurrency, args.api_key, args.quiet, "main", clients
        )
    )
    for c in clients:
        if c["saturated"]:
            console.print(
                f"[red]the client process was saturated ({c['reason']}): its turn times hold its own queueing[/red]"
            )
    summary = report.summarise(records)
    console.print(report.render_table(summary, f"Agent loops: {label}"))
    phases = report.render_phases(summary)
    if phases is not None:
        console.print(phases)
    else:
        console.print(
            "[dim]the server reported no phase timings (metadata responses_ws.timings); "
            "'non-model ms est.' = turn time − the emulator's modelled time[/dim]"
        )
    floor = floor_line(summary)
    if floor is not None:
        console.print(floor)
    comparison = breakdown.compare(records, transports)
    for line in breakdown.render_summary(comparison):
        console.print(line)
    sweep = []
    for n_rounds in _ints(args.sweep):
        sw = workload_from(args, n_rounds)
        recs = asyncio.run(
            _run_with_progress(
                url,
                sw,
                transports,
                args.sweep_rollouts,
                args.concurrency,
                args.api_key,
                args.quiet,
                f"sweep {n_rounds}",
            )
        )
        s = report.summarise(recs)
        sweep.append({"tool_rounds": n_rounds, "summary": s, "rollouts": [r.as_dict() for r in recs]})
        gains = ", ".join(f"vs {n}: {v['ws_gain']['e2e_median']:.1%}" for n, v in s.items() if "ws_gain" in v)
        console.print(
            f"sweep {n_rounds:>3} rounds: ws e2e median "
            f"{s.get('ws', {}).get('e2e_s', {}).get('median') or float('nan'):.2f} s; ws faster {gains}"
        )

    def point(pw: Workload, name: str) -> list[RolloutRecord]:
        return asyncio.run(
            _run_with_progress(
                url, pw, transports, args.sweep_rollouts, args.concurrency, args.api_key, args.quiet, name
            )
        )

    by_speed = sweeps.run_points(
        sweeps.speed_points(w, _ints(args.sweep_speed)), transports, lambda pw, x: point(pw, f"{x} tok/s")
    )
    for line in sweeps.lines(by_speed, "tok/s"):
        console.print(line)
    by_context = sweeps.run_points(
        sweeps.context_points(w, _ints(args.sweep_context)), transports, lambda pw, x: point(pw, f"ctx {x}")
    )
    for line in sweeps.lines(by_context, "context"):
        console.print(line)
    payload = {
        "command": args.command,
        "url": args.url or "embedded",
        "started_at": t0,
        "duration_s": time.time() - t0,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "workload": w.as_dict(),
        "transports": transports,
        "rollouts_per_transport": args.rollouts,
        "concurrency": args.concurrency,
        "clients": clients,
        "summary": summary,
        "comparison": comparison,
        "rollouts": [r.as_dict() for r in records],
        "sweep": sweep,
        "sweep_speed": by_speed,
        "sweep_context": by_context,
    }
    written = [results.write(args.out / "agentloop.json", payload, args.run)]
    if not args.no_plots:
        written += report.plot_all(args.out, records, sweep, label)
        if by_speed:
            written.append(
                sweeps.plot(
                    args.out / "sweep_speed.png",
                    by_speed,
                    "decode tokens/s (prefill scaled alike)",
                    f"API overhead and ws gain against model speed ({shape})",
                    log_x=True,
                )
            )
        if by_context:
            written.append(
                sweeps.plot(
                    args.out / "sweep_context.png",
                    by_context,
                    "resumed context, tokens",
                    f"API overhead and ws gain against context ({w.model}, {args.preset} preset)",
                    log_x=False,
                )
            )
    console.print("wrote " + ", ".join(str(p) for p in written))
    return payload


def _ints(csv: str | None) -> list[int]:
    return [int(x) for x in (csv or "").split(",") if x.strip()]
