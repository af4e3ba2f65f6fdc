"""``bench floor``'s budgets: each role's CPU per turn (and the idle server's CPU a second)
against its limit, judged on the median over rounds, with the rounds' spread."""

from __future__ import annotations

from typing import Any

from .stats import spread

ROUND_FIGURES = ("median", "p25", "p75", "min", "max", "n")


def rounds_spread(xs: list[float | None]) -> dict[str, float | int | None] | None:
    """The rounds' median, p25, p75, min and max (rounded to µs) and how many, or ``None``
    when no round measured it."""
    return spread(xs, ROUND_FIGURES) if any(x is not None for x in xs) else None


# The budgets (issue 43), per plain Codex-like turn, medians over rounds: (role, what it is, limit).
BUDGETS = (
    ("all server processes", "CPU ms per turn", 6.0),
    ("API tier (gateway + host) / reference, interleaved", "x", 1.5),
    ("API tier (gateway + host) / reference, in a block", "x", 1.5),
    ("emulator replica", "CPU ms per turn", 1.5),
    ("idle server, every process", "CPU ms per s", 60.0),
)


def budgets(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Each budget against its measured spread over the rounds (the idle one: its one window)."""
    cpu = s.get("cpu_ms_per_turn", {})
    idle_total = sum(s.get("background_cpu_ms_per_s", {}).values()) or None
    measured: list[dict[str, Any] | None] = [
        cpu.get("all"),
        s.get("api_tier_cpu_ratio"),
        s.get("api_tier_cpu_ratio_block"),
        cpu.get("inference"),
        None if idle_total is None else rounds_spread([idle_total]),
    ]
    rows = []
    for (role, unit, limit), m in zip(BUDGETS, measured):
        rows.append(
            {
                "role": role,
                "unit": unit,
                "budget": limit,
                "measured": m,
                "met": None if not m else m["median"] <= limit,
            }
        )
    return rows


def print_budgets(rows: list[dict[str, Any]]) -> None:
    print("  budgets (median over rounds; range = min-max of the rounds):")
    for r in rows:
        m = r["measured"]
        got = "n/a" if not m else f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})"
        verdict = {True: "met", False: "NOT met", None: ""}[r["met"]]
        print(f"    {r['role']:<52} <= {r['budget']:>5} {r['unit']:<16} {got:<22} {verdict}")
