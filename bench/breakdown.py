"""Where an agent loop's time goes: each turn split into tool, prefill, decode and API
overhead; rollouts compared transport against transport; the compact text and the
stacked-bar chart of ``responses-ws demo``, and the numbers the sweeps plot.

A turn's parts (milliseconds):

- ``tool``: the client's tool run after the turn (simulated time);
- ``prefill``: the server-reported queue + prefill (``metadata["responses_ws.timings"]``);
- ``decode``: the server-reported decode (reasoning included);
- ``api``: everything else the client waited for: the turn's time from sending the request
  to its terminal event minus queue + prefill + decode — the server's API work, the Ray
  hops, the network, the client's own parsing.

The *floor* of a rollout is its tool time plus its model time (queue + prefill + decode):
what it would take if the API cost nothing.  A rollout's ``api`` part is everything else
(``e2e − floor``: the turns' API overhead, connecting, the client between turns), so the
parts of a rollout add up to its end-to-end time.  Rollout *r* is the same conversation on
every transport, so transports are compared on the totals of the same rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import plotting
from .rollouts import RolloutRecord, TurnRecord
from .stats import pct

PARTS = ("tool", "prefill", "decode", "api")
COLOURS = {"tool": "#b0b0b0", "prefill": "#4c72b0", "decode": "#55a868", "api": "#c44e52"}
LABELS = {"tool": "tool", "prefill": "queue + prefill", "decode": "decode", "api": "API overhead"}


@dataclass(frozen=True)
class Split:
    """One turn's or one rollout's time by part (ms); ``context`` = the turn's input tokens."""

    tool: float
    prefill: float
    decode: float
    api: float
    context: int = 0

    @property
    def floor(self) -> float:
        return self.tool + self.prefill + self.decode

    @property
    def total(self) -> float:
        return self.floor + self.api


def turn_split(t: TurnRecord) -> Split | None:
    """``None`` when the turn failed or the server reported no timings for it."""
    if t.error or not t.server:
        return None
    prefill = t.server.get("queue", 0.0) + t.server.get("prefill", 0.0)
    decode = t.server.get("decode", 0.0)
    return Split(t.tool_ms, prefill, decode, max(0.0, t.total_ms - prefill - decode), t.input_tokens)


def rollout_split(r: RolloutRecord) -> Split | None:
    """The rollout's parts, adding up to its end-to-end time; ``None`` unless every turn
    has its timings."""
    split = [turn_split(t) for t in r.turns]
    turns = [s for s in split if s is not None]
    if r.error or not turns or len(turns) < len(split):
        return None
    tool = sum(s.tool for s in turns)
    prefill = sum(s.prefill for s in turns)
    decode = sum(s.decode for s in turns)
    return Split(
        tool,
        prefill,
        decode,
        max(0.0, r.e2e_s * 1000 - tool - prefill - decode),
        max(s.context for s in turns),
    )


def paired(records: Sequence[RolloutRecord], transports: Sequence[str]) -> dict[str, list[Split]]:
    """Per transport, the splits of the rollouts every transport completed (same order).
    A transport without per-turn timings (``append``) is left out."""
    by = {(r.transport, r.rollout): rollout_split(r) for r in records}
    transports = [t for t in transports if any(by.get((t, r.rollout)) for r in records)]
    common = sorted(
        i for i in {r.rollout for r in records} if all(by.get((t, i)) is not None for t in transports)
    )
    return {t: [s for i in common if (s := by[(t, i)]) is not None] for t in transports}


def compare(records: Sequence[RolloutRecord], transports: Sequence[str]) -> dict[str, Any]:
    """Totals over the rollouts every transport completed, per transport: the parts, the
    share of API overhead in e2e, how far above the floor; and each transport's gain over
    the first (``1 − first's total / its total``), end to end and without tool time."""
    splits = paired(records, transports)
    out: dict[str, Any] = {"rollouts": len(next(iter(splits.values()), [])), "transports": {}}
    for name, ss in splits.items():
        tot = {p: sum(getattr(s, p) for s in ss) for p in PARTS}
        e2e = sum(tot.values())
        floor = tot["tool"] + tot["prefill"] + tot["decode"]
        turns = [x for r in records if r.transport == name for t in r.turns if (x := turn_split(t))]
        out["transports"][name] = {
            "total_ms": tot,
            "e2e_s": e2e / 1000,
            "e2e_minus_tools_s": (e2e - tot["tool"]) / 1000,
            "api_share": tot["api"] / e2e if e2e else None,
            "above_floor": tot["api"] / floor if floor else None,
            "e2e_s_per_rollout": [s.total / 1000 for s in ss],
            "turn_median_ms": {p: pct([getattr(s, p) for s in turns], 0.5) for p in PARTS},
            "turns": len(turns),
            "context_tokens_median": pct([s.context for s in turns], 0.5),
        }
    first = transports[0]
    base = out["transports"].get(first)
    for name, s in out["transports"].items():
        if name != first and base and s["e2e_s"]:
            s["gain_of_" + first] = {
                "e2e": 1 - base["e2e_s"] / s["e2e_s"],
                "without_tools": 1 - base["e2e_minus_tools_s"] / s["e2e_minus_tools_s"],
            }
    return out


