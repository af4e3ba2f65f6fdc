"""``bench capacity``'s comparison: this server against the bare-protocol reference (pure).

Each level's figures (bench/kinds/capacity.py's ``summarise``) measured under the same crowd
against this server and against the reference (bench/reference.py) become
``server / reference = ratio`` (:func:`compare`), each against its target where it has one
(:data:`FIGURES`); the CPU per turn by role of this server's processes stands beside the
reference process's own (:func:`cpu_beside`).  :func:`lines` renders them for the terminal,
:func:`print_level` one side's level.
"""

from __future__ import annotations

from typing import Any

# (key, what it is, where it is read in a level's summary, the target ratio or None)
FIGURES: tuple[tuple[str, str, tuple[str, str], float | None], ...] = (
    ("steady_p50", "steady non-model p50 (ms)", ("steady_ms", "p50"), None),
    ("steady_p99", "steady non-model p99 (ms)", ("steady_ms", "p99"), 2.0),
    ("storm_p99", "first turns released at once, non-model p99 (ms)", ("first_turns_ms", "p99"), 3.0),
    ("turns_per_s", "turns/s", ("turns_per_s", ""), None),
)
# the one-loop level's steady p50 is "one loop alone" (its label in the report)
ALONE = "one loop alone, non-model p50 (ms)"
# the server's phases the slowest steady turns are broken down by (bench/kinds/capacity.py's tail)
TAIL_PHASES = ("render", "parse_validate", "backend", "other", "api_overhead", "queue", "prefill", "decode")
# CPU per turn by role, in the order printed (bench/processes.py's roles)
CPU_ROLES = ("gateway", "session_host", "inference", "ray", "ray_background", "api_tier", "all")


def ratio(server: float | None, reference: float | None) -> float | None:
    """``server / reference``, or ``None`` when either is missing or the reference is not
    above zero (a ratio against nothing says nothing)."""
    if server is None or reference is None or reference <= 0:
        return None
    return round(server / reference, 2)


