"""Concurrent streams end to end: N loops of the load runner each read one long answer at once.

    responses-ws bench streams [--streams 64] [--tokens 2000] [--repeats 3]
                               [--client-procs 2] [--max-items-per-s N|none]
                               [--out results/streams.json]

Starts an embedded server whose inference config adds the bench profiles
(:mod:`bench.bench_profiles`); the streams use ``bench-flat``, the ideal hardware (1000 tok/s per
stream whatever the batch, up to 64 running), on the one inference replica the default
config has, so ``--streams`` × 1000 tok/s is what the machine is asked to deliver.  The
streams are loops of the lab's load runner (bench/runner, :func:`~bench.runner.run_local`) in
``--client-procs`` client processes of their own (outside the server, each measuring its own
CPU and event-loop lag: a round whose clients were saturated is marked invalid).  A round is
one run of the runner: every loop opens its socket, and at the common release sends one
``store:false`` create (a one-rollout workload: no tools, no instructions, a short task) for
``--tokens`` tokens of text.  One unmeasured round of one-token answers
warms the path first.

Per stream, as its client receives it: delivered rate = tokens after the first / time from
the first ``response.output_text.delta`` to the terminal event (the tokens are the terminal
event's ``usage.output_tokens``; the first delta holds the first token alone).  Per round: the
minimum, the 10th percentile and the median of those rates, the aggregate (all tokens / the
time from the first create sent to the last terminal event), TTFT, and the CPU the session
host, the inference replica and the clients used (cores = CPU seconds / wall time).
The target (docs/performance.md): every stream at >= 95 % of 1000 tok/s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serve.embedded import embedded_server, local_config

from .. import bench_profiles as profiles
from .. import results
from ..processes import CpuSampler, actor_pids, session_host_pids
from ..runner import LoadResult, LoadSpec, TurnRecord, run_local
from ..stats import median, pct
from ..workload import Workload

MODEL = "bench-flat"
TARGET_TOK_S = 1000.0
REPLICA_CLASS = "InferenceDeployment"
ROUND_LIMIT_S = 300.0  # a round's window: it ends when every stream has answered
CPU_SAMPLE_S = 0.05  # the server's processes' CPU, sampled by the driver while a round runs


def server_config(streams: int, max_items_per_s: str | None) -> Any:
    inference = profiles.bench_inference_config().model_dump()
    if max_items_per_s is not None:  # the replica's item budget for the streams' profile
        flat = next(p for p in inference["profiles"] if p["id"] == MODEL)
        flat["max_items_per_s"] = None if max_items_per_s == "none" else float(max_items_per_s)
    return local_config(
        **{"session.warm_actors": streams + 1, **{f"inference.{k}": v for k, v in inference.items()}}
    )


def stream_workload(tokens: int) -> Workload:
    """One create a rollout: a text answer of ``tokens`` tokens; no tools, no instructions,
    the shortest task the workload makes (what the host parses and renders for a stream is
    next to nothing)."""
    return Workload(
        model=MODEL,
        tool_rounds=0,
        system_tokens=0,
        tool_def_tokens=0,
        task_tokens=0,
        text_tokens=tokens,
        tool_time_ms=0.0,
    )


def spec(url: str, streams: int, tokens: int) -> LoadSpec:
    return LoadSpec(
        targets=(url,),
        loops=streams,
        custom_workload=stream_workload(tokens),
        rollouts_per_loop=1,
        warmup_s=0.0,
        duration_s=ROUND_LIMIT_S,
    )


def answered(records: list[TurnRecord]) -> list[TurnRecord]:
    """The streams that completed with a first delta before their end."""
    return [
        r for r in records if r.ok and r.ttft_ms is not None and r.total_ms > r.ttft_ms and r.output_tokens
    ]


def first_delta(r: TurnRecord) -> float:
    return r.sent + (r.ttft_ms or 0.0) / 1000


def rate(r: TurnRecord) -> float:
    """A stream's delivered rate: tokens after the first / first delta → terminal event."""
    return ((r.output_tokens or 0) - 1) / (r.done - first_delta(r))


