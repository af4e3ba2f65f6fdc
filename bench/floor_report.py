"""The floor kind's records and figures (bench/kinds/floor.py): each turn as this server answered
it (:class:`Turn`, :class:`Run`), a run's or round's medians and CPU per turn by role
(:func:`summarise`), their spread over rounds (:func:`over_rounds`), and the client's own cost
of the recorded frames (:func:`client_costs`).  No network."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, cast

from .floor_budgets import rounds_spread
from .stats import median


@dataclass
class Turn:
    create: str  # the create as sent (replayed to the reference verbatim)
    frames: list[str]  # the server's answer, as received
    total_ms: float
    model_ms: float | None = None  # server-reported queue + prefill + decode
    api_overhead_ms: float | None = None
    backend_ms: float | None = None  # the server's model call beyond the model's time
    phases: dict[str, float] = field(default_factory=dict)  # the server's timings, all of them


@dataclass
class Run:
    mode: str
    turns: list[Turn] = field(default_factory=list)
    deflate: bool = False  # the server accepted the client's permessage-deflate offer
    cpu_ms: float | None = None  # the server's processes' CPU over the run (embedded server only)


# ----------------------------------------------------------------------------- summaries


def cpu_per_turn(
    cpu_ms: dict[str, float], turns: int, background_ms_per_s: dict[str, float], wall_s: float
) -> dict[str, float]:
    """CPU ms per turn by role over a round, with the API tier (gateway + session hosts),
    all of the server's processes, and Ray's idle background over the round's length."""
    if not cpu_ms or not turns:
        return {}
    out = {role: round(ms / turns, 3) for role, ms in cpu_ms.items()}
    out["api_tier"] = round((cpu_ms.get("gateway", 0.0) + cpu_ms.get("session_host", 0.0)) / turns, 3)
    out["all"] = round(sum(cpu_ms.values()) / turns, 3)
    out["ray_background"] = round(background_ms_per_s.get("ray", 0.0) * wall_s / turns, 3)
    return out


def summarise(
    run: Run,
    reference: list[float],
    reference_cpu_ms: float,
    skip: int,
    *,
    cpu_ms: dict[str, float] | None = None,
    background_ms_per_s: dict[str, float] | None = None,
    wall_s: float = 0.0,
) -> dict[str, Any]:
    """One run's (or round's) figures: medians over its turns past the first ``skip``; CPU
    over all its turns."""
    turns = run.turns[skip:]
    ours = [t.total_ms - t.model_ms for t in turns if t.model_ms is not None]
    ref = reference[skip:]
    api = [t.api_overhead_ms for t in turns if t.api_overhead_ms is not None]
    n = len(run.turns)
    out: dict[str, Any] = {
        "turns": len(turns),
        "server_nonmodel_ms": median(ours, 3),
        "reference_ms": median(ref, 3),
        "ratio": round(m_ours / m_ref, 2)
        if (m_ours := median(ours, None)) and (m_ref := median(ref, None))
        else None,
        "server_api_overhead_ms": median(api, 3),
        "server_backend_ms": median([t.backend_ms for t in turns if t.backend_ms is not None], 3),
        "frames_per_turn": median([len(t.frames) for t in turns], 3),
        "bytes_per_turn": median([sum(len(f) for f in t.frames) for t in turns], 3),
        "server_deflate": run.deflate,
        "server_cpu_ms_per_turn": None if run.cpu_ms is None else round(run.cpu_ms / n, 3),
        "reference_cpu_ms_per_turn": round(reference_cpu_ms / n, 3) if n else None,
    }
    if cpu_ms:
        by_role = cpu_per_turn(cpu_ms, n, background_ms_per_s or {}, wall_s)
        out["cpu_ms_per_turn"] = by_role
        out["server_cpu_ms_per_turn"] = by_role["all"]
        ref_cpu = out["reference_cpu_ms_per_turn"]
        out["api_tier_cpu_ratio"] = round(by_role["api_tier"] / ref_cpu, 2) if ref_cpu else None
    out["client_minus_server_ms"] = round(out["server_nonmodel_ms"] - out["server_api_overhead_ms"], 3)
    names = sorted({k for t in turns for k in t.phases})
    out["server_phases_ms"] = {k: median([t.phases[k] for t in turns if k in t.phases], 3) for k in names}
    return out


