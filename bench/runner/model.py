"""The load runner's data: what to run (:class:`LoadSpec`), every turn (:class:`TurnRecord`),
each client process measured by itself (:class:`ClientStats`) and the whole
(:class:`LoadResult`), with the saturation decision and the summary.  Pure: no network.

A client is **saturated** when its event loop was late by more than
:data:`LAG_P99_LIMIT_MS` at the 99th percentile of its 10 ms ticks, or it used more than
:data:`CPU_LIMIT` of one core, over the measured window: its turn times then include its
own queueing, and a step with a saturated client is invalid (never the server's latency).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ..stats import pct
from .connecting import ATTEMPTS
from .workloads import Chains, Resume, Rollouts

if TYPE_CHECKING:
    from ..invariants import RunCheck
    from ..workload import Workload

LAG_P99_LIMIT_MS = 20.0  # a client's event-loop lag p99 above this: saturated
CPU_LIMIT = 0.8  # a client process's CPU time over wall time above this: saturated
TRANSPORTS = ("ws", "http-full", "http-chained")
WORKLOADS = ("capacity", "codex", "chains", "resume", "rollouts")
# the workloads whose loops open their connections after the release, each its own
OPEN_AT_RELEASE = ("chains", "resume", "rollouts")
KINDS = ("first", "steady", "rollout_first")
BUSY_NODE_WAIT = 0.1  # a saturated client that waited this share of the time for a core: said so


@dataclass(frozen=True)
class LoadSpec:
    """What the runner runs.  Loop ``i`` goes to ``targets[i % len(targets)]``.

    ``workload``: ``capacity``, the Codex-like capacity loop (one connection per loop for the
    whole run, rollouts one after another on it, each rollout's first create resending the
    resumed history); ``codex``: the same preset as an agent session (a new connection per
    rollout).  ``preset`` and ``resume_tokens`` pick the :mod:`bench.workload` preset;
    ``custom_workload``, a :class:`~bench.workload.Workload` of its own, replaces them.

    The measured window is ``duration_s`` after ``warmup_s`` from the release of the first
    turns (every loop's first turn is sent at the same moment); with
    ``window_after_first_turns`` it starts when every loop's first turn is answered instead
    (a reconnect storm, then steady state).  ``ramp_s`` spreads the first turns over that long
    (loop ``i`` at ``i / loops`` of it) instead.

    ``check_events`` (``ws`` only): every event of every answer is parsed and checked by
    bench/invariants.py (the soak's stream invariants; the result's ``check``), not only the
    final one: a heavier client, for correctness under load rather than the client's capacity.
    ``rollouts_per_loop``: each loop stops after that many rollouts (0: it only connects), and
    the run ends when every loop has (at the latest at the window's end).

    ``arrivals``: each loop opens its connection at its release (all at once, or spread over
    ``ramp_s``: connections arriving at ``loops / ramp_s`` a second), timed, rather than all
    before the release; the result's ``connects``.  ``hold``: a loop that stopped before the
    run's end keeps its connection open until the run ends (False: it closes it at once).
    ``open_timeout_s`` bounds one open; ``connect_attempts`` (1: none retried) bounds its
    retries (bench/runner/connecting.py).

    ``continues`` (the ``capacity`` or ``codex`` workload, not over ``http-full``): loop ``i``'s
    first create continues the stored response ``continues[i]`` (``previous_response_id``),
    sending its task alone instead of a resumed history (the stored conversation holds it; its
    tool results count in the emulator's ``tool_rounds``: a workload of ``tool_rounds=0``
    answers at once).

    ``rollouts`` shapes the ``rollouts`` workload (the agentloop kind's, over several transports:
    ``transport`` unused); the run ends when every rollout ran.

    ``chains`` shapes the ``chains`` workload, ``resume`` the ``resume`` workload (with
    ``rollouts_per_loop=1`` the run ends when every loop has resumed its session).  ``locate`` (``ws`` only): where each
    connection went, a callable returning local port → the server serving it for the
    connections it knows (the balancer's runtime API, bench/multinode/balancer.py); it runs in
    the client processes (picklable, blocking: called in a thread), each connection looked up
    once it opened (its :class:`ConnectionRecord`'s ``server``)."""

    targets: tuple[str, ...]
    loops: int
    transport: str = "ws"
    workload: str = "capacity"
    duration_s: float = 20.0
    warmup_s: float = 5.0
    seed: int = 0
    api_key: str | None = None
    store: bool = False
    preset: str = "codex"
    resume_tokens: int | None = None
    window_after_first_turns: bool = False
    custom_workload: Workload | None = None
    ramp_s: float = 0.0
    check_events: bool = False
    rollouts_per_loop: int | None = None
    arrivals: bool = False
    hold: bool = True
    open_timeout_s: float = 60.0
    connect_attempts: int = ATTEMPTS
    chains: Chains = field(default_factory=Chains)
    locate: Callable[[], dict[int, str]] | None = None
    resume: Resume = field(default_factory=Resume)
    continues: tuple[str, ...] = ()
    rollouts: Rollouts = field(default_factory=Rollouts)

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("LoadSpec needs at least one target URL")
        if self.loops < 1:
            raise ValueError(f"LoadSpec.loops must be at least 1, not {self.loops}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {self.transport!r}; one of {', '.join(TRANSPORTS)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; one of {', '.join(WORKLOADS)}")
        if self.rollouts_per_loop is not None and self.rollouts_per_loop < 0:
            raise ValueError(f"LoadSpec.rollouts_per_loop must be at least 0, not {self.rollouts_per_loop}")
        if self.connect_attempts < 1:
            raise ValueError(f"LoadSpec.connect_attempts must be at least 1, not {self.connect_attempts}")
        if self.check_events and self.transport != "ws":
            raise ValueError("LoadSpec.check_events checks WebSocket event streams: transport 'ws' only")
        if self.locate is not None and self.transport != "ws":
            raise ValueError("LoadSpec.locate finds WebSocket connections: transport 'ws' only")
        if self.workload == "chains" and self.transport not in ("ws", "http-full"):
            raise ValueError("LoadSpec's chains workload runs on transport 'ws' or 'http-full'")
        if self.workload in ("chains", "resume") and (self.check_events or self.arrivals):
            raise ValueError("LoadSpec.check_events and arrivals run the capacity or codex loop")
        if self.continues and (
            len(self.continues) != self.loops
            or self.workload not in ("capacity", "codex")
            or self.transport == "http-full"
        ):
            raise ValueError(
                "LoadSpec.continues names one stored response a loop, for the capacity or codex "
                "workload, not over http-full (it resends the conversation)"
            )
        if self.workload == "rollouts" and (self.check_events or self.arrivals or self.continues):
            raise ValueError(
                "LoadSpec's rollouts workload runs its own jobs: no check_events, arrivals, continues"
            )
        if self.workload == "resume" and self.transport != "ws":
            raise ValueError("LoadSpec's resume workload resumes WebSocket sessions: transport 'ws' only")

    def target(self, loop: int) -> str:
        return self.targets[loop % len(self.targets)]

    @property
    def until_done(self) -> bool:
        """The run ends once every loop is done (at the latest at the window's end)."""
        return self.rollouts_per_loop is not None or self.workload == "rollouts"


@dataclass
class TurnRecord:
    loop: int
    kind: str  # "first" (released at once), "steady" (chained) or "rollout_first"
    sent: float  # time.time() when sent
    total_ms: float  # sent -> the terminal event
    model_ms: float | None  # the server's queue + prefill + decode
    ok: bool
    server: dict[str, float] | None = None  # the server's phase timings (ms), as reported
    target: str = ""
    ttft_ms: float | None = None  # sent -> the first output delta
    error_code: str | None = None  # the error's code, or the terminal status when not completed
    connect_ms: float | None = None  # when this turn opened its connection (codex workload)
    output_tokens: int | None = None
    connection: int | None = None  # ws: the loop's connection it went on (ConnectionRecord.index)
    cached_tokens: int | None = None  # the usage's ``input_tokens_details.cached_tokens``
    # ws chains: the response this create started (from ``response.created``, else the terminal
    # event), its ``store`` flag, the terminal event's type (None: none came) and its usage's
    # ``input_tokens`` (None: it carried no usage); ``resent``: a create sent again after its
    # connection ended without ``response.created`` (Chains.continue_stored)
    response_id: str | None = None
    store: bool | None = None
    terminal: str | None = None
    input_tokens: int | None = None
    resent: bool = False
    final_gap_ms: float | None = None  # ws chains: from the event before the terminal one to it
    first_event_ms: float | None = None  # the resume workload: sent -> the answer's first event
    note: str | None = None  # the resume workload: Resume.inspect's answer for this turn's response
    # the rollouts workload (bench/runner/agent.py): its transport, rollout, number in it (from 1), bytes
    # sent, cache writes by ttl, calls answered, the tool's measured time after it; ``rollout_s`` (the last
    # turn's): open to end.  Append mode's last turn holds its one response's usage and ``server`` timings.
    transport: str | None = None
    rollout: int | None = None
    turn: int | None = None
    request_bytes: int = 0
    write_30m_tokens: int = 0
    write_12h_tokens: int = 0
    calls: int = 0
    tool_ms: float = 0.0
    rollout_s: float | None = None

    @property
    def done(self) -> float:
        return self.sent + self.total_ms / 1000

    @property
    def nonmodel_ms(self) -> float | None:
        return None if self.model_ms is None else self.total_ms - self.model_ms

    @property
    def usage(self) -> tuple[int, int, int] | None:
        """(input, cached, output) tokens as the terminal event's usage reported them (None:
        it carried none), as the usage ledger's line holds them (bench/reconcile.py)."""
        if self.input_tokens is None:
            return None
        return self.input_tokens, self.cached_tokens or 0, self.output_tokens or 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConnectionRecord:
    """One WebSocket connection of a loop, from its open to its end (bench/runner/channels.py)."""

    loop: int
    index: int  # the loop's connections in order, from 0 (TurnRecord.connection)
    opened: float  # time.time() when it opened
    local_port: int
    server: str | None = None  # where it went, from the spec's ``locate`` (None: not known)
    closed: float | None = None  # time.time() when it ended (None: open at the end of the run)
    close_code: int | None = None  # the server's (1006: no close frame); None: open, or the client closed it
    creates: int = 0  # ``response.create`` sent
    created: int = 0  # ``response.created`` received
    terminals: int = 0  # terminal events received
    completed: int = 0  # ``response.completed`` received
    shutting_down: int = 0  # creates answered with the error ``server_shutting_down``
    in_flight: bool = False  # a create sent and its final event not received (at the end: cut)
    stopped: bool = False  # the run ended before the loop was done with it
    left_open: bool = False  # told server_shutting_down, not closed by the server in Chains.close_wait_s
    target: str = ""  # the URL it was opened at (a resume step's may be a node's own, not the spec's)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def open_at(self, t: float) -> bool:
        return self.opened <= t and (self.closed is None or self.closed >= t)


@dataclass
class ClientStats:
    """One load actor or client process, over the measured window, measured by itself."""

    node_id: str | None
    node_ip: str | None
    pid: int
    cpu_s: float
    wall_s: float
    cpu_fraction: float  # of one core
    lag_p99_ms: float
    lag_max_ms: float
    saturated: bool
    reason: str | None
    loops: int = 0
    connected: int = 0
    # the share of the window its event loop's thread was runnable but waiting for a core
    # (/proc/thread-self/schedstat): lag with a large wait is the node's other work, not the load
    runqueue_wait_fraction: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def saturation(cpu_fraction: float, lag_p99_ms: float | None) -> str | None:
    """Why a client with these figures is saturated, or ``None`` when it is not."""
    reasons = []
    if lag_p99_ms is not None and lag_p99_ms > LAG_P99_LIMIT_MS:
        reasons.append(f"event-loop lag p99 {lag_p99_ms:.1f} ms > {LAG_P99_LIMIT_MS:g} ms")
    if cpu_fraction > CPU_LIMIT:
        reasons.append(f"CPU {100 * cpu_fraction:.0f} % of a core > {100 * CPU_LIMIT:.0f} %")
    return "; ".join(reasons) or None


def window_delta(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> tuple[float, float]:
    """How much a counter grew, and over how long, between its first sample at or after
    ``t0`` and its last at or before ``t1`` (samples: (time, the counter so far))."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return 0.0, 0.0
    (a, ca), (b, cb) = inside[0], inside[-1]
    return cb - ca, b - a


def window_usage(
    cpu: Sequence[tuple[float, float]], ticks: Sequence[tuple[float, float]], t0: float, t1: float
) -> tuple[float, float, float | None, float | None]:
    """CPU seconds and wall seconds in ``[t0, t1]`` (samples: (time, process CPU seconds so
    far)), and the lag p99 and max (ms) of the ticks (time, lateness ms) in it."""
    cpu_s, wall_s = window_delta(cpu, t0, t1)
    late = [ms for t, ms in ticks if t0 <= t <= t1]
    return cpu_s, wall_s, pct(late, 0.99), max(late, default=None)


def client_stats(
    node_id: str | None,
    node_ip: str | None,
    pid: int,
    cpu: Sequence[tuple[float, float]],
    ticks: Sequence[tuple[float, float]],
    window: tuple[float, float],
    *,
    loops: int = 0,
    connected: int = 0,
    waits: Sequence[tuple[float, float]] = (),
) -> ClientStats:
    cpu_s, wall_s, p99, worst = window_usage(cpu, ticks, *window)
    fraction = cpu_s / wall_s if wall_s > 0 else 0.0
    waited, over = window_delta(waits, *window)
    wait = round(waited / over, 3) if over > 0 else None
    reason = saturation(fraction, p99)
    if reason and wait is not None and wait >= BUSY_NODE_WAIT:
        reason += f" (it waited for a core {100 * wait:.0f} % of the time: the node's cores were busy)"
    if wall_s <= 0:
        reason = "no CPU samples in the measured window"
    return ClientStats(
        node_id,
        node_ip,
        pid,
        round(cpu_s, 3),
        round(wall_s, 3),
        round(fraction, 3),
        round(p99 or 0.0, 3),
        round(worst or 0.0, 3),
        reason is not None,
        reason,
        loops,
        connected,
        wait,
    )


def rollout_spans(records: Sequence[TurnRecord]) -> list[tuple[float, float, list[TurnRecord]]]:
    """The rollouts that ended (the loop started another after them), each as (start, end,
    its turns): start when its connection began opening (``connect_ms`` before its first
    turn was sent), end when its last turn was answered."""
    by_loop: dict[int, list[TurnRecord]] = {}
    for r in sorted(records, key=lambda r: r.sent):
        by_loop.setdefault(r.loop, []).append(r)
    out = []
    for turns in by_loop.values():
        starts = [i for i, r in enumerate(turns) if r.kind != "steady"]
        for a, b in pairwise(starts):
            first, last = turns[a], turns[b - 1]
            out.append((first.sent - (first.connect_ms or 0.0) / 1000, last.done, turns[a:b]))
    return out


def _q(values: Iterable[float]) -> dict[str, float | None]:
    v = sorted(values)
    return {k: None if (x := pct(v, q)) is None else round(x, 3) for k, q in (("p50", 0.5), ("p99", 0.99))}


@dataclass
class LoadResult:
    records: list[TurnRecord]
    clients: list[ClientStats]
    window: tuple[float, float] = (0.0, 0.0)  # the measured window (time.time())
    release_at: float = 0.0  # when every loop's first turn was sent
    errors: dict[int, list[str]] = field(default_factory=dict)  # by loop, a few of each
    connected: int = 0
    loops: int = 0
    lag_ms: list[float] = field(default_factory=list)  # every client's ticks in the window
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (when, ms) ticks over 20 ms
    check: RunCheck | None = None  # with ``check_events``: every stream's invariants, all clients
    # failed connection attempts by type (``connect:http_503``, ...), retried or not (bench/runner/connecting.py)
    connect_failures: dict[str, int] = field(default_factory=dict)
    connects: list[tuple[float, float]] = field(default_factory=list)  # (began, time.time(); ms) each open
    connections: list[ConnectionRecord] = field(default_factory=list)  # ws: every connection opened
    # chains: failed opens answered with an HTTP refusal that is not a typed ask to retry (a 503
    # with Retry-After and an error body whose code asks for one: bench/runner/connecting.py), by type
    connect_untyped: dict[str, int] = field(default_factory=dict)

    @property
    def saturated(self) -> bool:
        """Any client saturated: the step is invalid."""
        return any(c.saturated for c in self.clients)

    @property
    def reason(self) -> str | None:
        bad = [c for c in self.clients if c.saturated]
        if not bad:
            return None
        return "; ".join(f"client {c.node_ip or 'local'}/{c.pid}: {c.reason}" for c in bad)

    def in_window(self) -> list[TurnRecord]:
        """The turns answered inside the measured window."""
        t0, t1 = self.window
        return [r for r in self.records if t0 <= r.done <= t1]

    def summary(self) -> dict[str, Any]:
        """Turns/s, non-model time and TTFT p50/p99, failures by type over the measured
        window; the clients' own figures and whether the step is valid."""
        t0, t1 = self.window
        rows = self.in_window()
        ok = [r for r in rows if r.ok]
        span = t1 - t0
        failures = Counter(r.error_code or "error" for r in rows if not r.ok)
        failures.update(self.connect_failures)
        return {
            "loops": self.loops,
            "connected": self.connected,
            "window_s": round(span, 3),
            "turns": len(ok),
            "turns_per_s": round(len(ok) / span, 2) if span > 0 else None,
            "nonmodel_ms": _q(m for r in ok if (m := r.nonmodel_ms) is not None),
            "ttft_ms": _q(r.ttft_ms for r in ok if r.ttft_ms is not None),
            "failures": dict(failures),
            "closes": dict(Counter(c.close_code for c in self.connections if c.close_code is not None)),
            "valid": not self.saturated,
            "invalid_reason": self.reason,
            "clients": [c.as_dict() for c in self.clients],
        }
