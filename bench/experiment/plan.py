"""The sweep of a scaling experiment as a list of steps, in the order they run (pure).

A step is one load level on one count of session nodes with one transport.  The repeats
interleave: each repeat runs every step once, so a drift of the cluster over the run (a
neighbour's load, a cache warming) spreads over all steps instead of landing on the last
ones.  Within a repeat the count of session nodes changes as seldom as it can (a change is
a redeploy of the gateway): the counts go up in even repeats and down in odd ones, so the
count a repeat ends with is the one the next starts with.  The transports interleave inside
each load level: the steps they are compared on run back to back, on the same deployment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sweep:
    session_nodes: tuple[int, ...]  # counts of session nodes in service, rising
    loops_per_node: tuple[int, ...]  # load levels: concurrent loops per session node in service
    transports: tuple[str, ...]
    repeats: int
    duration_s: float
    warmup_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "session_nodes": list(self.session_nodes),
            "loops_per_node": list(self.loops_per_node),
            "transports": list(self.transports),
            "repeats": self.repeats,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
        }


@dataclass(frozen=True, slots=True)
class PlannedStep:
    index: int
    repeat: int
    transport: str
    session_nodes: int
    loops_per_node: int

    @property
    def loops(self) -> int:
        return self.session_nodes * self.loops_per_node


def parse_counts(text: str, name: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``: positive, distinct, given rising; ValueError naming ``name``."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name}: a comma-separated list of whole numbers, not {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"{name}: at least one count, each 1 or more (got {text!r})")
    if list(counts) != sorted(set(counts)):
        raise ValueError(f"{name}: distinct counts, rising (got {text!r})")
    return counts


def steps(sweep: Sweep) -> list[PlannedStep]:
    """Every step of ``sweep`` in the order it runs."""
    out: list[PlannedStep] = []
    for repeat in range(sweep.repeats):
        counts = sweep.session_nodes if repeat % 2 == 0 else tuple(reversed(sweep.session_nodes))
        for k in counts:
            for loops in sweep.loops_per_node:
                for transport in sweep.transports:
                    out.append(PlannedStep(len(out), repeat, transport, k, loops))
    return out


def redeploys(planned: list[PlannedStep], in_service: int) -> int:
    """How many times the count of session nodes changes over ``planned``, starting from
    ``in_service``."""
    changes, current = 0, in_service
    for step in planned:
        if step.session_nodes != current:
            changes, current = changes + 1, step.session_nodes
    return changes
