"""``responses-ws bench scaling --real-nodes`` (as root): the scaling experiment on real nodes.
One harness (a head carrying the inference replicas, three session nodes, HAProxy in front);
for 1, 2, 3 session nodes in the balancer (the others set to ``maint``, their raylets still
running), the same Codex-like load as ``bench capacity`` (its client processes, from the root
namespace, through the balancer) — turns/s and p50/p99 non-model time per node count, each
node's share of the connections and its CPU per turn it served, the balancer's CPU per turn;
the node counts interleaved over ``--repeats`` rounds, medians and spreads over them."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from .. import processes, results
from ..kinds.admission import arrivals, arrived
from ..kinds.capacity import one_level
from ..runner import start_local
from ..scale_model import (
    Deployment,
    Limits,
    Line,
    Measured,
    fit_line,
    session_nodes_per_cluster,
    size,
    slope_error,
)
from ..stats import mean, median, spread
from . import network, shared_load
from .balancer import command, session_counts
from .harness import Harness
from .topology import PREFIX, NodeSpec

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


# ----------------------------------------------------------------------------- the capacity model
# ``--model``: what the shared parts carry per turn, per connection and per node, at 1, 2, 3
# session nodes under the same load per node (docs/scaling.md, "A capacity model to 1000
# session nodes"); each node count is a harness of its own, so the Ray cluster has exactly
# that many session nodes.

METRICS_REPORT_MS = "1000"  # Ray's metrics every second (its default, 10 s, is longer than a window)
SHARED = {
    "gcs_cpu_ms_per_s": "cpu/head/gcs_server",
    "serve_controller_cpu_ms_per_s": "cpu/head/ray::ServeController",
    "head_raylet_cpu_ms_per_s": "cpu/head/raylet",
}


def resume_on(grace_s: float) -> Callable[[dict[str, Any]], None]:
    def edit(args: dict[str, Any]) -> None:
        fixed_inference(args)
        args.setdefault("session", {})["resume_grace_s"] = grace_s

    return edit


def redeploy(h: Harness, edit: Callable[[dict[str, Any]], None], timeout_s: float = 300.0) -> float:
    """Deploy the harness's Serve config again with ``edit`` applied; seconds until every
    session node answers ``/readyz`` and the balancer has them all up."""
    assert h.temp_dir is not None
    t0 = time.monotonic()
    h.edit_args = edit
    path = h.temp_dir / "serve-config-model.json"
    path.write_text(json.dumps(h.app_config()))
    h.driver("deploy", str(path), "--timeout", str(timeout_s), timeout_s=timeout_s + 30)
    for node in h.session_nodes:
        h.wait_ready(node.name, timeout_s=timeout_s)
    deadline = time.monotonic() + 60
    while not all(s.startswith("UP") for s in h.server_states().values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"balancer: {h.server_states()}")
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


def shared_figures(rates: dict[str, float], h: Harness) -> dict[str, Any]:
    """The shared parts' rates per second in one window (CPU ms/s, RPCs/s, Redis per s)."""
    out: dict[str, Any] = {name: round(rates.get(key, 0.0), 2) for name, key in SHARED.items()}
    for name, key in SHARED.items():  # a process's busiest thread: one core is its ceiling
        label = key.removeprefix("cpu/")
        out[name.replace("_cpu_", "_busiest_thread_cpu_")] = round(
            shared_load.busiest_thread(rates, label), 2
        )
    rpcs = {k.removeprefix("gcs_rpc/"): v for k, v in rates.items() if k.startswith("gcs_rpc/")}
    out["gcs_rpcs_per_s"] = round(sum(rpcs.values()), 2) if rpcs else None
    out["gcs_rpcs_by_method_per_s"] = {
        k: round(v, 2) for k, v in sorted(rpcs.items(), key=lambda kv: -kv[1]) if v >= 0.05
    }
    nodes = [n.name for n in h.session_nodes]
    out["session_node_cpu_ms_per_s"] = {
        n: round(sum(v for k, v in rates.items() if k.startswith(f"cpu/{n}/")), 1) for n in nodes
    }
    out["session_raylet_cpu_ms_per_s"] = {n: round(rates.get(f"cpu/{n}/raylet", 0.0), 1) for n in nodes}
    out["head_cpu_ms_per_s"] = round(sum(v for k, v in rates.items() if k.startswith("cpu/head/")), 1)
    out["redis_cmds_per_s"] = round(rates.get("redis/commands", 0.0), 2)
    out["redis_cmds_by_name_per_s"] = {
        k.removeprefix("redis/cmd/"): round(v, 2)
        for k, v in sorted(rates.items(), key=lambda kv: -kv[1])
        if k.startswith("redis/cmd/") and v > 0
    }
    out["redis_net_input_bytes_per_s"] = round(rates.get("redis/net_input_bytes", 0.0), 1)
    out["redis_cpu_ms_per_s"] = round(rates.get("redis/cpu_s", 0.0) * 1000, 3)
    return out


