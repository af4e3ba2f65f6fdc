"""Summaries of agent-loop results: numbers per transport, the table and the plots."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import plotting
from .rollouts import PHASES, RolloutRecord
from .stats import mean, pct


def _dist(values: Iterable[float]) -> dict[str, float | None]:
    v = list(values)
    return {
        "median": pct(v, 0.5),
        "p90": pct(v, 0.9),
        "mean": mean(v),
        "n": len(v),
    }


def overhead_ms(turn) -> float | None:
    """The server's API overhead for a turn when it reports timings."""
    server = turn["server"] if isinstance(turn, dict) else turn.server
    if server and "api_overhead" in server:
        return server["api_overhead"]
    return None


def nonmodel_ms(turn) -> float | None:
    """Client-observed turn time minus the emulator's modelled time for it (an estimate of
    everything that is not the model: network, server, Ray hops, client)."""
    t = turn if isinstance(turn, dict) else turn.__dict__
    if t["model_ms_est"] is None or t["error"]:
        return None
    return t["total_ms"] - t["model_ms_est"]


def failed(summary: dict[str, Any]) -> bool:
    """Did any rollout of a :func:`summarise` result fail?  (The command's exit code is 1.)"""
    return any(s["failed_rollouts"] for s in summary.values())


def summarise(records: Sequence[RolloutRecord]) -> dict[str, Any]:
    by: dict[str, list[RolloutRecord]] = defaultdict(list)
    for r in records:
        by[r.transport].append(r)
    out: dict[str, Any] = {}
    for name, rs in by.items():
        ok = [r for r in rs if not r.error]
        turns = [t for r in ok for t in r.turns if not t.error]
        server = [t.server for t in turns if t.server]
        inp = sum(t.input_tokens for t in turns)
        floored = [(r, r.model_s + r.tool_s) for r in ok if r.model_s is not None]
        outp = sum(t.output_tokens for t in turns)
        s: dict[str, Any] = {
            "rollouts": len(rs),
            "failed_rollouts": len(rs) - len(ok),
            "errors": [r.error for r in rs if r.error][:5],
            "turns": len(turns),
            "e2e_s": _dist(r.e2e_s for r in ok),
            "e2e_minus_tools_s": _dist(r.e2e_s - r.tool_s for r in ok),
            "e2e_minus_connect_s": _dist(r.e2e_s - r.connect_ms / 1000 for r in ok),
            "connect_ms": _dist(r.connect_ms for r in ok),
            "turn_ms": _dist(t.total_ms for t in turns),
            "ttft_ms": _dist(t.ttft_ms for t in turns if t.ttft_ms is not None),
            "nonmodel_ms_est": _dist(x for t in turns if (x := nonmodel_ms(t)) is not None),
            "api_overhead_ms": _dist(x for t in turns if (x := overhead_ms(t)) is not None),
            "phases_mean_ms": (
                {p: mean(sv.get(p, 0.0) for sv in server) for p in PHASES} if server else None
            ),
            "request_kb": _dist(t.request_bytes / 1024 for t in turns),
            "input_tokens_last_turn": _dist(r.turns[-1].input_tokens for r in ok if r.turns),
            "cached_share": (sum(t.cached_tokens for t in turns) / inp) if inp else None,
            # The prompt cache's reads and writes by lifetime, summed over the turns.
            "cache_tokens": {
                "read": sum(t.cached_tokens for t in turns),
                "write_30m": sum(t.write_30m_tokens for t in turns),
                "write_12h": sum(t.write_12h_tokens for t in turns),
            },
            "output_tokens_per_s": (outp / sum(t.total_ms for t in turns) * 1000) if turns else None,
            "timings_reported": bool(server),
            # The floor: the server-reported model time (queue + prefill + decode) of the
            # rollout plus its tool time; e2e above it is everything that is not the model.
            "floor_s": _dist(f for _, f in floored),
            "above_floor": _dist(r.e2e_s / f - 1 for r, f in floored),
            "above_floor_ms_per_turn": _dist(
                (r.e2e_s - f) * 1000 / len(r.turns) for r, f in floored if r.turns
            ),
        }
        out[name] = s
    base = out.get("ws")
    if base and base["e2e_s"]["median"]:
        for name, s in out.items():
            if name != "ws" and s["e2e_s"]["median"]:
                s["ws_gain"] = {
                    "e2e_median": 1 - base["e2e_s"]["median"] / s["e2e_s"]["median"],
                    "e2e_p90": 1 - base["e2e_s"]["p90"] / s["e2e_s"]["p90"],
                    "e2e_minus_tools_median": 1
                    - base["e2e_minus_tools_s"]["median"] / s["e2e_minus_tools_s"]["median"],
                    "e2e_minus_connect_median": 1
                    - base["e2e_minus_connect_s"]["median"] / s["e2e_minus_connect_s"]["median"],
                    "speedup_e2e_median": s["e2e_s"]["median"] / base["e2e_s"]["median"],
                }
    return out


