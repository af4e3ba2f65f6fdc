"""The session-host pool's policy, as pure functions of its hosts and the time given: where a
connection goes, how many free slots to keep ahead of demand, which idle hosts stop.  No
asyncio, no clock of its own: :class:`serve.pool.ActorPool` holds the hosts, starts and stops
them and calls these (tests/serve/test_pool_policy.py checks them without an event loop)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.host.limits import connection_budget

RATE_WINDOW_S = 5.0  # the arrival rate is an exponentially decaying average over about this long
HEADROOM = 1.5  # slots kept for arrivals during one start, times this


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    soft: int  # connections per host the pool aims for
    hard: int  # connections per host, at most
    warm: int  # free slots kept ready, at least
    max_hosts: int
    max_starting: int
    idle_timeout_s: float
    admission_wait_s: float
    startup_s: float = 2.0  # first guess of a host's start-up time; then measured
    http_hosts: int = (
        0  # hosts for HTTP mode alone (started on demand, then kept); 0: HTTP shares the WebSocket hosts
    )


@dataclass(eq=False)
class Host:
    name: str
    handle: Any  # what ``create`` returned (the gateway's actor + link)
    started_at: float
    connections: int = 0
    http: int = 0  # HTTP connections it serves now
    idle_since: float | None = None
    http_only: bool = False  # a host of HTTP mode: WebSockets never go to it


@dataclass
class ArrivalRate:
    """Arrivals per second, exponentially decaying over ``window_s``."""

    window_s: float = RATE_WINDOW_S
    rate: float = 0.0
    at: float | None = None

    def now(self, t: float) -> float:
        if self.at is None:
            return 0.0
        return self.rate * math.exp(-(t - self.at) / self.window_s)

    def add(self, t: float) -> None:
        self.rate = self.now(t) + 1.0 / self.window_s
        self.at = t


def admission_target(hosts: Sequence[Host], policy: PoolPolicy) -> Host | None:
    """Where the next connection goes: the fullest host below the soft target (packing leaves
    the newest hosts idle, to stop; ties to the oldest), else the emptiest below the hard cap;
    ``None``: every host is at its hard cap."""
    below_soft = [h for h in hosts if h.connections < policy.soft]
    if below_soft:
        return max(below_soft, key=lambda h: h.connections)
    return min((h for h in hosts if h.connections < policy.hard), key=lambda h: h.connections, default=None)


def shared_http_host(hosts: Sequence[Host], policy: PoolPolicy) -> Host:
    """The WebSocket host an HTTP connection shares (no HTTP hosts): the one with the least
    HTTP work, then the fewest connections, preferring any host but the one new WebSockets go
    to, so a stateless rebuild does not delay their handshakes; the newest on a tie."""
    target = admission_target(hosts, policy)
    others = [h for h in hosts if h is not target] or list(hosts)
    return min(reversed(others), key=lambda h: (h.http, h.connections))


def free_slots(hosts: Sequence[Host], starting: int, soft: int) -> int:
    """Slots below the soft target on the live hosts, and a host's worth for each starting."""
    return sum(max(0, soft - h.connections) for h in hosts) + starting * soft


def wanted_free(policy: PoolPolicy, arrivals_per_s: float, startup_s: float) -> int:
    """Free slots to keep: ``warm``, or the arrivals expected during one start (with
    :data:`HEADROOM`), never more than every host could hold."""
    expected = arrivals_per_s * startup_s * HEADROOM
    return min(max(policy.warm, math.ceil(expected)), policy.max_hosts * policy.soft)


def starts_wanted(policy: PoolPolicy, *, free: int, need: int, live: int, starting: int) -> int:
    """How many hosts to start now so ``free`` slots reach ``need``, within
    ``max_starting`` at a time and ``max_hosts`` in all."""
    short = max(0, math.ceil((need - free) / policy.soft))
    return max(0, min(short, policy.max_starting - starting, policy.max_hosts - live - starting))


def idle_to_stop(hosts: Sequence[Host], policy: PoolPolicy, *, now: float, wanted: int) -> list[Host]:
    """The hosts to stop, newest first: idle for ``idle_timeout_s`` (no connection, no HTTP
    work), while the other live hosts keep twice the ``wanted`` free slots (and ``warm``);
    never the last live host."""
    keep = max(2 * wanted, policy.warm)
    live_free = free_slots(hosts, 0, policy.soft)
    left = len(hosts)
    stop: list[Host] = []
    for host in reversed(hosts):
        if left == 1 or live_free - policy.soft < keep:
            break
        if (
            host.connections
            or host.http
            or host.idle_since is None
            or now - host.idle_since < policy.idle_timeout_s
        ):
            continue
        stop.append(host)
        left -= 1
        live_free -= policy.soft
    return stop


def next_startup_s(previous_s: float, took_s: float, *, first: bool) -> float:
    """A host's start-up time as the pool expects it: the first start's, then a moving
    average (weight 0.3 on the newest)."""
    return took_s if first else 0.7 * previous_s + 0.3 * took_s


def retry_after_s(startup_s: float) -> int:
    """``Retry-After`` for a refused connection: one start-up time, at least a second."""
    return max(1, math.ceil(startup_s))


def policy_from(config: Any, open_files: int | None = None) -> PoolPolicy:
    """The pool's policy from :class:`actors.config.SessionConfig`; a host's hard cap is
    what ``open_files`` (the hosts' open-file limit, as the gateway's) leaves, if lower."""
    hard = config.hard_connections_per_actor
    if open_files is not None:
        hard = connection_budget(open_files, hard)
    soft = min(config.connections_per_actor, hard)
    return PoolPolicy(
        soft=soft,
        hard=hard,
        warm=config.spare_slots,
        max_hosts=config.max_actors,
        max_starting=config.max_starting_actors,
        idle_timeout_s=config.actor_idle_timeout_s,
        admission_wait_s=config.admission_wait_s,
        http_hosts=config.http_actors,
    )
