"""The agent-loop benchmark's speed and context sweeps: the same rollouts at several model
speeds (``--sweep-speed``) or resumed-context sizes (``--sweep-context``), every transport at
each point, and how the API overhead's share and WebSocket mode's gain move with them.

Speed: decode tokens/s.  Each point is a model profile made from the run's model (emu-fast
by default) with decode, burst and prefill rates all scaled by ``speed / its decode rate``
(the fixed prefill overhead kept), named ``emu-speed-<speed>``; an embedded server gets these
profiles added to its config, a server at ``--url`` must already serve them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from inference.emulator.profiles import InferenceConfig, ModelProfile

from . import breakdown, plotting
from .rollouts import RolloutRecord
from .workload import Workload


def speed_model(speed: int) -> str:
    return f"emu-speed-{speed}"


def speed_profile(base: ModelProfile, speed: int) -> ModelProfile:
    """``base`` running at ``speed`` decode tokens/s, every rate scaled alike."""
    f = speed / base.decode_tokens_per_s
    return base.model_copy(
        update={
            "id": speed_model(speed),
            "description": f"{base.id} scaled to {speed} tok/s decode",
            "decode_tokens_per_s": base.decode_tokens_per_s * f,
            "burst_tokens_per_s": None if base.burst_tokens_per_s is None else base.burst_tokens_per_s * f,
            "prefill_tokens_per_s": base.prefill_tokens_per_s * f,
        }
    )


def with_speeds(config: InferenceConfig, model: str, speeds: Sequence[int]) -> InferenceConfig:
    """``config`` plus :func:`speed_profile` of ``model`` at each speed."""
    base = config.profile(model)
    extra = [speed_profile(base, s) for s in speeds if speed_model(s) not in {p.id for p in config.profiles}]
    return config.model_copy(update={"profiles": [*config.profiles, *extra]})


def run_points(
    points: Sequence[tuple[float, Workload]],
    transports: Sequence[str],
    run: Callable[[Workload, str], list[RolloutRecord]],
) -> list[dict[str, Any]]:
    """Every transport at each ``(x, workload)`` point — ``run(workload, label)`` runs one
    (all transports, interleaved) — and per point the comparison
    (:func:`breakdown.compare`) and the rollouts."""
    out = []
    for x, w in points:
        records = run(w, f"{x:g}")
        out.append(
            {
                "x": x,
                "workload": w.as_dict(),
                "comparison": breakdown.compare(records, transports),
                "rollouts": [r.as_dict() for r in records],
            }
        )
    return out


def speed_points(w: Workload, speeds: Sequence[int]) -> list[tuple[float, Workload]]:
    return [(s, replace(w, model=speed_model(s))) for s in speeds]


def context_points(w: Workload, sizes: Sequence[int]) -> list[tuple[float, Workload]]:
    return [(n, replace(w, resume_tokens=n)) for n in sizes]


def lines(points: list[dict[str, Any]], what: str) -> list[str]:
    """One line per point: the API overhead's share per transport and the gain of the first."""
    out = []
    for p in points:
        ts = p["comparison"]["transports"]
        names = list(ts)
        share = ", ".join(f"{n} {ts[n]['api_share']:.1%}" for n in names if ts[n]["api_share"] is not None)
        gains = ", ".join(
            f"vs {n} {g['e2e']:.1%} ({g['without_tools']:.1%} w/o tools)"
            for n in names[1:]
            if (g := ts[n].get("gain_of_" + names[0]))
        )
        out.append(f"{what} {p['x']:>8g}: API overhead share {share}; {names[0]} faster {gains}")
    return out


def plot(path: Path, points: list[dict[str, Any]], xlabel: str, title: str, log_x: bool) -> Path:
    """Two panels against the swept value: API overhead's share of end-to-end time per
    transport, and the first transport's gain over each other one."""
    fig, (ax1, ax2) = plotting.pyplot().subplots(1, 2, figsize=(11, 4))
    names = list(points[0]["comparison"]["transports"]) if points else []
    for n in names:
        pts = [
            (p["x"], 100 * s)
            for p in points
            if (s := p["comparison"]["transports"][n]["api_share"]) is not None
        ]
        ax1.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=n)
        gains = [
            (p["x"], 100 * g["e2e"], 100 * g["without_tools"])
            for p in points
            if (g := p["comparison"]["transports"][n].get("gain_of_" + names[0]))
        ]
        if gains:
            ax2.plot([g[0] for g in gains], [g[1] for g in gains], marker="o", label=f"vs {n}, end to end")
            ax2.plot(
                [g[0] for g in gains],
                [g[2] for g in gains],
                marker="s",
                ls="--",
                label=f"vs {n}, without tool time",
            )
    for ax in (ax1, ax2):
        ax.set_xlabel(xlabel)
        if log_x:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("API overhead, % of end-to-end time")
    ax2.set_ylabel(f"{names[0] if names else ''} faster by, %")
    ax2.axhline(0, color="grey", lw=0.8)
    return plotting.save(fig, path, title)