def net_of(rates: dict[str, float], background: dict[str, float]) -> dict[str, float]:
    """The store's rates less its idle ones (the balancer's health checks, Redis's own cron)."""
    return {k: v - background.get(k, 0.0) if k.startswith("redis/") else v for k, v in rates.items()}


def per_turn(rates: dict[str, float], turns_per_s: float) -> dict[str, Any]:
    """The store's figures per turn (``rates`` net of the idle window's): commands (all and by
    name, those the scripts run included), bytes, Redis's CPU."""
    if not turns_per_s:
        return {}
    by_cmd = {k.removeprefix("redis/cmd/"): v for k, v in rates.items() if k.startswith("redis/cmd/")}
    return {
        "store_cmds_per_turn": round(rates.get("redis/commands", 0.0) / turns_per_s, 3),
        "store_net_input_bytes_per_turn": round(rates.get("redis/net_input_bytes", 0.0) / turns_per_s, 1),
        "store_net_output_bytes_per_turn": round(rates.get("redis/net_output_bytes", 0.0) / turns_per_s, 1),
        "store_cpu_us_per_turn": round(rates.get("redis/cpu_s", 0.0) * 1e6 / turns_per_s, 2),
        "store_cmds_by_name_per_turn": {
            k: round(v / turns_per_s, 3)
            for k, v in sorted(by_cmd.items(), key=lambda kv: -kv[1])
            if v > 0.005
        },
    }


