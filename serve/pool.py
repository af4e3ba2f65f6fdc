"""Assigning connections to session hosts: packed by default, never one start per connection.

A session host is a Ray actor (a process, costly to start and warm: docs/scaling.md), so
hosts are packed: each takes up to
``connections_per_actor`` connections (the *soft* target) and, while no host below its
target is live, up to ``max_connections_per_actor`` (the *hard* cap).  Admission therefore
never waits on a start while a live host is below its hard cap.

The pool scales out *ahead* of demand: it keeps a number of free slots (counted against
the soft target, starting hosts included) that follows the arrival rate — at least
``warm_actors`` slots, and enough for the connections expected to arrive while one host
starts.  Hosts start in the background, at most ``max_starting_actors`` at a time.  Idle
hosts stop after ``actor_idle_timeout_s`` only while the others keep twice the wanted free
slots (hysteresis: a host just stopped is not needed again a moment later).

When every live host is at its hard cap, an upgrade waits for a starting host for at most
``admission_wait_s``, and is refused (:class:`NoCapacity`, 503 with ``Retry-After``) past
it, or at once when no host can start (``max_actors``).

HTTP mode (:meth:`ActorPool.acquire_http`) runs on hosts of its own, ``http_hosts`` of them,
started at the first HTTP connection and kept from then on (an idle stop would bring back
the stand-in below after every lull): a stateless rebuild of a long conversation then never
shares an event loop and a GIL with open WebSockets (docs/performance.md, "Neighbours").
The first HTTP connections wait for it, up to ``admission_wait_s``; past that a WebSocket
host stands in, and that connection closes after its request (its next one is routed again).  With ``http_hosts`` 0 HTTP shares the WebSocket
hosts: another than new WebSockets go to, and the pool keeps two hosts while HTTP runs.

:class:`ActorPool` runs the pool on the gateway's event loop: it holds the hosts, owns the
tasks that start them and the admission wait's timeout, and kills the hosts it stops; its
decisions are the pure functions of :mod:`serve.pool_policy`.  The clock, host creation and
killing are injected (tests/serve/test_pool.py drives it with fakes of them).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import pool_policy as policies
from .pool_policy import ArrivalRate, Host, PoolPolicy, policy_from

log = logging.getLogger(__name__)


class NoCapacity(Exception):
    """Every host is at its hard cap and none can start in time."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("no session host can take the connection")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Lease:
    host: Host
    conn_id: str


@dataclass(frozen=True, slots=True)
class HttpLease:
    """Where an HTTP connection goes; ``keep_alive`` ``False``: a WebSocket host stands in
    for the HTTP hosts (none is live yet), and the connection closes after its request."""

    host: Host
    keep_alive: bool = True


@dataclass
class _Counters:
    started: int = 0
    start_failures: int = 0
    stopped: int = 0
    refused: int = 0
    waited: int = 0


