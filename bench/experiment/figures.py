"""One step's figures from what was measured during it (pure): the load runner's per-turn
records, each node's CPU by role over the measured window, the accelerators' batches and
prefix cache, and the store's counters.

CPU per turn divides a node's CPU over the window by the turns that node served (a session
node) or by all the step's turns (an accelerator node, which serves every session node).
The non-model time of a turn is what the client waited for beyond the model's own time
(``total_ms - model_ms``): the API's cost, what the deployment adds to the model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Protocol

from ..stats import pct

SESSION_ROLES = ("gateway", "session_host", "ray")  # a session node's CPU, by role


class Turn(Protocol):
    """What the figures read of the runner's ``TurnRecord``."""

    @property
    def loop(self) -> int: ...
    @property
    def target(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def total_ms(self) -> float | None: ...
    @property
    def model_ms(self) -> float | None: ...
    @property
    def ttft_ms(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class SessionNode:
    node_id: str
    node_ip: str
    url: str  # the base URL the load runner was given for it


@dataclass(frozen=True, slots=True)
class Accelerator:
    node_id: str
    node_ip: str
    replica_cpu_ms: float  # the inference replicas' CPU on the node over the window
    running_seqs: float | None  # mean sequences in its replicas' batches, per replica (metrics)


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": _round(pct(values, 0.5)), "p99": _round(pct(values, 0.99))}


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def nonmodel_ms(turn: Turn) -> float | None:
    if turn.total_ms is None or turn.model_ms is None:
        return None
    return max(0.0, turn.total_ms - turn.model_ms)


def failures(turns: Iterable[Turn]) -> dict[str, int]:
    """Failed turns by error code (``unknown`` when the runner had none)."""
    return dict(Counter(t.error_code or "unknown" for t in turns if not t.ok))


def per_node(
    turns: Sequence[Turn],
    nodes: Sequence[SessionNode],
    cpu_ms: Mapping[str, Mapping[str, float]],
    counted: Mapping[str, tuple[float | None, float | None]] | None = None,
) -> list[dict[str, Any]]:
    """Each session node in service: the turns it served, its share of the connections and
    its CPU per turn by role.  By default from the records' targets (the turns answered
    through the node's address, the loops sent to it over all loops); with ``counted``
    (node id → turns it answered, its mean open sockets: its own Ray metrics) from the
    server's side, when the records cannot tell the nodes apart (a balancer in front, or
    nodes sharing one address)."""
    served = Counter(t.target for t in turns if t.ok)
    loops_at: dict[str, set[int]] = {}
    for t in turns:
        loops_at.setdefault(t.target, set()).add(t.loop)
    all_loops = sum(len(v) for v in loops_at.values())
    all_sockets = sum(c[1] or 0.0 for c in counted.values()) if counted else 0.0
    out = []
    for n in nodes:
        here: float | None
        sockets: float | None
        share: float | None
        if counted is None:
            here = served.get(n.url, 0)
            share = len(loops_at.get(n.url, ())) / all_loops if all_loops else 0.0
        else:
            here, sockets = counted.get(n.node_id, (None, None))
            share = (sockets or 0.0) / all_sockets if all_sockets else None
        known = bool(here) and n.node_id in cpu_ms
        cpu = cpu_ms.get(n.node_id, {})
        by_role = {
            role: _round(cpu.get(role, 0.0) / here) if known and here else None for role in SESSION_ROLES
        }
        total = sum(v for v in by_role.values() if v is not None) if known else None
        out.append(
            {
                "node_id": n.node_id,
                "node_ip": n.node_ip,
                "url": n.url,
                "turns": None if here is None else round(here),
                "connections_share": _round(share),
                "cpu_ms_per_turn": {**by_role, "total": _round(total)},
            }
        )
    return out


def accelerators(accs: Sequence[Accelerator], turns: int) -> list[dict[str, Any]]:
    return [
        {
            "node_id": a.node_id,
            "node_ip": a.node_ip,
            "replica_cpu_ms_per_turn": _round(a.replica_cpu_ms / turns) if turns else None,
            "batch_occupancy": _round(a.running_seqs),
        }
        for a in accs
    ]


def hit_rate(hit_blocks: float | None, miss_blocks: float | None) -> float | None:
    """Prefix-cache blocks reused over blocks looked up in the window (None: none counted)."""
    if hit_blocks is None or miss_blocks is None or hit_blocks + miss_blocks <= 0:
        return None
    return round(hit_blocks / (hit_blocks + miss_blocks), 4)


def store_per_turn(store: tuple[float, float, float] | None, turns: int) -> dict[str, float | None]:
    """The store's commands, bytes in and own CPU (µs) a turn, from their window totals."""
    if not turns or store is None:
        return {"commands_per_turn": None, "bytes_per_turn": None, "cpu_us_per_turn": None}
    commands, bytes_in, cpu_s = store
    return {
        "commands_per_turn": round(commands / turns, 3),
        "bytes_per_turn": round(bytes_in / turns, 1),
        "cpu_us_per_turn": round(cpu_s * 1e6 / turns, 1),
    }


def as_dict(obj: Any) -> dict[str, Any]:
    """A runner's ``ClientStats`` (a dataclass) as a plain dict."""
    return asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else dict(obj)


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything measured during one step."""

    turns: Sequence[Turn]
    duration_s: float
    clients: Sequence[Any]
    saturated: bool
    saturated_reason: str | None
    nodes: Sequence[SessionNode]
    cpu_ms: Mapping[str, Mapping[str, float]]  # node id → role → CPU ms over the window
    accelerators: Sequence[Accelerator]
    prefix_blocks: tuple[float, float] | None  # (hit, miss) over the window
    store: tuple[float, float, float] | None  # (commands, bytes in, Redis CPU s) over the window
    shared_ms_per_s: Mapping[str, float]  # the head's single-threaded parts: busiest thread CPU ms/s
    counted: Mapping[str, tuple[float | None, float | None]] | None = None  # see per_node
    connect_failures: Mapping[str, int] = field(default_factory=dict)  # failed opens by type, retried or not
    unconnected: int = 0  # loops whose connection did not open after its retries


def step_figures(head: Mapping[str, Any], m: Measured) -> dict[str, Any]:
    """The step as ``scaling.json`` records it; ``head`` holds its plan (index, repeat,
    transport, session_nodes, loops_per_node, loops)."""
    ok = [t for t in m.turns if t.ok]
    nonmodel = [v for t in ok if (v := nonmodel_ms(t)) is not None]
    ttft = [t.ttft_ms for t in ok if t.ttft_ms is not None]
    invalid = None
    if m.saturated:
        invalid = f"client saturated: {m.saturated_reason or 'lag or CPU over the limit'}"
    elif m.unconnected:
        invalid = f"{m.unconnected} loop{'s' if m.unconnected != 1 else ''} could not connect"
    elif not ok:
        invalid = "no turn completed"
    return {
        **head,
        "valid": invalid is None,
        "invalid_reason": invalid,
        "turns": len(ok),
        "turns_per_s": round(len(ok) / m.duration_s, 3) if m.duration_s > 0 else 0.0,
        "nonmodel_ms": quantiles(nonmodel),
        "ttft_ms": quantiles(ttft),
        "failures": {**failures(m.turns), **m.connect_failures},
        "clients": [as_dict(c) for c in m.clients],
        "nodes": per_node(m.turns, m.nodes, m.cpu_ms, m.counted),
        "turns_counted_by": "client" if m.counted is None else "server",
        "accelerators": accelerators(m.accelerators, len(ok)),
        "prefix_cache_hit_rate": hit_rate(*m.prefix_blocks) if m.prefix_blocks else None,
        "store": store_per_turn(m.store, len(ok)),
        "shared_cpu_ms_per_s": {k: round(v, 3) for k, v in m.shared_ms_per_s.items()},
    }
