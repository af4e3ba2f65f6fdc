"""Scaling experiment on a simulated multi-node cluster, or on real nodes (docs/scaling.md).

    responses-ws bench scaling [--modes 1,16,64] [--steps 1,4,8] [--idle 24,64,128] [--out results/scaling]
    sudo responses-ws bench scaling --real-nodes [--nodes 1,2,3] [--loops 16] [--duration 15] [--repeats 3]
    sudo responses-ws bench scaling --real-nodes --model [--nodes 1,2,3] [--loops-per-node 4] [--duration 8]
    responses-ws bench scaling --model-from results/scaling/shared-parts.json
    responses-ws bench scaling --cluster auto --session-nodes 1,2 --loops-per-node 8 --duration 20 --out DIR

``--cluster ADDRESS|auto`` runs it on your own Ray cluster (bench/experiment/): the load from
Ray actors on the nodes with the ``client`` resource, the session nodes in service changed
through the gateway's replica count, a report per step and per node.

``--real-nodes`` (root, haproxy and redis-server installed) runs on the multi-node harness
instead (bench/multinode/scaling.py): session nodes in network namespaces of their own behind
HAProxy, 1 → 2 → 3 of them, the Codex-like load of ``bench capacity`` through the balancer.
With ``--model`` it measures what the shared parts carry instead (a harness per node count,
the same load per node) and prints the capacity model's extrapolation to 10, 100 and 1000
session nodes (bench/scale_model.py); ``--model-from`` prints that from a saved run.

One cluster (head, two "session" nodes, one "accelerator" node); for each
``connections_per_actor`` mode, configs/serve-cluster.yaml is (re)deployed with that
packing and the inference deployment autoscaling on the accelerator node, then:

1. load: ``M`` concurrent WebSocket agent loops for each step (rising M): e2e, TTFT,
   server API overhead percentiles, delivered tokens/s, inference replicas afterwards;
2. idle: ``N`` connections opened and held without traffic: private memory (USS) of the
   session actors' processes and their CPU over a quiet window, per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from serve.embedded import wait_ready

from .. import plotting, results
from .. import workload as wl
from ..client import connect
from ..cluster import SERVE_CLUSTER_CONFIG as CONFIG
from ..cluster import SimulatedCluster, deploy_serve_config
from ..experiment import options as experiment_options
from ..processes import cpu_s, session_host_pids, uss_mb
from ..runner import LoadSpec, run_local
from ..runner.model import rollout_spans
from ..stats import pct
from ..workload import Workload

STEP_S = 15.0  # each load step's measured window
STEP_WARMUP_S = 3.0


async def load_step(url: str, m: int, w: Workload) -> dict:
    """``m`` concurrent agent loops (the load runner's ``codex`` workload: a new connection
    per rollout, rollout after rollout) for :data:`STEP_S` after :data:`STEP_WARMUP_S`;
    e2e of the rollouts that ended in the window, TTFT, the server's API overhead,
    delivered tokens/s; ``clients_valid`` false when the client process was saturated."""
    spec = LoadSpec(
        targets=(url,),
        loops=m,
        workload="codex",
        duration_s=STEP_S,
        warmup_s=STEP_WARMUP_S,
        custom_workload=w,
    )
    result = await asyncio.to_thread(run_local, spec)
    t0, t1 = result.window
    turns = [r for r in result.in_window() if r.ok]
    spans = [(a, b, rs) for a, b, rs in rollout_spans(result.records) if t0 <= b <= t1]
    e2e = [b - a for a, b, _ in spans]
    connect = [rs[0].connect_ms for _, _, rs in spans if rs[0].connect_ms is not None]
    over = [v for t in turns if (v := (t.server or {}).get("api_overhead")) is not None]
    ttft = [t.ttft_ms for t in turns if t.ttft_ms is not None]
    wall = t1 - t0
    return {
        "rollouts": m,
        "rollouts_ended": len(spans),
        "errors": [e for es in result.errors.values() for e in es],
        "wall_s": wall,
        "e2e_s": {"p50": pct(e2e, 0.5), "p90": pct(e2e, 0.9)},
        "connect_ms_p50": pct(connect, 0.5),
        "connect_ms_max": max(connect, default=None),
        "ttft_ms": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99)},
        "api_overhead_ms": {"p50": pct(over, 0.5), "p90": pct(over, 0.9), "p99": pct(over, 0.99)},
        "delivered_tokens_per_s": sum(t.output_tokens or 0 for t in turns) / wall,
        "turns_per_s": len(turns) / wall,
        "clients_valid": not result.saturated,
        "clients_invalid_reason": result.reason,
    }


async def hold_idle(url: str, n: int, quiet_s: float) -> dict:
    base_pids = session_host_pids()
    base_mem = uss_mb(base_pids)
    conns: list[Any] = []
    failure = None
    t0 = time.perf_counter()
    try:
        for _ in range(n):  # one at a time: measures how fast the gateways take new sockets
            try:
                c = await connect(url, open_timeout=30)
                # a warm-up turn: the connection now owns state in its actor
                await c.create(model="emu-fast", input="hi", store=False, generate=False)
            except Exception as exc:  # noqa: BLE001 - the capacity limit is a result
                failure = f"connection {len(conns) + 1}: {type(exc).__name__}: {exc}"[:200]
                break
            conns.append(c)
        open_s = time.perf_counter() - t0
        n = max(1, len(conns))
        await asyncio.sleep(1.0)
        pids = session_host_pids()
        mem = uss_mb(pids)
        c0 = cpu_s(pids)
        await asyncio.sleep(quiet_s)
        cpu = (cpu_s(pids) - c0) / quiet_s
        return {
            "connections": len(conns),
            "failure": failure,
            "open_s": open_s,
            "actors": len(pids),
            "actors_before": len(base_pids),
            "session_actors_uss_mb": mem,
            "uss_mb_before": base_mem,
            "uss_mb_per_connection": (mem - base_mem) / n,
            "idle_cpu_cores": cpu,
            "idle_cpu_pct_core_per_connection": 100 * cpu / n,
        }
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="1,16,64", help="connections_per_actor values")
    p.add_argument("--steps", default="1,4,8", help="concurrent rollouts, rising")
    p.add_argument(
        "--idle", default="24,64,128", help="idle connections held, per mode (same order as --modes)"
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--quiet-s", type=float, default=5.0)
    p.add_argument("--port", type=int, default=18765)
    p.add_argument("--out", type=Path, default=Path("results/scaling"))
    p.add_argument(
        "--config", type=Path, default=CONFIG, help="the Serve config deployed on the simulated cluster"
    )
    real = p.add_argument_group("real nodes (--real-nodes)")
    real.add_argument("--real-nodes", action="store_true", help="on the multi-node harness (root)")
    real.add_argument("--nodes", default="1,2,3", help="session nodes in the balancer, interleaved")
    real.add_argument("--loops", type=int, default=16, help="concurrent Codex-like loops (bench capacity)")
    real.add_argument(
        "--duration", type=float, default=None, help="seconds of steady state per run (15; --cluster: 20)"
    )
    real.add_argument(
        "--repeats", type=int, default=None, help="rounds over the node counts (3; --cluster: 1)"
    )
    real.add_argument("--clients", type=int, default=2, help="client processes (for more than 16 loops)")
    real.add_argument("--preset", default="codex", choices=sorted(wl.PRESETS))
    real.add_argument("--resume-tokens", type=int, default=None, help="override the preset's resumed history")
    real.add_argument("--seed", type=int, default=0)
    model = p.add_argument_group("the capacity model (--real-nodes --model; docs/scaling.md)")
    model.add_argument(
        "--model",
        action="store_true",
        help="per node count a harness of its own: what the GCS, the Serve controller, the head's raylet and "
        "Redis carry per turn, per connection and per node, then the model's extrapolation",
    )
    model.add_argument(
        "--loops-per-node",
        default=None,
        help="the fixed load per session node (4); --cluster: the load levels, comma-separated (8)",
    )
    model.add_argument("--idle-s", type=float, default=6.0, help="the idle window before the load")
    model.add_argument(
        "--resume-grace", type=float, default=15.0, help="session.resume_grace_s once resume is on"
    )
    model.add_argument(
        "--held-per-node", type=int, default=10, help="idle connections held per node, resume on"
    )
    model.add_argument("--hold-s", type=float, default=10.0, help="how long they are held")
    model.add_argument(
        "--model-from",
        type=Path,
        help="no harness: print the model's extrapolation from a --model results file",
    )
    experiment_options.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.cluster is not None:
        from ..experiment.experiment import run as run_experiment

        try:
            opts = experiment_options.from_args(args)
        except ValueError as exc:
            print(f"responses-ws bench scaling: {exc}", file=sys.stderr)
            return 2
        return run_experiment(opts)
    args.duration = 15.0 if args.duration is None else args.duration
    args.repeats = 3 if args.repeats is None else args.repeats
    args.loops_per_node = 4 if args.loops_per_node is None else int(args.loops_per_node)
    if args.model_from is not None:
        from ..multinode import scaling as real_nodes

        return real_nodes.print_extrapolation(json.loads(args.model_from.read_text()))
    if args.real_nodes:
        from ..multinode import scaling as real_nodes

        name = "shared-parts.json" if args.model else "real-nodes.json"
        args.out = args.out / name if args.out.suffix != ".json" else args.out
        return real_nodes.run_model(args) if args.model else real_nodes.run(args)
    if not args.config.is_file():  # an installed wheel has no configs/ directory
        print(
            f"responses-ws bench scaling: no Serve config at {args.config}; run it from a source checkout "
            "or pass --config configs/serve-cluster.yaml",
            file=sys.stderr,
        )
        return 2
    modes = [int(x) for x in args.modes.split(",")]
    idle = [int(x) for x in args.idle.split(",")]
    steps = [int(x) for x in args.steps.split(",")]
    w = Workload(
        tool_rounds=args.rounds,
        system_tokens=2000,
        tool_def_tokens=1000,
        tool_output_tokens=400,
        text_tokens=100,
        tool_time_ms=20,
    )
    url = f"http://127.0.0.1:{args.port}"
    cluster = SimulatedCluster(session_nodes=2, accelerator_nodes=1, accelerators_per_node=4)
    result = {
        "command": args.command,
        "workload": w.as_dict(),
        "cluster": "head + 2 session nodes + 1 accelerator node (4 slots), one machine (2 cores, 24 GiB)",
        "modes": [],
    }
    try:
        for mode, n_idle in zip(modes, idle, strict=True):

            def edit(a: dict, mode: int = mode) -> None:
                a["server"]["port"] = args.port
                a["server"]["gateway_replicas"] = 2  # fixed, one per simulated session node
                a["store"] = {"backend": "sqlite", "data_dir": "/tmp/responses-ws-scaling"}
                a["session"]["connections_per_actor"] = mode
                a["session"]["warm_actors"] = 8 if mode == 1 else mode
                a["inference"]["scaling"]["autoscaling"].update(
                    {
                        "min_replicas": 1,
                        "max_replicas": 4,
                        "target_sequences": None,  # Serve's own policy on its requests, as measured
                        "target_ongoing_requests": 2,
                        "upscale_delay_s": 1.0,
                    }
                )

            t0 = time.perf_counter()
            deploy_serve_config(args.config, edit)
            wait_ready(url, timeout_s=120)
            time.sleep(3)  # the pools fill
            entry: dict[str, Any] = {
                "connections_per_actor": mode,
                "deploy_s": time.perf_counter() - t0,
                "load": [],
                "idle": None,
            }
            for m in steps:
                step = asyncio.run(load_step(url, m, w))
                step["placement"] = cluster.placement()
                entry["load"].append(step)
                print(
                    f"mode {mode:>3} M={m:>2}: e2e p50 {step['e2e_s']['p50']:.2f}s  TTFT p50/p90 "
                    f"{step['ttft_ms']['p50']:.1f}/{step['ttft_ms']['p90']:.1f} ms  overhead p50/p90 "
                    f"{step['api_overhead_ms']['p50'] or 0:.1f}/{step['api_overhead_ms']['p90'] or 0:.1f} ms  "
                    f"{step['delivered_tokens_per_s']:.0f} tok/s  errors {len(step['errors'])}  "
                    f"replicas {step['placement'].get('ServeReplica:responses-ws:InferenceDeployment')}",
                    flush=True,
                )
                time.sleep(2)
            entry["idle"] = asyncio.run(hold_idle(url, n_idle, args.quiet_s))
            print(f"mode {mode:>3} idle: {json.dumps(entry['idle'])}", flush=True)
            result["modes"].append(entry)
            results.write(args.out / "scaling.json", result, args.run)
            time.sleep(3)
    finally:
        cluster.shutdown()
    plot(result, args.out)
    return 0


def plot(result: dict, out: Path) -> None:
    plt = plotting.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for e in result["modes"]:
        lab = f"connections_per_actor={e['connections_per_actor']}"
        ms = [s["rollouts"] for s in e["load"]]
        axes[0].plot(ms, [s["delivered_tokens_per_s"] for s in e["load"]], marker="o", label=lab)
        axes[1].plot(ms, [s["ttft_ms"]["p90"] for s in e["load"]], marker="o", label=lab)
        axes[2].plot(ms, [s["api_overhead_ms"]["p90"] or 0 for s in e["load"]], marker="o", label=lab)
    for ax, t in zip(
        axes, ["delivered tokens/s (all rollouts)", "TTFT p90, ms", "server API overhead p90, ms"]
    ):
        ax.set_xlabel("concurrent rollouts")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend()
    plotting.save(fig, out / "scaling_load.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    modes = [str(e["connections_per_actor"]) for e in result["modes"]]
    ax.bar(modes, [e["idle"]["uss_mb_per_connection"] for e in result["modes"]])
    ax.set_xlabel("connections_per_actor")
    ax.set_ylabel("private memory per idle connection, MiB")
    ax.set_title("Memory per held connection")
    plotting.save(fig, out / "scaling_memory.png")
