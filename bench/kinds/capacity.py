"""A node's capacity: N concurrent Codex-like loops against this server and, in the same run,
against the bare-protocol reference; each figure as ``server / reference = ratio``.

    responses-ws bench capacity [--loops 1,16,64,256,1024] [--duration 20] [--clients 2]
                                [--preset crowd] [--url URL] [--no-reference | --reference-only]
                                [--out results/capacity.json]

For each N in ``--loops`` (one embedded server on the default configuration for all of them,
or ``--url``), N loops run in ``--clients`` separate client processes of the lab's load
runner (bench/runner: the creates pre-encoded, only each answer's terminal frame parsed).  A
loop is one socket running the ``--preset`` workload of bench/workload.py (``crowd``: ~30 KB
of instructions and tools resent with every create, ~300-word tool outputs, 1-3 s of tool
time; ``codex``: a ~60k-token resumed history at each rollout's first create), turns chained
with ``previous_response_id`` carrying the tool outputs, each after the tool's time; a
rollout that ends starts the next on the same socket.

1. every loop connects; then the N first turns are released at once (the storm);
2. the loops run on for ``--duration`` seconds (steady state).

The reference (bench/reference.py: one process, ``websockets``, every create parsed, model
time zero) answers with the frames this server answered the crowd with, recorded before the
first N (:func:`record_frames`); each N runs against both back to back, the order swapped
every other N (:func:`paired_level`; a level is a storm and a steady window of N sockets:
two crowds at once would load each other).  ``--no-reference`` skips it;
``--reference-only`` loads it alone, its answers synthesized (the client's own capacity).

Reported per N and side: turns/s in the steady window; p50/p99 non-model time per turn (the
client's turn time less the server's reported queue + prefill + decode) for steady turns
and for the first turns apart (and a rollout's later first turns as ``rollout_first``);
the session host's event-loop lag under the storm where the server reports it (each
response's ``loop_lag`` timing); CPU per turn by process role over the steady window
(gateway, session hosts, inference emulator, Ray's own; embedded server only) with Ray's
idle background rate measured before, and the reference process's own; whether every loop
was served; and the client processes' own CPU and event-loop lag, a level whose clients were
saturated marked invalid (bench/runner/model.py).  Then the comparison
(bench/capacity_report.py).  Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from .. import capacity_report as report
from .. import processes, results
from .. import workload as wl
from ..reference import ReferenceServer, record
from ..runner import LoadSpec, run_local
from ..runner.channels import Channel
from ..runner.loop import Encoder, Loop, Pace
from ..runner.loop import workload as loop_workload
from ..stats import pct

# ----------------------------------------------------------------------------- summaries


def nonmodel(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    ms = [
        r["total_ms"] - r["model_ms"]
        for r in records
        if r["kind"] == kind and r["ok"] and r["model_ms"] is not None
    ]
    return {"turns": len(ms), **{k: _ms(pct(ms, q)) for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}}


WAIT = processes.WAIT  # a sample's key prefix for a role's run-queue wait (s)
CPU_SAMPLE_S = 1.0  # the server's processes' CPU by role, sampled by the driver while a loop count runs


def tail(
    records: list[dict[str, Any]], kind: str, q: float = 0.99, origin: float | None = None
) -> dict[str, Any]:
    """Where the turns at or past the ``q`` quantile of non-model time spent it: the
    median of each server phase (ms) over them, and of ``outside`` (the client's turn time
    less the server's own span, model and ``api_overhead``: the socket, the host's event
    loop before the frame is parsed, the client)."""
    rows = [
        r for r in records if r["kind"] == kind and r["ok"] and r.get("server") and r["model_ms"] is not None
    ]
    if not rows:
        return {}
    cut = pct(sorted(r["total_ms"] - r["model_ms"] for r in rows), q) or 0.0
    slow = [r for r in rows if r["total_ms"] - r["model_ms"] >= cut]
    out: dict[str, Any] = {"turns": len(slow), "from_ms": _ms(cut)}
    for phase in report.TAIL_PHASES:
        out[phase] = _ms(pct(sorted(r["server"].get(phase, 0.0) for r in slow), 0.5))
    outside = sorted(r["total_ms"] - r["model_ms"] - r["server"].get("api_overhead", 0.0) for r in slow)
    out["outside"] = _ms(pct(outside, 0.5))
    # when they were sent (s from ``origin``, default the first of them): turns slow
    # together mean a stall
    t0 = min(r["sent"] for r in rows) if origin is None else origin
    out["sent_s"] = sorted(round(r["sent"] - t0, 2) for r in slow)
    # each of them as the client saw it (time.time() sent, ms): to line up with traces
    out["turns_at"] = sorted(
        [round(r["sent"], 4), round(r["total_ms"], 3), round(r["total_ms"] - r["model_ms"], 3)] for r in slow
    )
    return out


LOOP_LAG = "loop_lag"  # a response's timing: its session host's event-loop lag while it was on the server


def host_loop_lag(records: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The session host's event-loop lag the server reported with each ``kind`` turn (its
    ``loop_lag`` timing, ms: the longest the host's loop kept ready work waiting while the
    response was on the server): p50/p99/max over them; ``None`` when it reports none."""
    lags = sorted(
        r["server"][LOOP_LAG]
        for r in records
        if r["kind"] == kind and r["ok"] and r.get("server") and LOOP_LAG in r["server"]
    )
    if not lags:
        return None
    return {
        "turns": len(lags),
        **{k: _ms(pct(lags, q)) for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
    }


def lag(samples: list[float]) -> dict[str, Any]:
    """The client processes' event-loop lag (ms): p50/p99/max over their ticks."""
    s = sorted(samples)
    return {"ticks": len(s), **{k: _ms(pct(s, q)) for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def window_cpu(
    samples: list[tuple[float, dict[str, float]]], t0: float, t1: float
) -> tuple[dict[str, float], float, float]:
    """CPU seconds by role between the first sample at or after ``t0`` and the last at or
    before ``t1`` (samples are (time, CPU seconds so far by role)), and those samples' times."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return {}, t0, t0
    (a, ca), (b, cb) = inside[0], inside[-1]
    return {k: cb[k] - ca.get(k, 0.0) for k in cb}, a, b


def answered_between(records: list[dict[str, Any]], a: float, b: float) -> int:
    """Turns (not the storm's first ones) answered between ``a`` and ``b``: the turns a CPU
    window's time is shared by."""
    return sum(
        1 for r in records if r["ok"] and r["kind"] != "first" and a <= r["sent"] + r["total_ms"] / 1000 <= b
    )


def summarise(
    n: int,
    records: list[dict[str, Any]],
    errors: dict[int, list[str]],
    samples: list[tuple[float, dict[str, float]]],
    background_ms_per_s: dict[str, float],
    release_at: float,
    end_at: float,
) -> dict[str, Any]:
    """One N's figures from every turn the clients recorded and the server's CPU samples."""
    firsts = [r for r in records if r["kind"] == "first"]
    storm_end = max((r["sent"] + r["total_ms"] / 1000 for r in firsts), default=release_at)
    steady = [r for r in records if r["ok"] and r["sent"] >= storm_end]
    done_in = [r for r in steady if r["sent"] + r["total_ms"] / 1000 <= end_at]
    cpu, a, b = window_cpu(samples, storm_end, end_at)
    span = b - a
    in_span = [r for r in steady if a <= r["sent"] + r["total_ms"] / 1000 <= b]
    served = {r["loop"] for r in records if r["ok"] and r["kind"] != "first"}
    out: dict[str, Any] = {
        "loops": n,
        "first_turns_ms": {
            **nonmodel(records, "first"),
            "completed": sum(r["ok"] for r in firsts),
            "storm_s": round(storm_end - release_at, 3),
        },
        "steady_ms": nonmodel(steady, "steady"),
        "steady_tail": tail(steady, "steady", origin=storm_end),
        "host_loop_lag_ms": {
            "storm": host_loop_lag(records, "first"),
            "steady": host_loop_lag(steady, "steady"),
        },
        "storm_end": storm_end,
        "rollout_first_ms": nonmodel(steady, "rollout_first"),
        "steady_window_s": round(end_at - storm_end, 3),
        "turns_per_s": round(len(done_in) / (end_at - storm_end), 2) if end_at > storm_end else None,
        "loops_served": len(served),
        "loops_with_errors": len(errors),
        "every_loop_served": len(served) == n and not errors,
    }
    if cpu and in_span:
        turns = len(in_span)
        waits = {k.removeprefix(WAIT): v for k, v in cpu.items() if k.startswith(WAIT)}
        cpu = {k: v for k, v in cpu.items() if not k.startswith(WAIT)}
        if waits:  # runnable, waiting for a core: the machine's contention, by role
            out["runqueue_wait_ms_per_turn"] = {k: round(v * 1000 / turns, 3) for k, v in waits.items()}
        per = {k: round(v * 1000 / turns, 3) for k, v in cpu.items()}
        per["api_tier"] = round(per.get("gateway", 0) + per.get("session_host", 0), 3)
        per["all"] = round(sum(v for k, v in per.items() if k in processes.ROLES), 3)
        per["ray_background"] = round(background_ms_per_s.get("ray", 0.0) * span / turns, 3)
        out["cpu_ms_per_turn"] = per
        out["cpu_window"] = {"s": round(span, 3), "turns": turns}
    if errors:
        out["errors_sample"] = dict(list(errors.items())[:5])
    return out


# ----------------------------------------------------------------------------- the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loops", default="1,16,64,256,1024", help="comma-separated loop counts, run in turn")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of steady state per loop count")
    p.add_argument("--clients", type=int, default=2, help="client processes (for more than 16 loops)")
    p.add_argument("--preset", default="crowd", choices=sorted(wl.PRESETS))
    p.add_argument("--resume-tokens", type=int, default=None, help="override the preset's resumed history")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--idle-s",
        type=float,
        default=processes.IDLE_WINDOW_S,
        help="idle window measuring the background CPU rate (every process's 10 s metrics export once)",
    )
    p.add_argument("--url", help="a running server's base URL (default: start an embedded one)")
    p.add_argument(
        "--no-reference",
        dest="with_reference",
        action="store_false",
        help="skip the bare-protocol reference run beside each loop count",
    )
    p.add_argument(
        "--reference-only",
        "--reference",
        dest="reference_only",
        action="store_true",
        help="load the bare-protocol reference alone, its frames synthesized: measures the client itself",
    )
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/capacity.json"))


def one_level(
    url: str,
    n: int,
    args: argparse.Namespace,
    procs: dict[int, str],
    idle: dict[str, float],
    *,
    store: bool = False,
    reference_pid: int | None = None,
) -> dict[str, Any]:
    """N loops released at once, then ``args.duration`` s of steady state (the runner's
    window after every first turn is answered), the server's CPU sampled throughout."""
    k = 1 if n <= 16 else max(1, args.clients)
    spec = LoadSpec(
        targets=(url,),
        loops=n,
        duration_s=args.duration,
        warmup_s=0.0,
        seed=args.seed,
        store=store,
        preset=args.preset,
        resume_tokens=args.resume_tokens,
        window_after_first_turns=True,
    )
    sampler = processes.CpuSampler(  # following a host started for this level
        procs or ({reference_pid: "reference"} if reference_pid else {}),
        CPU_SAMPLE_S,
        waits=True,
        follow=bool(procs),
    )
    with sampler:
        result = run_local(spec, processes=k)
    records = [r.as_dict() for r in result.records]
    window_start, end_at = result.window
    samples = sampler.samples if procs else []  # no server processes seen (--url, the reference): no CPU
    out = summarise(n, records, result.errors, samples, idle, result.release_at, end_at)
    out["connected"] = result.connected
    out["client_processes"] = k
    cpu_s = sum(c.cpu_s for c in result.clients)
    out["client_cpu_s"] = round(cpu_s, 2)
    out["client_cpu_pct_of_a_core"] = round(100 * cpu_s / max(end_at - window_start, 1e-9), 1)
    if reference_pid:  # the reference server's own CPU over the steady window
        ref, a, b = window_cpu(sampler.samples, out["storm_end"], end_at)
        out["reference_cpu_pct_of_a_core"] = (
            round(100 * ref.get("reference", 0.0) / (b - a), 1) if b > a else None
        )
        answered = answered_between(records, a, b)
        out["reference_cpu_ms_per_turn"] = (
            round(ref.get("reference", 0.0) * 1000 / answered, 3) if answered and b > a else None
        )
    turns = (out["turns_per_s"] or 0.0) * (end_at - window_start)
    out["client_turns_per_cpu_s"] = round(turns / cpu_s, 1) if cpu_s > 0 else None  # a client core's worth
    out["client_loop_lag_ms"] = lag(result.lag_ms)
    out["clients"] = [c.as_dict() for c in result.clients]
    out["valid"] = not result.saturated
    out["invalid_reason"] = result.reason
    # the clients' stalls in the steady window (s from its start, ms): at the moments the
    # server's slow turns were sent, they say the machine stalled, not the server alone
    out["client_stalls"] = sorted(
        (round(t - out["storm_end"], 2), round(ms, 1))
        for t, ms in result.stalls
        if out["storm_end"] <= t <= end_at
    )
    return out


def record_frames(url: str, args: argparse.Namespace) -> dict[str, list[str]]:
    """This server's answers to the crowd's creates, recorded for the reference: a loop's
    first create, the chained create after it, and one more told that the rollout has called
    its tools (``emulator.tool_rounds`` 0: the rollout's text answer)."""
    w = loop_workload(args.preset, args.seed, args.resume_tokens)
    lp = Loop(0, url, Encoder.build(w, "ws", False, "record"), Pace(1), [], Channel)

    def make(kind: str, previous: dict[str, Any] | None) -> str:
        if previous is None:
            return lp.first_create()
        create = lp.next_create(previous)
        if create is None:
            raise RuntimeError(
                f"recording the reference's frames: the server answered the {kind} turn's previous one in text"
            )
        if kind != "final":
            return create
        body = json.loads(create)
        body["metadata"]["emulator.tool_rounds"] = "0"
        return json.dumps(body)

    return asyncio.run(record(url, make))


def paired_level(
    url: str,
    ref: ReferenceServer,
    n: int,
    args: argparse.Namespace,
    procs: dict[int, str],
    idle: dict[str, float],
    reference_first: bool,
) -> dict[str, Any]:
    """One loop count against this server and against the reference, back to back (the
    reference first when ``reference_first``); this server's level with the reference's
    beside it (``reference``) and the comparison (``vs_reference``, ``cpu_beside``)."""
    runs: dict[str, dict[str, Any]] = {}
    for side in ("reference", "server") if reference_first else ("server", "reference"):
        if side == "server":
            here = processes.server_processes(exclude=() if ref.pid is None else (ref.pid,)) if procs else {}
            runs[side] = one_level(url, n, args, here, idle)
        else:
            runs[side] = one_level(ref.url, n, args, {}, {}, reference_pid=ref.pid)
        print(f"  [{side}]", end="", flush=True)
        report.print_level(runs[side])
    server, reference = runs["server"], runs["reference"]
    vs, cpu = report.compare(server, reference), report.cpu_beside(server, reference)
    for line in report.lines(n, vs, cpu, server.get("host_loop_lag_ms")):
        print(line, flush=True)
    return {
        **server,
        "reference": reference,
        "vs_reference": vs,
        "cpu_beside": cpu,
        "reference_first": reference_first,
    }


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from serve.embedded import embedded_server, local_config

    levels = [int(x) for x in args.loops.split(",") if x]
    out: list[dict[str, Any]] = []
    answers: dict[str, Any] = {}
    if args.url and args.reference_only:
        raise SystemExit("bench capacity: --url and --reference-only exclude each other")
    reference = ReferenceServer() if args.reference_only else None
    with (
        nullcontext(args.url)
        if args.url
        else reference
        if reference is not None
        else embedded_server(local_config(args.config), name="capacity") as url
    ):
        procs = {} if args.url or reference else processes.server_processes()
        idle: dict[str, float] = {}
        if procs:
            before = processes.cpu_by_role(procs)
            time.sleep(args.idle_s)
            idle = {
                k: round(v / args.idle_s, 3)
                for k, v in processes.role_delta(processes.cpu_by_role(procs), before).items()
            }
            print(f"idle background CPU ms per s by role: {idle}", flush=True)
        if reference is not None or not args.with_reference:
            for n in levels:
                if procs:  # hosts started for the previous level count too
                    procs = processes.server_processes()
                level = one_level(
                    url, n, args, procs, idle, reference_pid=reference.pid if reference else None
                )
                report.print_level(level)
                out.append(level)
        else:
            recorded = record_frames(url, args)
            answers = {
                k: {"frames": len(v), "bytes": sum(len(f.encode()) for f in v)} for k, v in recorded.items()
            }
            print(f"the reference answers with this server's frames (templated): {answers}", flush=True)
            paired = ReferenceServer(recorded=recorded)
            with paired:
                for i, n in enumerate(levels):  # the order swapped every other loop count
                    out.append(paired_level(url, paired, n, args, procs, idle, reference_first=i % 2 == 1))
    results.write(
        args.out,
        {
            "command": args.command,
            "levels": out,
            "workload": {"preset": args.preset, "resume_tokens": args.resume_tokens, "seed": args.seed},
            "server": "reference" if reference else args.url or "embedded",
            "reference_answers": answers or None,  # beside this server: its recorded frames, counted
            "targets": {key: target for key, _, _, target in report.FIGURES if target is not None},
            "duration_s": args.duration,
        },
        args.run,
    )
    print(f"wrote {args.out}")
    served = all(level["every_loop_served"] for level in out) and all(
        level["reference"]["every_loop_served"] for level in out if "reference" in level
    )
    return 0 if served else 1