class ActorPool:
    def __init__(
        self,
        create: Callable[[str], Awaitable[Any]],  # a host's name → its started, warmed handle
        kill: Callable[[Any], None],
        policy: PoolPolicy,
        *,
        prefix: str,
        clock: Callable[[], float],
    ) -> None:
        self._create = create
        self._kill = kill
        self.policy = policy
        self._prefix = prefix
        self._clock = clock
        self._ids = itertools.count()
        self._hosts: list[Host] = []  # live WebSocket hosts, oldest first
        self._starting: set[asyncio.Task[Host | None]] = set()
        self._http_hosts: list[Host] = []  # live hosts of HTTP mode (policy.http_hosts)
        self._http_starting: set[asyncio.Task[Host | None]] = set()
        self._arrivals = ArrivalRate()
        self._startup_s = policy.startup_s
        self._waiting = 0
        self._changed = asyncio.Event()  # a host became live (or failed to)
        self.counters = _Counters()

    # ------------------------------------------------------------------ admission
    def try_acquire(self) -> Lease | None:
        """A slot on a live host (:func:`~serve.pool_policy.admission_target`), or ``None``."""
        host = policies.admission_target(self._hosts, self.policy)
        if host is None:
            return None
        host.connections += 1
        host.idle_since = None
        return Lease(host, f"{self._prefix}-{next(self._ids)}")

    async def acquire(self) -> Lease:
        """A slot for a new connection.  Waits only when every live host is at its hard cap
        and a host is starting; :class:`NoCapacity` otherwise or after ``admission_wait_s``."""
        self._arrivals.add(self._clock())
        lease = self.try_acquire()
        self._scale_out()
        if lease is not None:
            return lease
        if not self._starting:
            self.counters.refused += 1
            raise NoCapacity(self.retry_after_s)
        self._waiting += 1
        self.counters.waited += 1
        try:
            async with asyncio.timeout(self.policy.admission_wait_s):
                while (lease := self.try_acquire()) is None:
                    if not self._starting:
                        break
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            lease = None
        finally:
            self._waiting -= 1
        if lease is None:
            self.counters.refused += 1
            raise NoCapacity(self.retry_after_s)
        self._scale_out()
        return lease

    def release(self, lease: Lease) -> None:
        """The connection (and any state it parked) is gone: its slot is free again."""
        host = lease.host
        host.connections -= 1
        if host.connections == 0 and host.http == 0:
            host.idle_since = self._clock()

    async def acquire_http(self) -> HttpLease | None:
        """A live host for an HTTP connection (it takes no slot), or ``None`` (no host at all).

        With ``http_hosts``: the HTTP host with the least HTTP work, the missing ones started
        now; while none is live, the connection waits for a start for up to
        ``admission_wait_s``, then a WebSocket host stands in (``keep_alive`` ``False``).
        Without: the WebSocket host with the least HTTP work, preferring any host but the one
        new WebSockets go to, so a stateless rebuild does not delay their handshakes; while
        HTTP work runs the pool then keeps two hosts."""
        p = self.policy
        if p.http_hosts:
            while len(self._http_hosts) + len(self._http_starting) < p.http_hosts:
                self._start_one(http=True)
            try:
                async with asyncio.timeout(p.admission_wait_s):
                    while not self._http_hosts and self._http_starting:
                        self._changed.clear()
                        await self._changed.wait()
            except TimeoutError:
                pass
            if self._http_hosts:
                return HttpLease(self._take_http(min(self._http_hosts, key=lambda h: h.http)))
        if not self._hosts:
            return None
        host = self._take_http(policies.shared_http_host(self._hosts, p))
        if not p.http_hosts and len(self._hosts) + len(self._starting) < min(2, p.max_hosts):
            self._start_one()
        return HttpLease(host, keep_alive=not p.http_hosts)

    def _take_http(self, host: Host) -> Host:
        host.http += 1
        host.idle_since = None
        return host

    def release_http(self, host: Host) -> None:
        host.http -= 1
        if host.http == 0 and host.connections == 0 and not host.http_only:
            host.idle_since = self._clock()

    def host_died(self, host: Host) -> None:
        """The host is gone (its process died): forget it, start replacements as needed (an
        HTTP host at the next HTTP connection)."""
        for hosts in (self._hosts, self._http_hosts):
            if host in hosts:
                hosts.remove(host)
                self._kill(host.handle)
        self._scale_out()

    # ------------------------------------------------------------------ sizing
    @property
    def retry_after_s(self) -> int:
        return policies.retry_after_s(self._startup_s)

    def wanted_free(self) -> int:
        """Free slots to keep (:func:`~serve.pool_policy.wanted_free`)."""
        return policies.wanted_free(self.policy, self._arrivals.now(self._clock()), self._startup_s)

    def free_slots(self) -> int:
        return policies.free_slots(self._hosts, len(self._starting), self.policy.soft)

    def _scale_out(self) -> None:
        for _ in range(
            policies.starts_wanted(
                self.policy,
                free=self.free_slots(),
                need=self.wanted_free() + self._waiting,
                live=len(self._hosts),
                starting=len(self._starting),
            )
        ):
            self._start_one()

    def _start_one(self, *, http: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._start(http))
        (self._http_starting if http else self._starting).add(task)
        task.add_done_callback(self._started)

    async def _start(self, http: bool = False) -> Host | None:
        name = f"{self._prefix}-{'h' if http else 'a'}{next(self._ids)}"
        t0 = self._clock()
        try:
            handle = await self._create(name)
        except Exception:
            log.exception("could not start a session host")
            self.counters.start_failures += 1
            return None
        took = self._clock() - t0
        self._startup_s = policies.next_startup_s(self._startup_s, took, first=not self.counters.started)
        self.counters.started += 1
        host = Host(
            name, handle, started_at=self._clock(), idle_since=None if http else self._clock(), http_only=http
        )
        (self._http_hosts if http else self._hosts).append(host)
        return host

    def _started(self, task: asyncio.Task[Host | None]) -> None:
        self._starting.discard(task)
        self._http_starting.discard(task)
        self._changed.set()
        if not task.cancelled() and task.exception() is None and task.result() is not None:
            self._scale_out()  # demand may have grown while it started

    def tick(self) -> None:
        """Periodically: stop the idle hosts :func:`~serve.pool_policy.idle_to_stop` names,
        then start what is missing.  HTTP hosts are kept."""
        for host in policies.idle_to_stop(
            self._hosts, self.policy, now=self._clock(), wanted=self.wanted_free()
        ):
            self._hosts.remove(host)
            self.counters.stopped += 1
            self._kill(host.handle)
        self._scale_out()

    async def warm_up(self) -> None:
        self._scale_out()
        while self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    # ------------------------------------------------------------------ views
    def hosts(self) -> list[Host]:
        """Every live host: the WebSocket hosts, then the HTTP hosts."""
        return [*self._hosts, *self._http_hosts]

    def stats(self) -> dict[str, int]:
        """``actors``, ``free_slots``, ``starting`` and ``connections`` are the WebSocket
        hosts'; ``http_actors`` the HTTP hosts (live)."""
        return {
            "actors": len(self._hosts),
            "free_slots": policies.free_slots(self._hosts, 0, self.policy.soft),
            "starting": len(self._starting),
            "connections": sum(h.connections for h in self._hosts),
            "http_actors": len(self._http_hosts),
        }

    def shutdown(self) -> None:
        for task in [*self._starting, *self._http_starting]:
            task.cancel()
        for host in self.hosts():
            self._kill(host.handle)
        self._hosts.clear()
        self._http_hosts.clear()


__all__ = [
    "ActorPool",
    "ArrivalRate",
    "Host",
    "HttpLease",
    "Lease",
    "NoCapacity",
    "PoolPolicy",
    "policy_from",
]