SPREAD_KEYS = ("server_nonmodel_ms", "reference_ms", "ratio", "server_api_overhead_ms", "server_backend_ms")


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread over rounds of each round's medians (and of its CPU per turn by role)."""
    out: dict[str, Any] = {"rounds": len(rounds)}
    for key in (
        *SPREAD_KEYS,
        "reference_cpu_ms_per_turn",
        "api_tier_cpu_ratio",
        "reference_block_cpu_ms_per_turn",
        "api_tier_cpu_ratio_block",
    ):
        out[key] = rounds_spread([r.get(key) for r in rounds])
    roles = sorted({k for r in rounds for k in r.get("cpu_ms_per_turn", {})})
    out["cpu_ms_per_turn"] = {k: rounds_spread([r["cpu_ms_per_turn"].get(k) for r in rounds]) for k in roles}
    ray = sorted({k for r in rounds for k in r.get("ray_cpu_ms_per_turn_by_process", {})})
    out["ray_cpu_ms_per_turn_by_process"] = {
        k: rounds_spread([r["ray_cpu_ms_per_turn_by_process"].get(k) for r in rounds]) for k in ray
    }
    phases = sorted({k for r in rounds for k in r.get("server_phases_ms", {})})
    out["server_phases_ms"] = {
        k: rounds_spread([r["server_phases_ms"].get(k) for r in rounds]) for k in phases
    }
    return out


def fmt(s: dict[str, float] | None, unit: str = " ms") -> str:
    """``median (p25-p75, min-max)``."""
    if not s:
        return "n/a"
    return f"{s['median']:.2f}{unit} (p25-p75 {s['p25']:.2f}-{s['p75']:.2f}, min-max {s['min']:.2f}-{s['max']:.2f})"


# ----------------------------------------------------------------------------- the client's own cost


def client_costs(run: Run, skip: int, repeat: int = 3) -> dict[str, float | None]:
    """ms per turn, median over the recorded turns (each the best of ``repeat``): the raw
    client's ``json.loads`` of every frame against the openai SDK's parse of the same frames
    into its event types (``construct_type_unchecked(..., ResponsesServerEvent)``, what its
    ``recv()`` does), and the create's encoding both ways (``json.dumps`` against the SDK's
    ``maybe_transform`` then ``json.dumps``)."""
    from openai._models import construct_type_unchecked
    from openai._utils import maybe_transform
    from openai.types.responses.responses_client_event_param import ResponsesClientEventParam
    from openai.types.responses.responses_server_event import ResponsesServerEvent

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return min(times)

    rows: dict[str, list[float]] = {
        "raw_parse_ms": [],
        "sdk_parse_ms": [],
        "raw_encode_ms": [],
        "sdk_encode_ms": [],
    }
    for turn in run.turns[skip:]:
        body = json.loads(turn.create)
        rows["raw_parse_ms"].append(best(lambda t=turn: [json.loads(f) for f in t.frames]))
        rows["sdk_parse_ms"].append(
            best(
                lambda t=turn: [
                    construct_type_unchecked(value=json.loads(f), type_=cast(Any, ResponsesServerEvent))
                    for f in t.frames
                ]
            )
        )
        rows["raw_encode_ms"].append(best(lambda b=body: json.dumps(b)))
        rows["sdk_encode_ms"].append(
            best(lambda b=body: json.dumps(maybe_transform(b, ResponsesClientEventParam)))
        )
    return {k: median(v, 3) for k, v in rows.items()}