def figure(level: dict[str, Any], where: tuple[str, str]) -> float | None:
    outer, inner = where
    value = level.get(outer)
    if inner:
        value = value.get(inner) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def compare(server: dict[str, Any], reference: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each figure of :data:`FIGURES` as ``{server, reference, ratio, target, met}`` (``met``:
    the ratio at or under its target; ``None`` without a target or a ratio)."""
    out: dict[str, dict[str, Any]] = {}
    for key, _, where, target in FIGURES:
        s, r = figure(server, where), figure(reference, where)
        q = ratio(s, r)
        out[key] = {
            "server": s,
            "reference": r,
            "ratio": q,
            "target": target,
            "met": None if target is None or q is None else q <= target,
        }
    return out


def cpu_beside(server: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """CPU ms per turn over the steady window: this server's by role, the reference's own,
    and the API tier (gateway + session host) against the reference's."""
    by_role = server.get("cpu_ms_per_turn") or {}
    own = reference.get("reference_cpu_ms_per_turn")
    return {
        "server": {k: by_role[k] for k in CPU_ROLES if k in by_role},
        "reference": own,
        "api_tier_ratio": ratio(by_role.get("api_tier"), own),
    }


def label(loops: int, key: str) -> str:
    if loops == 1 and key == "steady_p50":
        return ALONE
    return next(what for k, what, _, _ in FIGURES if k == key)


def verdict(row: dict[str, Any]) -> str:
    if row["target"] is None:
        return ""
    if row["met"] is None:
        return f"target ≤ {row['target']:g}×: no ratio"
    return f"target ≤ {row['target']:g}×: {'met' if row['met'] else 'OVER'}"


def lines(
    loops: int, vs: dict[str, dict[str, Any]], cpu: dict[str, Any], lag: dict[str, Any] | None = None
) -> list[str]:
    """The comparison of one level, a line a figure, the host's event-loop lag under the storm
    (``lag``: the level's ``host_loop_lag_ms``), then the CPU per turn."""
    out = [f"{loops:>5} loops, this server / the reference under the same crowd:"]
    for key, _, _, _ in FIGURES:
        row = vs[key]
        ratio_text = "n/a" if row["ratio"] is None else f"{row['ratio']}×"
        out.append(
            f"         {label(loops, key)}: {row['server']} / {row['reference']} = {ratio_text}"
            + (f"  ({verdict(row)})" if row["target"] is not None else "")
        )
    storm = (lag or {}).get("storm")
    out.append(
        "         the session host's event-loop lag under the storm (its loop_lag timing): "
        + (f"p99 {storm['p99']} ms, max {storm['max']} ms" if storm else "not reported by this server")
    )
    s = cpu["server"]
    if s:
        out.append(
            "         CPU ms/turn: gateway {g} + session host {h} = API {a}, inference {i}, Ray {r} "
            "(its background {b}); the reference {ref} (API / reference = {q})".format(
                g=s.get("gateway"),
                h=s.get("session_host"),
                a=s.get("api_tier"),
                i=s.get("inference"),
                r=s.get("ray"),
                b=s.get("ray_background"),
                ref=cpu["reference"],
                q="n/a" if cpu["api_tier_ratio"] is None else f"{cpu['api_tier_ratio']}×",
            )
        )
    else:
        out.append(
            f"         CPU ms/turn: the reference {cpu['reference']} (this server's processes not seen)"
        )
    return out


def print_level(s: dict[str, Any]) -> None:
    f, st, cpu = s["first_turns_ms"], s["steady_ms"], s.get("cpu_ms_per_turn")
    print(
        f"{s['loops']:>5} loops: {s['turns_per_s']} turns/s; steady non-model p50 {st['p50']} / p99 {st['p99']} ms "
        f"({st['turns']} turns); first turns released at once p50 {f['p50']} / p99 {f['p99']} ms "
        f"({f['completed']}/{s['loops']} in {f['storm_s']} s); served {s['loops_served']}/{s['loops']}"
        f"{'' if s['every_loop_served'] else ' — NOT every loop served'}"
        + (
            f"; CPU/turn gateway {cpu['gateway']} + host {cpu['session_host']} = API {cpu['api_tier']}, "
            f"inference {cpu['inference']}, Ray {cpu['ray']} (background {cpu['ray_background']}) ms"
            if cpu
            else ""
        ),
        flush=True,
    )
    t, lg = s.get("steady_tail") or {}, s["client_loop_lag_ms"]
    if t:
        print(
            f"       steady tail (≥ {t['from_ms']} ms, {t['turns']} turns), medians ms: "
            + ", ".join(f"{k} {t[k]}" for k in (*TAIL_PHASES, "outside"))
            + f"; waiting for a CPU, ms/turn: {s.get('runqueue_wait_ms_per_turn')}",
            flush=True,
        )
    hl = s.get("host_loop_lag_ms") or {}
    if hl.get("storm") or hl.get("steady"):
        print(
            "       the session host's event-loop lag (its loop_lag timing), ms: "
            + "; ".join(
                f"{name} p50 {v['p50']} / p99 {v['p99']} / max {v['max']}"
                for name, v in (("storm", hl.get("storm")), ("steady", hl.get("steady")))
                if v
            ),
            flush=True,
        )
    print(
        f"       clients: {s['client_processes']} process(es), {s['client_cpu_pct_of_a_core']}% of a core "
        f"({s['client_turns_per_cpu_s']} turns per CPU-second), "
        f"loop lag p99 {lg['p99']} / max {lg['max']} ms"
        + (
            f" (the reference server: {s['reference_cpu_pct_of_a_core']}% of a core)"
            if "reference_cpu_pct_of_a_core" in s
            else ""
        )
        + ": "
        + ("valid" if s["valid"] else f"INVALID, the clients were saturated ({s['invalid_reason']})"),
        flush=True,
    )
