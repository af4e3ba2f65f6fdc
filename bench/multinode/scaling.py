"""``responses-ws bench scaling --real-nodes`` (as root): the scaling experiment on real nodes.
One harness (a head carrying the inference replicas, three session nodes, HAProxy in front);
for 1, 2, 3 session nodes in the balancer (the others set to ``maint``, their raylets still
running), the same Codex-like load as ``bench capacity`` (its client processes, from the root
namespace, through the balancer) — turns/s and p50/p99 non-model time per node count, each
node's share of the connections and its CPU per turn it served, the balancer's CPU per turn;
the node counts interleaved over ``--repeats`` rounds, medians and spreads over them."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from .. import processes, results
from ..kinds.capacity import one_level
from . import network
from .balancer import command, session_counts
from .harness import Harness
from .topology import NodeSpec

INFERENCE_REPLICAS = 2


def specs(session_nodes: int) -> tuple[NodeSpec, ...]:
    head = NodeSpec("head", {"head": 1, "accelerator": INFERENCE_REPLICAS})
    return (head, *(NodeSpec("session", {"session": 1}) for _ in range(session_nodes)))


def fixed_inference(args: dict[str, Any]) -> None:
    """Two inference replicas throughout: only the session nodes change."""
    scaling = args.setdefault("inference", {}).setdefault("scaling", {})
    scaling["autoscaling"] = dict(
        scaling.get("autoscaling") or {}, min_replicas=INFERENCE_REPLICAS, max_replicas=INFERENCE_REPLICAS
    )


def labelled_processes(h: Harness) -> dict[int, str]:
    """Every process of the harness, pid → its node's name (``balancer`` for HAProxy)."""
    out = {pid: n.name for n in h.topology.nodes for pid in network.namespace_pids(n.namespace)}
    out.update({p.pid: "balancer" for p in h.procs.get("balancer", [])})
    return out


def use_nodes(h: Harness, k: int) -> list[str]:
    """The first ``k`` session nodes take new connections, the others none (``maint``)."""
    names = [n.name for n in h.session_nodes]
    for i, name in enumerate(names):
        command(h.stats_socket, f"set server sessions/{name} state {'ready' if i < k else 'maint'}")
    return names[:k]


def level(h: Harness, k: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the load on ``k`` session nodes."""
    active = use_nodes(h, k)
    time.sleep(1.0)
    before = session_counts(command(h.stats_socket, "show stat"))
    procs = labelled_processes(h)
    out = one_level(h.url, args.loops, args, procs, {})
    after = session_counts(command(h.stats_socket, "show stat"))
    conns = {n: after.get(n, 0) - before.get(n, 0) for n in after}
    cpu = out.pop("cpu_ms_per_turn", {})
    per_node = {}
    for name in active:
        share = conns.get(name, 0) / max(1, sum(conns.values()))
        per_node[name] = {
            "connections": conns.get(name, 0),
            "cpu_ms_per_turn_served": round(cpu.get(name, 0.0) / share, 3) if share else None,
        }
    idle = [n for n in conns if n not in active]
    return {
        "session_nodes": k,
        **out,
        "nodes": per_node,
        "connections_to_inactive_nodes": sum(conns[n] for n in idle),
        "cpu_ms_per_turn": {
            label: v for label, v in cpu.items() if label not in processes.ROLES and label != "all"
        },
    }


def spread(values: list[float | None]) -> dict[str, float | None]:
    vs = [v for v in values if v is not None]
    if not vs:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(vs), 3), "min": round(min(vs), 3), "max": round(max(vs), 3)}


def summary(runs: list[dict[str, Any]], counts: list[int]) -> list[dict[str, Any]]:
    out = []
    for k in counts:
        rs = [r for r in runs if r["session_nodes"] == k]
        nodes = sorted({n for r in rs for n in r["nodes"]})
        out.append(
            {
                "session_nodes": k,
                "rounds": len(rs),
                "turns_per_s": spread([r["turns_per_s"] for r in rs]),
                "steady_nonmodel_ms_p50": spread([r["steady_ms"]["p50"] for r in rs]),
                "steady_nonmodel_ms_p99": spread([r["steady_ms"]["p99"] for r in rs]),
                "connections_by_node": {n: [r["nodes"][n]["connections"] for r in rs] for n in nodes},
                "cpu_ms_per_turn_served_by_node": {
                    n: spread([r["nodes"][n]["cpu_ms_per_turn_served"] for r in rs]) for n in nodes
                },
                "head_cpu_ms_per_turn": spread([r["cpu_ms_per_turn"].get("head") for r in rs]),
                "balancer_cpu_ms_per_turn": spread([r["cpu_ms_per_turn"].get("balancer") for r in rs]),
                "every_loop_served": all(r["every_loop_served"] for r in rs),
            }
        )
    return out


def print_summary(s: dict[str, Any]) -> None:
    t, p50, p99 = s["turns_per_s"], s["steady_nonmodel_ms_p50"], s["steady_nonmodel_ms_p99"]
    print(
        f"{s['session_nodes']} session node(s), {s['rounds']} rounds: {t['median']} turns/s "
        f"({t['min']}-{t['max']}); non-model p50 {p50['median']} ms ({p50['min']}-{p50['max']}), "
        f"p99 {p99['median']} ms ({p99['min']}-{p99['max']}); connections by node "
        f"{s['connections_by_node']}; CPU ms per turn served by node "
        f"{ {n: v['median'] for n, v in s['cpu_ms_per_turn_served_by_node'].items()} }, head "
        f"{s['head_cpu_ms_per_turn']['median']}, balancer {s['balancer_cpu_ms_per_turn']['median']}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    counts = [int(x) for x in args.nodes.split(",")]
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Harness(specs(max(counts)), edit_args=fixed_inference) as h:
        print(f"harness up in {time.monotonic() - t0:.1f}s: balancer {h.url}", flush=True)
        for r in range(args.repeats):
            for k in counts if r % 2 == 0 else counts[::-1]:  # interleaved, the order alternating
                one = level(h, k, args)
                one["round"] = r
                runs.append(one)
                print(
                    f"round {r} {k} node(s): {one['turns_per_s']} turns/s, non-model p50 "
                    f"{one['steady_ms']['p50']} / p99 {one['steady_ms']['p99']} ms, nodes {one['nodes']}, "
                    f"CPU ms/turn {one['cpu_ms_per_turn']}",
                    flush=True,
                )
    table = summary(runs, counts)
    for s in table:
        print_summary(s)
    results.write(
        args.out,
        {
            "command": args.command,
            "setup": (
                f"harness: head (GCS, Serve controller, Redis, {INFERENCE_REPLICAS} inference replicas) + "
                f"{max(counts)} session nodes, each a network namespace; HAProxy in front; the clients in "
                "the root namespace; all on one machine's cores"
            ),
            "workload": {"preset": args.preset, "loops": args.loops, "duration_s": args.duration},
            "summary": table,
            "runs": runs,
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0 if all(s["every_loop_served"] for s in table) else 1