def summarise(result: LoadResult, server_cores: dict[str, float]) -> dict[str, Any]:
    """One round's figures from the runner's records (one per stream) and the CPU."""
    streams: list[TurnRecord] = result.records
    ok = answered(streams)
    first = {id(r): first_delta(r) for r in ok}
    rates = sorted(rate(r) for r in ok)
    t0 = min(r.sent for r in streams)
    wall = max(r.done for r in ok) - t0
    total = sum(r.output_tokens or 0 for r in ok)
    client_cpu_s = sum(c.cpu_s for c in result.clients)
    cpu_s = {**{k: v * wall for k, v in server_cores.items()}, "clients": client_cpu_s}
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    return {
        "streams": len(streams),
        "connected": result.connected,
        "errors": [r.error_code or "error" for r in streams if not r.ok],
        "connect_failures": result.connect_failures,  # attempts retried or not, by type
        "rate_tok_s": {
            "min": round(rates[0], 1),
            "p10": round(pct(rates, 0.1) or 0.0, 1),
            "median": median(rates, 1),
            "max": round(rates[-1], 1),
            "each": [round(r, 1) for r in rates],
        },
        # per stream, in start order: ms from the round's first create to its first delta and its end
        "streams_ms": [
            [round((first[id(r)] - t0) * 1000, 1), round((r.done - t0) * 1000, 1)]
            for r in sorted(ok, key=lambda r: first[id(r)])
        ],
        "at_95pct": sum(r >= 0.95 * TARGET_TOK_S for r in rates),
        "aggregate_tok_s": round(total / wall, 1),
        "wall_s": round(wall, 3),
        "ttft_ms": {"median": median(ttft, 1), "max": round(max(ttft), 1)},
        "cpu_cores": {k: round(v / wall, 3) for k, v in cpu_s.items()},
        "cpu_ms_per_1k_tokens": {k: round(v * 1e6 / total, 1) for k, v in cpu_s.items()},
        "valid": not result.saturated,
        "invalid_reason": result.reason,
        "clients": [c.as_dict() for c in result.clients],
    }


def run_rounds(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    procs = max(1, min(args.client_procs, args.streams))
    run_local(spec(url, args.streams, 1), procs)  # the path is warm before the rounds
    rounds = []
    for i in range(args.repeats):
        groups = {"host": session_host_pids(), "replica": actor_pids(REPLICA_CLASS)}
        print("pids: " + ", ".join(f"{k} {v}" for k, v in groups.items()), flush=True)
        by_pid = {pid: group for group, pids in groups.items() for pid in pids}
        with CpuSampler(by_pid, CPU_SAMPLE_S) as sampler:
            result = run_local(spec(url, args.streams, args.tokens), procs)
        done = [r for r in result.records if r.ok]
        if not done:
            raise RuntimeError(f"round {i + 1}: no stream was answered: {dict(result.errors)}")
        t0, t1 = min(r.sent for r in result.records), max(r.done for r in done)
        r = summarise(result, sampler.cores(t0, t1))
        rounds.append(r)
        rate = r["rate_tok_s"]
        print(
            f"round {i + 1}: {args.streams} streams  per-stream tok/s min {rate['min']:.0f}  p10 "
            f"{rate['p10']:.0f}  median {rate['median']:.0f}  ({r['at_95pct']} at >= 95 %)  aggregate "
            f"{r['aggregate_tok_s']:.0f} tok/s  TTFT median/max {r['ttft_ms']['median']:.0f}/"
            f"{r['ttft_ms']['max']:.0f} ms  cores "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores"].items())
            + (f"  errors {r['errors']}" if r["errors"] else "")
            + ("" if r["valid"] else f"  INVALID: {r['invalid_reason']}"),
            flush=True,
        )
    return rounds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2000, help="output tokens per stream")
    p.add_argument("--repeats", type=int, default=3, help="rounds, each a run of the load runner")
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
    valid = [r for r in rounds if r["valid"]]
    result = {
        "command": args.command,
        "model": MODEL,
        "target_tok_s_per_stream": TARGET_TOK_S,
        "streams": args.streams,
        "tokens": args.tokens,
        "client_procs": args.client_procs,
        "max_items_per_s": args.max_items_per_s,
        "rounds": rounds,
        "summary": {
            "valid_rounds": len(valid),
            "min_tok_s_median_of_rounds": median((r["rate_tok_s"]["min"] for r in valid), None),
            "median_tok_s_median_of_rounds": median((r["rate_tok_s"]["median"] for r in valid), None),
            "aggregate_tok_s_median_of_rounds": median((r["aggregate_tok_s"] for r in valid), None),
            "all_at_95pct_rounds": sum(r["at_95pct"] == args.streams for r in valid),
        },
    }
    results.write(args.out, result, args.run)
    s = result["summary"]
    if not valid:
        print(f"no valid round of {len(rounds)}: the clients were saturated  (saved {args.out})")
        return 1
    print(
        f"median of {len(valid)} valid rounds of {len(rounds)}: slowest stream "
        f"{s['min_tok_s_median_of_rounds']:.0f} tok/s, median stream {s['median_tok_s_median_of_rounds']:.0f} "
        f"tok/s, aggregate {s['aggregate_tok_s_median_of_rounds']:.0f} tok/s; rounds with every stream "
        f">= 95 %: {s['all_at_95pct_rounds']}/{len(valid)}  (saved {args.out})"
    )
    return 0