def idle_window(
    h: Harness, sampler: shared_load.SharedSampler, seconds: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """No connection at all for ``seconds``: the figures, and the raw rates (the background)."""
    t0 = time.time()
    time.sleep(seconds)
    rates, span = shared_load.window(sampler.samples, t0, time.time())
    return {"window_s": round(span, 2), **shared_figures(rates, h)}, rates


def load_phase(
    h: Harness,
    sampler: shared_load.SharedSampler,
    k: int,
    args: argparse.Namespace,
    store: bool,
    background: dict[str, float],
) -> dict[str, Any]:
    """``--loops-per-node`` × ``k`` Codex-like loops through the balancer; the shared parts over
    their steady window (the store's figures per turn net of ``background``)."""
    out = one_level(h.url, args.loops_per_node * k, args, {}, {}, store=store)
    t0 = out["storm_end"]
    rates, span = shared_load.window(sampler.samples, t0, t0 + out["steady_window_s"])
    turns_per_s = out["turns_per_s"] or 0.0
    return {
        "loops": args.loops_per_node * k,
        "store": store,
        "turns_per_s": turns_per_s,
        "every_loop_served": out["every_loop_served"],
        "steady_nonmodel_ms": out["steady_ms"],
        "window_s": round(span, 2),
        **shared_figures(rates, h),
        **per_turn(net_of(rates, background), turns_per_s),
    }


SETTLE_S = 2.0  # held connections' first writes (the state as a connection opens) land before the window


def hold_open(url: str, n: int, hold_s: float) -> tuple[int, float, float]:
    """``n`` WebSockets opened at once and held without a turn (the load runner's connect-only
    loops: bench/kinds/admission.py's ``arrivals``), :data:`SETTLE_S`, then ``hold_s``: how
    many were held, and that window's start and end (time.time())."""
    with start_local(arrivals(url, n, rate=None, open_timeout=30.0)) as run:
        arrived(run)
        held = run.opened()
        time.sleep(SETTLE_S)
        t0 = time.time()
        time.sleep(hold_s)
        t1 = time.time()
        run.stop()
    return held, t0, t1


def held_connections(
    h: Harness, sampler: shared_load.SharedSampler, n: int, hold_s: float, background: dict[str, float]
) -> dict[str, Any]:
    """``n`` WebSockets opened through the balancer and held without a turn for ``hold_s``
    (:func:`hold_open`): the store's commands and CPU per connection per second (with resume
    on: the heartbeats), net of ``background``."""
    held, t0, t1 = hold_open(h.ws_url, n, hold_s)
    rates, span = shared_load.window(sampler.samples, t0, t1)
    net = net_of(rates, background)
    return {
        "connections": held,
        "window_s": round(span, 2),
        **{
            f"store_{name}_per_connection_s": round(net.get(key, 0.0) * scale / held, 4) if held else None
            for name, key, scale in (
                ("cmds", "redis/commands", 1),
                ("net_input_bytes", "redis/net_input_bytes", 1),
                ("cpu_us", "redis/cpu_s", 1e6),
            )
        },
        "store_cmds_by_name_per_connection_s": {
            k.removeprefix("redis/cmd/"): round(v / held, 4)
            for k, v in net.items()
            if k.startswith("redis/cmd/") and held and v > 0
        },
        **shared_figures(rates, h),
    }


NOT_ACTORS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def actors_by_node(h: Harness) -> dict[str, dict[str, int]]:
    """Each node's Ray actors now, by process title (idle workers and Ray's per-node agents,
    which are not actors, left out)."""
    out: dict[str, dict[str, int]] = {n.name: {} for n in h.topology.nodes}
    for label in shared_load.labelled_processes(h).values():
        node, _, title = label.partition("/")
        if title.startswith("ray::") and title not in NOT_ACTORS:
            out[node][title] = out[node].get(title, 0) + 1
    return out


def model_level(k: int, args: argparse.Namespace) -> dict[str, Any]:
    """One harness with ``k`` session nodes: idle, store:false and store:true load, then resume
    on (a redeploy): held connections, store:false and store:true load again."""
    level: dict[str, Any] = {"session_nodes": k}
    t0 = time.monotonic()
    h = Harness(specs(k), edit_args=fixed_inference)
    h.env["RAY_metrics_report_interval_ms"] = METRICS_REPORT_MS
    with h:
        level["harness_up_s"] = round(time.monotonic() - t0, 1)
        print(f"{k} session node(s): harness up in {level['harness_up_s']} s", flush=True)
        sampler = shared_load.SharedSampler(h, lambda: shared_load.labelled_processes(h)).start()
        try:
            level["metrics_url_found"] = sampler.metrics_url is not None
            level["idle"], background = idle_window(h, sampler, args.idle_s)
            print(f"  idle: {level['idle']}", flush=True)
            for name, store in (("store_false", False), ("store_true", True)):
                level[name] = load_phase(h, sampler, k, args, store, background)
                print(f"  {name}: {level[name]}", flush=True)
            level["redeploy_s"] = redeploy(h, resume_on(args.resume_grace))
            print(f"  resume on: redeployed in {level['redeploy_s']} s", flush=True)
            level["resume_held"] = held_connections(
                h, sampler, args.held_per_node * k, args.hold_s, background
            )
            print(f"  resume, held: {level['resume_held']}", flush=True)
            for name, store in (("resume_store_false", False), ("resume_store_true", True)):
                level[name] = load_phase(h, sampler, k, args, store, background)
                print(f"  {name}: {level[name]}", flush=True)
            level["actors_by_node"] = actors_by_node(h)
            level["actors_per_session_node"] = mean(
                sum(level["actors_by_node"][n.name].values()) for n in h.session_nodes
            )
        finally:
            sampler.close()
            level["sampler_errors"] = sampler.errors
    return level


def model_table(levels: list[dict[str, Any]]) -> list[str]:
    """The printed table: one row per node count and phase."""
    head = (
        f"{'nodes':>5} {'phase':<20} {'turns/s':>7} {'cmds/turn':>9} {'B in/turn':>10} "
        f"{'redis us/turn':>13} {'GCS ms/s':>8} {'GCS rpc/s':>9} {'ctrl ms/s':>9} {'head raylet':>11}"
    )
    rows = [head]
    for lv in levels:
        for phase in (
            "idle",
            "store_false",
            "store_true",
            "resume_held",
            "resume_store_false",
            "resume_store_true",
        ):
            p = lv.get(phase)
            if not p:
                continue
            rows.append(
                f"{lv['session_nodes']:>5} {phase:<20} {p.get('turns_per_s', '-')!s:>7} "
                f"{p.get('store_cmds_per_turn', p.get('store_cmds_per_connection_s', '-'))!s:>9} "
                f"{p.get('store_net_input_bytes_per_turn', '-')!s:>10} {p.get('store_cpu_us_per_turn', '-')!s:>13} "
                f"{p['gcs_cpu_ms_per_s']:>8} {p['gcs_rpcs_per_s']!s:>9} {p['serve_controller_cpu_ms_per_s']:>9} "
                f"{p['head_raylet_cpu_ms_per_s']:>11}"
            )
    return rows


def run_model(args: argparse.Namespace) -> int:
    counts = [int(x) for x in args.nodes.split(",")]
    levels = []
    for k in counts:
        levels.append(model_level(k, args))
        left = [ns for ns in network.namespaces() if ns.startswith(PREFIX)]
        if left:
            raise RuntimeError(f"the harness left namespaces behind: {left}")
    for row in model_table(levels):
        print(row)
    payload = {
        "command": args.command,
        "setup": (
            "one harness per node count: head (GCS, Serve controller, Redis, "
            f"{INFERENCE_REPLICAS} inference replicas) + k session nodes, each a network namespace; HAProxy "
            "in front; the clients in the root namespace; all on one machine's cores. Ray's metrics "
            f"reported every {METRICS_REPORT_MS} ms (RAY_metrics_report_interval_ms)"
        ),
        "workload": {
            "preset": args.preset,
            "loops_per_node": args.loops_per_node,
            "duration_s": args.duration,
            "idle_s": args.idle_s,
            "resume_grace_s": args.resume_grace,
            "held_per_node": args.held_per_node,
            "hold_s": args.hold_s,
        },
        "levels": levels,
    }
    results.write(args.out, payload, args.run)
    print(f"wrote {args.out}")
    return 0 if all(lv[p]["every_loop_served"] for lv in levels for p in LOAD_PHASES if p in lv) else 1


LOAD_PHASES = ("store_false", "store_true", "resume_store_false", "resume_store_true")
WINDOWS = ("idle", *LOAD_PHASES, "resume_held")


# ----------------------------------------------------------------------------- the extrapolation

NODE_CORES = 8  # the session node the extrapolation sizes (this machine's are 2 cores shared by all)
SIZES = (10, 100, 1000)


RAW = (
    ("cmds", "redis_cmds_per_s", 1.0),
    ("bytes", "redis_net_input_bytes_per_s", 1.0),
    ("cpu_us", "redis_cpu_ms_per_s", 1000.0),
)


def net_store(level: dict[str, Any], window: str) -> dict[str, float] | None:
    """The store's commands, input bytes and CPU (µs) a turn in a load window (a second of a
    connection in the held window), its idle window's rates taken off; from the raw rates,
    so any ``--model`` results file gives the same figures."""
    w, idle = level[window], level["idle"]
    per = w.get("turns_per_s") or w.get("connections")
    if not per:
        return None
    return {name: (w[key] - idle[key]) * scale / per for name, key, scale in RAW}


def actors_per_node(level: dict[str, Any]) -> float | None:
    """A session node's Ray actors at the end of a harness (its gateway and session hosts)."""
    nodes = [counts for name, counts in level.get("actors_by_node", {}).items() if name != "head"]
    if not nodes:
        return None
    return mean(sum(v for t, v in counts.items() if t not in NOT_ACTORS) for counts in nodes)


def measured_inputs(
    payload: dict[str, Any], phase: str = "resume_store_false", margin: float = 0.0
) -> tuple[Measured, dict[str, float]]:
    """The model's inputs from a ``--model`` results file: lines fitted to the shared parts'
    CPU against session nodes over every window of every node count (idle, loaded, held; the
    load per node is the same at each), their slopes raised by ``margin`` standard errors; the
    store's figures per turn of ``phase`` (default store:false turns with resume on) and
    per held connection; and the session node's CPU per turn and the seconds between a loop's
    turns (for :func:`deployment`)."""
    levels = payload["levels"]

    def line(key: str) -> Line:
        thread = key.replace("_cpu_", "_busiest_thread_cpu_")  # absent from runs before it was measured
        points = [
            (lv["session_nodes"], lv[p].get(thread, lv[p][key])) for lv in levels for p in WINDOWS if p in lv
        ]
        fitted = fit_line(points)  # a slope below 0 is no growth the harness can see
        return Line(fitted.base, max(0.0, fitted.per_node + margin * slope_error(points, fitted)))

    def store(window: str, name: str) -> float:
        return median([(net_store(lv, window) or {}).get(name) for lv in levels], None) or 0.0

    loaded = [lv["store_false"] for lv in levels if lv["store_false"]["turns_per_s"]]
    m = Measured(
        gcs_thread_ms_per_s=line("gcs_cpu_ms_per_s"),
        controller_thread_ms_per_s=line("serve_controller_cpu_ms_per_s"),
        head_raylet_thread_ms_per_s=line("head_raylet_cpu_ms_per_s"),
        store_cmds_per_turn=store(phase, "cmds"),
        store_bytes_per_turn=store(phase, "bytes"),
        store_cpu_us_per_turn=store(phase, "cpu_us"),
        store_cmds_per_connection_s=store("resume_held", "cmds"),
        store_cpu_us_per_connection_s=store("resume_held", "cpu_us"),
        actors_per_session_node=median([actors_per_node(lv) for lv in levels], None) or 1.0,
    )
    node = {
        "session_node_cpu_ms_per_turn": median(
            [sum(p["session_node_cpu_ms_per_s"].values()) / p["turns_per_s"] for p in loaded], None
        )
        or 0.0,
        "s_between_a_loops_turns": median([p["loops"] / p["turns_per_s"] for p in loaded], None) or 0.0,
    }
    return m, node


def deployment(node: dict[str, float], cores: int = NODE_CORES, headroom: float = 0.5) -> Deployment:
    """A session node of ``cores`` cores run to ``headroom`` of them at the measured CPU per
    turn, holding the connections that turn rate implies at the measured pace of a loop."""
    turns = cores * 1000.0 * headroom / node["session_node_cpu_ms_per_turn"]
    return Deployment(turns_per_node_s=turns, connections_per_node=turns * node["s_between_a_loops_turns"])


def spread_text(values: list[float | None], fmt: str = "{:.3g}") -> str:
    """The median and range of the values, as text ("-" for none)."""
    s = spread(values, digits=12)
    if s["median"] is None:
        return "-"
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def print_inputs(payload: dict[str, Any]) -> None:
    """The measured inputs as table rows: the store per turn of each load (per second of a
    held connection), and the shared parts per node count (median and range over its windows)."""
    levels = payload["levels"]
    print("the store, net of the idle window, median (range) over the node counts:")
    for window in (*LOAD_PHASES, "resume_held"):
        nets = [net_store(lv, window) for lv in levels if window in lv]
        by_name: dict[str, list[float]] = {}
        for lv in levels:
            key = (
                "store_cmds_by_name_per_turn"
                if window != "resume_held"
                else "store_cmds_by_name_per_connection_s"
            )
            for name, v in lv[window].get(key, {}).items():
                by_name.setdefault(name, []).append(v)
        names = ", ".join(
            f"{k} {median(v, None) or 0.0:.2f}"
            for k, v in sorted(by_name.items(), key=lambda kv: -(median(kv[1], None) or 0.0))
        )
        print(
            f"| {window} | {spread_text([n['cmds'] if n else None for n in nets])} | "
            f"{spread_text([n['bytes'] / 1000 if n else None for n in nets])} | "
            f"{spread_text([n['cpu_us'] if n else None for n in nets], '{:.0f}')} | {names or '-'} |"
        )
    print("the shared parts, median (range) over each harness's windows:")
    for lv in levels:
        ws = [lv[w] for w in WINDOWS if w in lv]

        def col(key: str, ws: list[dict[str, Any]] = ws) -> list[float | None]:
            return [w.get(key) for w in ws]

        def rpc(method: str, ws: list[dict[str, Any]] = ws) -> list[float | None]:
            return [w["gcs_rpcs_by_method_per_s"].get(method) for w in ws if w["gcs_rpcs_per_s"] is not None]

        raylets = [mean(w["session_raylet_cpu_ms_per_s"].values()) for w in ws]
        print(
            f"| {lv['session_nodes']} | {spread_text(col('gcs_cpu_ms_per_s'))} | "
            f"{spread_text(col('gcs_busiest_thread_cpu_ms_per_s'))} | {spread_text(col('gcs_rpcs_per_s'))} | "
            f"{spread_text(rpc('NodeResourceInfoGcsService.GetDrainingNodes'))} | "
            f"{spread_text(rpc('NodeInfoGcsService.GetAllNodeInfo'))} / "
            f"{spread_text(rpc('NodeResourceInfoGcsService.GetAllResourceUsage'))} | "
            f"{spread_text(col('serve_controller_cpu_ms_per_s'))} | "
            f"{spread_text(col('serve_controller_busiest_thread_cpu_ms_per_s'))} | "
            f"{spread_text(col('head_raylet_cpu_ms_per_s'))} | {spread_text(raylets)} |"
        )


def print_extrapolation(payload: dict[str, Any]) -> int:
    """The measured inputs, then the model at 10, 100 and 1000 session nodes: on the fitted
    lines and on their slopes raised by two standard errors (what 1–3 nodes cannot rule out);
    the store for store:false and store:true turns with resume on."""
    print_inputs(payload)
    lim = Limits()
    for margin in (0.0, 2.0):
        m, node = measured_inputs(payload, "resume_store_false", margin)
        d = deployment(node)
        cap, part = session_nodes_per_cluster(m, d, lim)
        print(
            f"slopes + {margin:g} s.e., the busiest thread's CPU ms/s against session nodes: GCS "
            f"{m.gcs_thread_ms_per_s}, Serve controller {m.controller_thread_ms_per_s}, head raylet "
            f"{m.head_raylet_thread_ms_per_s}; "
            f"{m.actors_per_session_node:g} actors a session node"
        )
        print(
            f"  a session node of {NODE_CORES} cores at half of them: {d.turns_per_node_s:.0f} turns/s and "
            f"{d.connections_per_node:.0f} connections ({node['session_node_cpu_ms_per_turn']:.1f} ms of its CPU a "
            f"turn, a loop's turn every {node['s_between_a_loops_turns']:.2f} s); one Ray cluster takes {cap} "
            f"session nodes before {part} passes half of its limit"
        )
        for n in SIZES:
            s = size(m, d, lim, n)
            print(
                f"  {n:>5} session nodes: {s.ray_clusters} Ray cluster(s) of {s.session_nodes_per_cluster}; "
                f"nearest its limit: {s.first_bottleneck} at {s.shares[s.first_bottleneck]:.0%} of its half; "
                + ", ".join(f"{k} {v:.0%}" for k, v in s.shares.items())
            )
    m_false, node = measured_inputs(payload, "resume_store_false")
    m_true, _ = measured_inputs(payload, "resume_store_true")
    d = deployment(node)
    for label, m in (("store:false + resume", m_false), ("store:true + resume", m_true)):
        print(
            f"store, {label}: {m.store_cmds_per_turn:g} commands, {m.store_bytes_per_turn / 1000:.1f} kB in, "
            f"{m.store_cpu_us_per_turn:g} us of Redis CPU a turn; {m.store_cmds_per_connection_s:g} commands, "
            f"{m.store_cpu_us_per_connection_s:g} us a held connection a second"
        )
        for n in SIZES:
            s = size(m, d, lim, n)
            print(
                f"  {n:>5} session nodes: {s.store_cmds_per_s:.0f} commands/s, {s.store_mb_per_s:.1f} MB/s in, "
                f"{s.store_primaries} primaries at half a core ({s.redis_cluster_nodes} Redis nodes with a replica "
                f"each; within the specification's ~1000: {s.redis_cluster_fits})"
            )
    return 0
