"""The capacity model (bench/scale_model.py) re-fitted from an experiment's own steps (pure).

Every valid step gives a point per single-threaded shared part (its busiest thread's CPU,
ms per second, against the session nodes in service), the store's commands, bytes and CPU a
turn, and a session node's CPU a turn and pace (the seconds between a loop's turns).  The
lines are fitted by least squares; the extrapolation to 10, 100 and 1000 session nodes is
given on the fitted slopes and on the slopes raised by two standard errors (what the run's
node counts cannot rule out), and the fit's error is each slope's standard error.  What the
experiment does not measure (the store's cost of an idle held connection) is 0 in the model
and named in ``not_measured``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..scale_model import Deployment, Limits, Line, Measured, fit_line, size, slope_error
from ..stats import mean, median
from .nodes import Node

SIZES = (10, 100, 1000)
PARTS = {
    "gcs": "gcs_thread_ms_per_s",
    "serve_controller": "controller_thread_ms_per_s",
    "head_raylet": "head_raylet_thread_ms_per_s",
}
HEADROOM = 0.5  # a session node planned to half of its cores (as bench/multinode/scaling.py)


def points(steps: Sequence[dict[str, Any]], part: str) -> list[tuple[float, float]]:
    return [
        (float(s["session_nodes"]), float(s["shared_cpu_ms_per_s"][part]))
        for s in steps
        if part in (s.get("shared_cpu_ms_per_s") or {})
    ]


def node_cpu_ms_per_turn(step: dict[str, Any]) -> float | None:
    totals = [
        n["cpu_ms_per_turn"]["total"] for n in step["nodes"] if n["cpu_ms_per_turn"].get("total") is not None
    ]
    return mean(totals)


def node_cores(session: Sequence[Node], host_cpus: Mapping[str, int]) -> tuple[float, str]:
    """The cores of the largest session node, and where the figure comes from: the cores its
    machine gives its processes (reported by the sampler there), else Ray's ``CPU`` resource
    (0 on a node started with ``num_cpus=0``, as the multi-node harness's are)."""
    machine = [host_cpus[n.node_id] for n in session if n.node_id in host_cpus]
    if machine:
        return float(max(machine)), "the node's machine"
    return max((n.cpus for n in session), default=1.0), "Ray's CPU resource"


def refit(
    steps: Sequence[dict[str, Any]], node_cores: float, cores_source: str = "given"
) -> dict[str, Any] | None:
    """The model's fit, extrapolation and error from ``steps`` (only the valid ones are
    used) for a session node of ``node_cores`` (``cores_source`` says whose figure it is);
    None when no valid step has the figures."""
    valid = [s for s in steps if s.get("valid") and s.get("turns_per_s")]
    cpu_per_turn = median([node_cpu_ms_per_turn(s) for s in valid], None)
    if not valid or not cpu_per_turn:
        return None
    lines: dict[str, dict[str, Any]] = {}
    fitted: dict[str, Line] = {}
    raised: dict[str, Line] = {}
    for part, field in PARTS.items():
        pts = points(valid, part)
        line = fit_line(pts) if pts else Line(0.0, 0.0)
        se = slope_error(pts, line)
        fitted[field] = Line(line.base, max(0.0, line.per_node))
        raised[field] = Line(line.base, max(0.0, line.per_node + 2 * se))
        lines[part] = {
            "base_ms_per_s": round(line.base, 3),
            "per_node_ms_per_s": round(line.per_node, 4),
            "slope_standard_error": round(se, 4),
            "points": len(pts),
        }
    store = [s.get("store") or {} for s in valid]
    store_fig = {
        "cmds": median([x.get("commands_per_turn") for x in store], None) or 0.0,
        "bytes": median([x.get("bytes_per_turn") for x in store], None) or 0.0,
        "cpu_us": median([x.get("cpu_us_per_turn") for x in store], None) or 0.0,
    }
    actors = median([s.get("actors_per_session_node") for s in valid], None) or 1.0
    pace = median([s["loops"] / s["turns_per_s"] for s in valid], None) or 0.0
    turns = node_cores * 1000.0 * HEADROOM / cpu_per_turn
    dep = Deployment(turns_per_node_s=turns, connections_per_node=turns * pace)
    lim = Limits()
    extrapolation = []
    for label, chosen in (("fitted", fitted), ("slopes + 2 s.e.", raised)):
        m = Measured(
            **chosen,
            store_cmds_per_turn=store_fig["cmds"],
            store_bytes_per_turn=store_fig["bytes"],
            store_cpu_us_per_turn=store_fig["cpu_us"],
            store_cmds_per_connection_s=0.0,
            store_cpu_us_per_connection_s=0.0,
            actors_per_session_node=actors,
        )
        for n in SIZES:
            s = size(m, dep, lim, n)
            extrapolation.append(
                {
                    "slopes": label,
                    "session_nodes": n,
                    "ray_clusters": s.ray_clusters,
                    "session_nodes_per_cluster": s.session_nodes_per_cluster,
                    "first_bottleneck": s.first_bottleneck,
                    "shares": s.shares,
                    "store_cmds_per_s": round(s.store_cmds_per_s, 1),
                    "store_primaries": s.store_primaries,
                }
            )
    return {
        "fit": {
            "lines": lines,
            "session_node_cpu_ms_per_turn": round(cpu_per_turn, 4),
            "s_between_a_loops_turns": round(pace, 4),
            "store_per_turn": store_fig,
            "actors_per_session_node": actors,
            "node_cores": node_cores,
            "node_cores_source": cores_source,
            "turns_per_node_s": round(turns, 1),
            "steps_used": len(valid),
        },
        "extrapolation": extrapolation,
        "error": {part: lines[part]["slope_standard_error"] for part in PARTS},
        "not_measured": ["the store's cost of an idle held connection (0 in the model)"],
    }


def lines_text(model: dict[str, Any]) -> list[str]:
    """The model as the terminal prints it."""
    fit = model["fit"]
    out = [
        "capacity model re-fitted from this run's valid steps ("
        f"{fit['steps_used']}): a session node of {fit['node_cores']:g} cores "
        f"({fit.get('node_cores_source', 'given')}) at half of them carries "
        f"{fit['turns_per_node_s']:.0f} turns/s ({fit['session_node_cpu_ms_per_turn']:.2f} ms of its CPU a turn)",
        "  busiest thread, CPU ms/s = base + per_node x session nodes (slope's standard error): "
        + "; ".join(
            f"{part} {v['base_ms_per_s']:g} {'-' if v['per_node_ms_per_s'] < 0 else '+'} "
            f"{abs(v['per_node_ms_per_s']):g}n (±{v['slope_standard_error']:g})"
            for part, v in fit["lines"].items()
        ),
    ]
    for e in model["extrapolation"]:
        out.append(
            f"  {e['slopes']:>16}: {e['session_nodes']:>5} session nodes -> {e['ray_clusters']} Ray cluster(s) of "
            f"{e['session_nodes_per_cluster']}, nearest its limit: {e['first_bottleneck']} "
            f"({e['shares'][e['first_bottleneck']]:.0%}); store {e['store_cmds_per_s']:.0f} commands/s, "
            f"{e['store_primaries']} primaries"
        )
    out.append("  not measured: " + "; ".join(model["not_measured"]))
    return out