def per_turn_series(records: Sequence[RolloutRecord], metric) -> dict[str, list[tuple[int, float]]]:
    """Median of ``metric(turn)`` per turn index, per transport."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        for t in r.turns:
            v = metric(t)
            if v is not None:
                acc[r.transport][t.turn].append(v)
    return {  # each list has values, so each median is there
        name: [(i, m) for i, vs in sorted(d.items()) if (m := pct(vs, 0.5)) is not None]
        for name, d in acc.items()
    }


# ------------------------------------------------------------------------ terminal table


def console():
    """A rich console; 200 columns wide when the output is not a terminal (tables stay whole)."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=200)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def render_table(summary: dict[str, Any], title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    cols = [
        "transport",
        "rollouts (failed)",
        "e2e s med / p90",
        "e2e − tools s",
        "connect ms",
        "turn ms med",
        "TTFT ms med / p90",
        "API overhead ms med / p90",
        "non-model ms est. med",
        "cached share",
        "req KB med",
        "out tok/s",
        "ws faster by",
    ]
    for c in cols:
        t.add_column(c, justify="right" if c != "transport" else "left")
    for name, s in summary.items():
        gain = s.get("ws_gain")
        t.add_row(
            name,
            f"{s['rollouts']} ({s['failed_rollouts']})",
            f"{_f(s['e2e_s']['median'], '{:.2f}')} / {_f(s['e2e_s']['p90'], '{:.2f}')}",
            _f(s["e2e_minus_tools_s"]["median"], "{:.2f}"),
            _f(s["connect_ms"]["median"]),
            _f(s["turn_ms"]["median"]),
            f"{_f(s['ttft_ms']['median'])} / {_f(s['ttft_ms']['p90'])}",
            f"{_f(s['api_overhead_ms']['median'])} / {_f(s['api_overhead_ms']['p90'])}",
            _f(s["nonmodel_ms_est"]["median"]),
            _f(s["cached_share"], "{:.0%}"),
            _f(s["request_kb"]["median"]),
            _f(s["output_tokens_per_s"], "{:.0f}"),
            "–" if not gain else f"{gain['e2e_median']:.1%}",
        )
    return t


def render_phases(summary: dict[str, Any]):
    from rich.table import Table

    if not any(s["phases_mean_ms"] for s in summary.values()):
        return None
    t = Table(title="server phases, mean ms per turn", title_justify="left")
    t.add_column("transport")
    for p in (*PHASES, "api_overhead"):
        t.add_column(p, justify="right")
    for name, s in summary.items():
        ph = s["phases_mean_ms"]
        if ph:
            t.add_row(
                name, *(_f(ph[p], "{:.2f}") for p in PHASES), _f(s["api_overhead_ms"]["mean"], "{:.2f}")
            )
    return t


# ------------------------------------------------------------------------------- plots


def plot_all(
    out_dir: Path, records: Sequence[RolloutRecord], sweep: list[dict[str, Any]] | None, label: str
) -> list[Path]:
    plt = plotting.pyplot()
    written = []
    timings = any(t.server for r in records for t in r.turns)
    metric = overhead_ms if timings else nonmodel_ms
    ylabel = "server API overhead, ms (median)" if timings else "turn time − modelled model time, ms (median)"
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in per_turn_series(records, metric).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
    ax.set_xlabel("turn index")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Per-turn overhead vs turn ({label})")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(plotting.save(fig, out_dir / "overhead_per_turn.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    names = sorted({r.transport for r in records}, key=lambda n: (n != "ws", n))
    data = [[r.e2e_s for r in records if r.transport == n and not r.error] for n in names]
    ax.boxplot(data, tick_labels=names, showmeans=True)
    ax.set_ylabel("end-to-end per rollout, s")
    ax.set_title(f"Rollout end-to-end by transport ({label})")
    ax.grid(alpha=0.3, axis="y")
    written.append(plotting.save(fig, out_dir / "e2e_by_transport.png"))

    if sweep:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        names = sorted({n for s in sweep for n in s["summary"]}, key=lambda n: (n != "ws", n))
        for n in names:
            pts = [(s["tool_rounds"], s["summary"][n]["e2e_s"]["median"]) for s in sweep if n in s["summary"]]
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
            gains = [
                (s["tool_rounds"], s["summary"][n]["ws_gain"]["e2e_median"] * 100)
                for s in sweep
                if n in s["summary"] and "ws_gain" in s["summary"][n]
            ]
            if gains:
                ax2.plot([g[0] for g in gains], [g[1] for g in gains], marker="o", label=f"ws vs {n}")
        ax1.set_xlabel("tool rounds per rollout")
        ax1.set_ylabel("end-to-end median, s")
        ax1.legend()
        ax1.grid(alpha=0.3)
        ax2.set_xlabel("tool rounds per rollout")
        ax2.set_ylabel("ws faster by, % of e2e median")
        ax2.axhline(0, color="grey", lw=0.8)
        ax2.legend()
        ax2.grid(alpha=0.3)
        written.append(plotting.save(fig, out_dir / "sweep_rounds.png", f"Turn-count sweep ({label})"))
    return written
