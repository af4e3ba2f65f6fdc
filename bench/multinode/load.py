"""The multi-node fault load: WebSocket clients through the balancer, on the lab's load runner
(bench/runner, the ``chains`` workload: ``store:false`` chains, a connection a chain, a new
one after a close; with ``resend_history`` Codex-like clients that resend their conversation).
The runner keeps each connection's :class:`~bench.runner.ConnectionRecord` (its close code,
1006 when the TCP connection ended without a close frame, its creates and the frames that
answered them) and, with the spec's ``locate``, the session node the balancer sent it to (the
runtime API's ``show sess``: client port → node).  :func:`run_load` gives them back per
client, with the harness's clock (``time.monotonic()``), as the multi-node tests read them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..runner import Chains, ConnectionRecord, LoadResult, LoadSpec, TurnRecord, start_local

WAIT_SLICE_S = 0.5  # the driver's sleep while the load runs (bounded: the run's deadline)


@dataclass
class Connection:
    """One socket of a client: when it opened, the turns it completed, how it ended."""

    opened_at: float
    local_port: int
    server: str | None = None  # the session node, from the balancer
    turns: int = 0
    closed_at: float | None = None
    close_code: int | None = None  # None: still open or closed by the client itself
    in_flight: bool = False  # a create was sent and its terminal event not received
    completions: list[float] = field(default_factory=list)  # when each turn's terminal event came
    cached: list[int] = field(default_factory=list)  # each completed turn's ``cached_tokens``
    creates: int = 0  # ``response.create`` sent
    created: int = 0  # ``response.created`` received
    terminals: int = 0  # terminal events received
    shutting_down: int = 0  # creates answered with ``server_shutting_down``
    stopped: bool = False  # the load ended before this connection's chain did

    def open_at(self, t: float) -> bool:
        return self.opened_at <= t and (self.closed_at is None or self.closed_at >= t)


@dataclass
class Client:
    index: int
    connections: list[Connection] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the first few

    @property
    def turns(self) -> int:
        return sum(c.turns for c in self.connections)

    def connection_at(self, t: float) -> Connection | None:
        return next((c for c in self.connections if c.open_at(t)), None)

    @property
    def closes(self) -> list[Connection]:
        return [c for c in self.connections if c.close_code is not None]


@dataclass
class Load:
    clients: list[Client]
    result: LoadResult  # the runner's: every turn and connection, the client processes' own figures

    @property
    def failed_connects(self) -> int:
        return sum(self.result.connect_failures.values())


def error_code(event: dict) -> str | None:
    err = event.get("error")
    return (err.get("code") if isinstance(err, dict) else None) or event.get("code")


def connection(record: ConnectionRecord, turns: list[TurnRecord], offset: float) -> Connection:
    """A connection as the tests read it, its times moved by ``offset`` (to the harness's clock)."""
    done = sorted((r for r in turns if r.ok), key=lambda r: r.done)
    return Connection(
        opened_at=record.opened + offset,
        local_port=record.local_port,
        server=record.server,
        turns=record.completed,
        closed_at=None if record.closed is None else record.closed + offset,
        close_code=record.close_code,
        in_flight=record.in_flight,
        completions=[r.done + offset for r in done],
        cached=[r.cached_tokens or 0 for r in done],
        creates=record.creates,
        created=record.created,
        terminals=record.terminals,
        shutting_down=record.shutting_down,
        stopped=record.stopped,
    )


def clients_of(result: LoadResult, offset: float) -> list[Client]:
    """Each loop as a client: its connections in order, each with its turns."""
    turns: dict[tuple[int, int | None], list[TurnRecord]] = {}
    for r in result.records:
        turns.setdefault((r.loop, r.connection), []).append(r)
    out = [Client(i, errors=list(result.errors.get(i, []))) for i in range(result.loops)]
    for rec in sorted(result.connections, key=lambda c: (c.loop, c.index)):
        out[rec.loop].connections.append(connection(rec, turns.get((rec.loop, rec.index), []), offset))
    return out


def clients_figures(result: LoadResult) -> str:
    """The client processes' own figures over the run (bench/runner measures itself): CPU,
    event-loop lag, saturated or not."""
    return "; ".join(
        f"pid {c.pid}: CPU {100 * c.cpu_fraction:.0f} % of a core, lag p99 {c.lag_p99_ms:.1f} ms"
        + (f", saturated ({c.reason})" if c.saturated else "")
        for c in result.clients
    )


def run_load(
    url: str,
    clients: int,
    duration_s: float,
    servers: Callable[[], dict[int, str]],
    during: Callable[[], None] | None = None,
    during_at_s: float | None = None,
    *,
    turns_per_chain: int = 4,
    think_s: float = 0.2,
    max_tokens: int | None = None,
    reconnect_s: float = 0.2,
    open_timeout_s: float = 10.0,
    ping_interval_s: float | None = 5.0,
    resend_history: bool = False,
    processes: int = 1,
) -> Load:
    """``clients`` clients (the runner's loops, in ``processes`` client processes) for
    ``duration_s`` from their release, each connection located with ``servers`` (the
    balancer's view: picklable, it runs in the client processes); ``during`` runs at
    ``during_at_s`` after the release."""
    chains = Chains(turns_per_chain, think_s, max_tokens, reconnect_s, ping_interval_s, resend_history)
    spec = LoadSpec(
        targets=(url,),
        loops=clients,
        workload="chains",
        duration_s=duration_s,
        warmup_s=0.0,
        open_timeout_s=open_timeout_s,
        chains=chains,
        locate=servers,
    )
    with start_local(spec, processes) as run:
        if during is not None and during_at_s is not None:
            while (left := run.release_at + during_at_s - time.time()) > 0:
                time.sleep(min(WAIT_SLICE_S, left))
            during()
        while (left := run.deadline - time.time()) > 0:
            time.sleep(min(WAIT_SLICE_S, left))
        result = run.stop()
    return Load(clients_of(result, time.monotonic() - time.time()), result)