def turn_rows(
    records: Sequence[RolloutRecord], rollout: int, transports: Sequence[str]
) -> list[dict[str, Any]]:
    """Rollout ``rollout`` turn by turn: the turn's parts per transport."""
    by = {r.transport: r for r in records if r.rollout == rollout}
    rows = []
    for i in range(max((len(by[t].turns) for t in transports if t in by), default=0)):
        row: dict[str, Any] = {"turn": i + 1}
        for t in transports:
            turns = by[t].turns if t in by else []
            s = turn_split(turns[i]) if i < len(turns) else None
            row[t] = None if s is None else s.__dict__
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ text


def _ms(x: float | None, width: int) -> str:
    return f"{'–' if x is None else f'{x:.0f}' if x >= 10 else f'{x:.1f}':>{width}}"


def _k(tokens: float | None) -> str:
    return "–" if tokens is None else f"{tokens / 1000:.1f}k"


def render_summary(cmp: dict[str, Any]) -> list[str]:
    """The per-turn medians and the per-rollout comparison, at most 80 columns."""
    names = list(cmp["transports"])
    lines = [
        "where a turn's time goes, median per turn (ms):",
        f"  {'transport':<11}{'turns':>6}{'tool':>7}{'prefill':>9}{'decode':>8}{'API overhead':>14}"
        f"{'context':>9}",
    ]
    for n in names:
        s = cmp["transports"][n]
        m = s["turn_median_ms"]
        lines.append(
            f"  {n:<11}{s['turns']:>6}{_ms(m['tool'], 7)}{_ms(m['prefill'], 9)}{_ms(m['decode'], 8)}"
            f"{_ms(m['api'], 14)}{_k(s['context_tokens_median']):>9}"
        )
    first = names[0]
    lines.append("")
    lines.append(f"the same {cmp['rollouts']} rollouts on each transport, summed:")
    lines.append(
        f"  {'transport':<11}{'end to end':>11}{'w/o tools':>11}{'API overhead':>14}{'above floor':>13}"
    )
    for n in names:
        s = cmp["transports"][n]
        lines.append(
            f"  {n:<11}{s['e2e_s']:>9.2f} s{s['e2e_minus_tools_s']:>9.2f} s"
            f"{s['api_share']:>14.1%}{s['above_floor']:>13.1%}"
        )
    for n in names[1:]:
        g = cmp["transports"][n].get("gain_of_" + first)
        if g:
            lines.append(
                f"  → {first} faster than {n} by {g['e2e']:.1%} end to end, "
                f"{g['without_tools']:.1%} without tool time"
            )
    return lines


def render_turns(rows: list[dict[str, Any]], transports: Sequence[str], rollout: int) -> list[str]:
    """One rollout turn by turn: ``turn context tool | prefill decode API`` per transport."""
    head = f"{'turn':>4}{'context':>9}{'tool':>6}"
    sub = " " * len(head)
    for t in transports:
        head += f"  │ {t:<20}"
        sub += f"  │ {'prefill':>7}{'decode':>7}{'API':>6}"
    lines = [f"rollout {rollout} turn by turn (ms):", head, sub]
    for row in rows:
        first = next((row[t] for t in transports if row[t]), None)
        line = f"{row['turn']:>4}{_k(first and first['context']):>9}{_ms(first and first['tool'], 6)}"
        for t in transports:
            s = row[t]
            line += "  │ " + (
                f"{_ms(s['prefill'], 7)}{_ms(s['decode'], 7)}{_ms(s['api'], 6)}" if s else f"{'–':>20}"
            )
        lines.append(line)
    return lines


# ----------------------------------------------------------------------------- chart


def plot(path: Path, cmp: dict[str, Any], rows: list[dict[str, Any]], rollout: int, title: str) -> Path:
    """Stacked bars: rollout ``rollout`` turn by turn (one bar per transport per turn) and
    the per-rollout totals of every transport."""
    plt = plotting.pyplot()
    names = list(cmp["transports"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [row["turn"] + (j - (len(names) - 1) / 2) * width for row in rows]
        bottom = [0.0] * len(rows)
        for part in PARTS:
            vals = [(row[name] or {}).get(part, 0.0) for row in rows]
            ax1.bar(
                xs,
                vals,
                width * 0.95,
                bottom=bottom,
                color=COLOURS[part],
                label=LABELS[part] if j == 0 else None,
                edgecolor="white",
                linewidth=0.3,
            )
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax1.set_xlabel(f"turn of rollout {rollout} (bars: {', '.join(names)} left to right)")
    ax1.set_ylabel("ms")
    ax1.legend(loc="upper left", fontsize=8)
    ax1.grid(alpha=0.3, axis="y")
    bottom = [0.0] * len(names)
    for part in PARTS:
        vals = [cmp["transports"][n]["total_ms"][part] / 1000 for n in names]
        ax2.bar(names, vals, bottom=bottom, color=COLOURS[part], edgecolor="white", linewidth=0.3)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, _n in enumerate(names):
        ax2.text(i, bottom[i], f"{bottom[i]:.1f} s", ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel(f"s, {cmp['rollouts']} rollouts summed")
    ax2.grid(alpha=0.3, axis="y")
    return plotting.save(fig, path, title)
