"""What a resume costs on real nodes: reconnect with the token to the next turn's first event, against a steady turn.

    responses-ws bench resume [--clients 6] [--resumes 12] [--steady 2] [--url URL]
                              [--out results/resume.json]
    responses-ws bench resume --locality [--sessions 16] [--shared-instructions] [--out results/locality.json]

``--locality`` measures prefix locality across inference replicas instead
(:mod:`bench.multinode.locality`: four replicas on two accelerator nodes, the sessions'
pins, a resume on the other session node, Serve scaling the replicas down and up under load,
``cached_tokens`` on every turn); it always builds the harness.

Without ``--url`` it builds the multi-node harness (bench/multinode: two session nodes in
network namespaces of their own, Redis on the head, HAProxy in front; needs root and
``make haproxy redis``) with resume on (``session.resume_grace_s``) and two inference
replicas, and tears it down at the end; ``--url`` runs against a deployment of yours (its
balancer), which must have resume on and the Redis store.

``--clients`` clients run ``store:false`` chains at once through the balancer, on the load
runner (bench/runner's ``resume`` workload).  Each chain
starts with one long input (``--prefix-tokens`` tokens: the same instructions for every
client, then the client's own task), then alternates ``--steady`` turns on an open socket
with a resume: the client drops its socket (a TCP abort, no close frame: as a lost network
does), reconnects through the balancer with its token (the balancer picks the node:
leastconn) and sends the next turn.  Timed from the client:

- ``resume``: the start of the reconnect → the first event of the next turn
  (``response.created``); also the handshake alone and → the terminal event;
- ``steady``: the create sent → its first event, on an open socket.

Printed and saved: p50/p99 (and min/max) of each, how many resumes moved to the other node,
and ``cached_tokens`` of the first turn after a resume against the steady turns' (the same
conversation: the prefix cache still hits when the resumed turn reaches the replica that
holds it).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import results
from ..runner import LoadResult, LoadSpec, Resume, run_local
from ..stats import pct, spread

HEADER = "x-responses-ws-resume-token"
MODEL = "emu-fast"
GRACE_S = 60.0  # the harness's resume grace
INSTRUCTIONS = "You are a careful coding agent working in a repository. " * 40  # ~440 tokens, shared
RUN_LIMIT_S = 1800.0  # the load's deadline: every session has resumed long before


@dataclass(frozen=True)
class Plan:
    clients: int = 6
    resumes: int = 12  # per client
    steady: int = 2  # turns on an open socket between two resumes
    prefix_tokens: int = 1200
    text_tokens: int = 24


@dataclass
class Sample:
    """One turn as the client timed it (milliseconds); ``node``: the session node it ran on."""

    kind: str  # "steady" or "resume"
    first_ms: float
    total_ms: float
    cached_tokens: int
    input_tokens: int
    node: str | None = None
    moved: bool = False
    handshake_ms: float | None = None


@dataclass
class ClientRun:
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def load_spec(
    url: str, plan: Plan, locate: Callable[[], dict[int, str]] | None = None, api_key: str | None = None
) -> LoadSpec:
    """The clients as the runner runs them: one session each (bench/runner's ``resume``
    workload), the run over when every one has resumed ``plan.resumes`` times."""
    task = "client {loop} task: " + "inspect the module and report " * (plan.prefix_tokens // 6)
    resume = Resume(
        resumes=plan.resumes,
        steady=plan.steady,
        first_input=INSTRUCTIONS + task,
        next_input="step {turn}: go on",
        text_tokens=plan.text_tokens,
        model=MODEL,
        header=HEADER,
        compression="deflate",
    )
    return LoadSpec(
        targets=(url,),
        loops=plan.clients,
        workload="resume",
        resume=resume,
        locate=locate,
        api_key=api_key,
        warmup_s=0.0,
        duration_s=RUN_LIMIT_S,
        rollouts_per_loop=1,
        open_timeout_s=60.0,
    )


def client_runs(result: LoadResult, clients: int) -> list[ClientRun]:
    """Each client's samples (its steady turns and resumes; the first turn is not timed), from
    the runner's records: a resume timed from the start of the reconnect (its handshake, then
    the turn), on the node its connection went to; its errors."""
    nodes = {(c.loop, c.index): c.server for c in result.connections}
    runs = [ClientRun(errors=list(result.errors.get(c, []))) for c in range(clients)]
    for r in sorted(result.records, key=lambda r: r.sent):
        if r.kind not in ("steady", "resume") or not r.ok or r.first_event_ms is None:
            continue
        node = nodes.get((r.loop, r.connection if r.connection is not None else -1))
        cached, prompt = r.cached_tokens or 0, r.input_tokens or 0
        if r.kind == "steady":
            runs[r.loop].samples.append(Sample("steady", r.first_event_ms, r.total_ms, cached, prompt, node))
            continue
        handshake = r.connect_ms or 0.0
        before = nodes.get((r.loop, (r.connection or 0) - 1))
        runs[r.loop].samples.append(
            Sample(
                "resume",
                handshake + r.first_event_ms,
                handshake + r.total_ms,
                cached,
                prompt,
                node,
                node != before,
                r.connect_ms,
            )
        )
    return runs


FIGURES = ("n", "p50", "p99", "min", "max")


def summary(runs: list[ClientRun]) -> dict[str, Any]:
    samples = [s for r in runs for s in r.samples]
    steady = [s for s in samples if s.kind == "steady"]
    resumed = [s for s in samples if s.kind == "resume"]
    return {
        "resume_first_event_ms": spread([s.first_ms for s in resumed], FIGURES, 2),
        "resume_first_event_ms_other_node": spread([s.first_ms for s in resumed if s.moved], FIGURES, 2),
        "resume_handshake_ms": spread(
            [s.handshake_ms for s in resumed if s.handshake_ms is not None], FIGURES, 2
        ),
        "resume_terminal_ms": spread([s.total_ms for s in resumed], FIGURES, 2),
        "steady_first_event_ms": spread([s.first_ms for s in steady], FIGURES, 2),
        "steady_terminal_ms": spread([s.total_ms for s in steady], FIGURES, 2),
        "resumes_moved_node": sum(s.moved for s in resumed),
        "resumes": len(resumed),
        "resume_cached_over_input": pct([s.cached_tokens / s.input_tokens for s in resumed], 0.5),
        "steady_cached_over_input": pct([s.cached_tokens / s.input_tokens for s in steady], 0.5),
        "resumes_with_cached_tokens": sum(s.cached_tokens > 0 for s in resumed),
        "errors": [e for r in runs for e in r.errors],
    }


def fmt(d: dict[str, Any]) -> str:
    return (
        f"p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms (min {d['min']:.1f}, max {d['max']:.1f}; n={d['n']})"
        if d["n"]
        else "no samples"
    )


async def drive(
    url: str, plan: Plan, locate: Callable[[], dict[int, str]] | None = None, api_key: str | None = None
) -> list[ClientRun]:
    """Run the clients against ``url`` on the load runner (``locate``: local port -> session
    node of the connections open now, picklable: it runs in the client process); each one's
    samples and errors."""
    result = await asyncio.to_thread(run_local, load_spec(url, plan, locate, api_key))
    return client_runs(result, plan.clients)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Plan()
    p.add_argument("--clients", type=int, default=d.clients, help="chains at once")
    p.add_argument("--resumes", type=int, default=d.resumes, help="resumes per client")
    p.add_argument("--steady", type=int, default=d.steady, help="turns on an open socket between resumes")
    p.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens, help="the first input's size")
    p.add_argument("--text-tokens", type=int, default=d.text_tokens, help="output tokens per turn")
    p.add_argument(
        "--url", help="a running deployment's balancer (resume on, Redis store); default: the harness"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="default results/resume.json (--locality: locality.json)"
    )
    p.add_argument(
        "--locality", action="store_true", help="prefix locality across replicas (bench.multinode.locality)"
    )
    p.add_argument("--sessions", type=int, default=16, help="--locality: sessions at once")
    p.add_argument(
        "--shared-instructions",
        action="store_true",
        help="--locality: the sessions' prompts start with one app's instructions (one prefix route)",
    )


def run_locality(args: argparse.Namespace) -> int:
    from ..multinode import locality

    plan = locality.Plan(sessions=args.sessions, shared_instructions=args.shared_instructions)
    with locality.harness(plan) as h:
        result = asyncio.run(locality.experiment(h, plan))
    print(locality.report(result))
    results.write(args.out or Path("results/locality.json"), result, args.run)
    return 1 if result["errors"] or result["cached_tokens"]["wrong"] else 0


def run(args: argparse.Namespace) -> int:
    if args.locality:
        return run_locality(args)
    plan = Plan(args.clients, args.resumes, args.steady, args.prefix_tokens, args.text_tokens)
    where: dict[str, Any]
    if args.url:
        url = args.url.rstrip("/").replace("http", "ws", 1) + "/v1/responses"
        runs = asyncio.run(drive(url, plan))
        where = {"url": args.url}
    else:
        from ..multinode import Harness

        def edit(app_args: dict[str, Any]) -> None:
            app_args.setdefault("session", {})["resume_grace_s"] = GRACE_S
            scaling = app_args.setdefault("inference", {}).setdefault("scaling", {})
            scaling["autoscaling"] = dict(scaling.get("autoscaling") or {}, min_replicas=2, max_replicas=2)

        with Harness(edit_args=edit) as h:
            runs = asyncio.run(drive(h.ws_url, plan, h.connection_lookup))
            where = {"harness": [f"{n.name}={n.address}" for n in h.topology.nodes], "balancer": h.url}
    s = summary(runs)
    result = {
        "plan": asdict(plan),
        "where": where,
        "summary": s,
        "samples": [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(x).items()}
            for r in runs
            for x in r.samples
        ],
    }
    print(f"resume (reconnect → first event of the next turn): {fmt(s['resume_first_event_ms'])}")
    print(f"  resumed on the other node:                     {fmt(s['resume_first_event_ms_other_node'])}")
    print(f"  of which the handshake:                        {fmt(s['resume_handshake_ms'])}")
    print(f"  reconnect → the next turn's terminal event:    {fmt(s['resume_terminal_ms'])}")
    print(f"steady turn (create → first event):              {fmt(s['steady_first_event_ms'])}")
    print(f"  create → terminal event:                       {fmt(s['steady_terminal_ms'])}")
    print(
        f"{s['resumes_moved_node']}/{s['resumes']} resumes moved node; cached_tokens > 0 on "
        f"{s['resumes_with_cached_tokens']}/{s['resumes']} first turns after a resume; cached/input "
        f"median {s['resume_cached_over_input']} after a resume, {s['steady_cached_over_input']} steady; "
        f"errors {s['errors'][:3]}"
    )
    results.write(args.out or Path("results/resume.json"), result, args.run)
    return 1 if s["errors"] else 0
