"""Which replica serves a request (pure decisions; the Serve request router in
``inference.emulator.deployment`` calls them with the live replicas and the real clock).

Two rules, as the hosted API's prompt cache is described (docs/emulator.md):

**A connection is pinned.**  A request carrying a session key (a WebSocket connection's
id) goes to the replica the key is pinned to, for as long as that replica is alive.  A key
seen for the first time (or whose replica died) is pinned to the replica its request names
as its conversation's (``replica_hint``: the replica that served the previous response,
which a connection resumed on another session host brings along in its state) while that
replica lives; otherwise where its request's *prefix route* (below) sends it, so a new
socket starts on the replica that already holds its API key's copy of the same
instructions and tools; without a request to route (e.g. a caller that passes no
``InferenceRequest``) it is pinned by rendezvous hashing of the key itself.  The prefix
route alone would not do for a resumed conversation: its per-minute spill is counted per
router (per process), so the new host's router may send the conversation to another
replica than the one its first turn spilled to, where none of its own prefix is cached.
Pins are sticky: a replica added later (autoscaling) does not take existing sessions away
from a live replica.  The table of pins is a bounded LRU; a key that fell out of it is
re-pinned by its next request's hint or prefix route.

**A stateless request follows its prefix.**  A request without a session key (HTTP) is
routed by ``prefix_key``: a BLAKE2 digest of its cache scope (the API key), its
``prompt_cache_key`` and its first ``prefix_tokens`` (256) prompt tokens.  Replicas are
ranked for that key by rendezvous hashing (highest random weight), so every router — the
handles of different processes — ranks them alike, and when a replica dies only its keys
move.  The request goes to the highest-ranked replica that has taken fewer than
``requests_per_min`` requests of that key in the last minute; when all have, to the one that
took the fewest (``spill``).  The hosted API documents ~15 requests per minute per prefix
and ``prompt_cache_key`` before requests overflow to other machines.

The request counts are per router (per calling process: each gateway replica and each
session actor counts what it routed), and only the requests routed by prefix count — a
pinned connection's later requests go to their pin without being counted.

**One state a process.**  A process's pins, prefix counts and the live replicas its Serve
router last heard of are one :class:`Routes`, published by the inference app's name
(:func:`routes_of`; one deployment of the app routes by these rules).  The Serve request router decides with it on Serve's routing thread;
a session host decides a connection's first call with the same object on its own event
loop (:meth:`Routes.first_call`), so a first call it sends over a direct channel is pinned
exactly as the router would have pinned it, and a call that then goes through Serve after
all finds its key already pinned there.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from hashlib import blake2b

from .types import InferenceRequest

PREFIX_TOKENS = 256
"""Prompt tokens hashed into a stateless request's route (the hosted API: "typically the
first 256 tokens")."""

PREFIX_REQUESTS_PER_MIN = 15
"""Requests per minute of one prefix + ``prompt_cache_key`` one replica takes before the
overflow goes to the next (the hosted API documents "approximately 15 requests per minute")."""


def _weight(key: bytes, replica: str) -> bytes:
    return blake2b(key + replica.encode(), digest_size=8).digest()


def ranked(key: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` by descending ``blake2b(key, replica)`` weight (stable across processes
    and Python's hash salting); the first is ``rendezvous(key, replicas)``."""
    k = key.encode() + b"\0"
    return sorted(replicas, key=lambda replica: _weight(k, replica), reverse=True)


def rendezvous(key: str, replicas: Sequence[str]) -> str:
    """The replica with the highest ``blake2b(key, replica)`` weight."""
    if not replicas:
        raise ValueError("no replicas")
    k = key.encode() + b"\0"
    return max(replicas, key=lambda replica: _weight(k, replica))


def prefix_key(
    prompt_token_ids: Sequence[int],
    scope: str | None,
    prompt_cache_key: str | None,
    prefix_tokens: int = PREFIX_TOKENS,
) -> str:
    """The route of a stateless request: a hex BLAKE2 digest of its cache ``scope``, its
    ``prompt_cache_key`` and its first ``prefix_tokens`` prompt tokens (little-endian
    uint32 ids).  Two requests share a route exactly when all three agree."""
    head = array("I", prompt_token_ids[:prefix_tokens])
    if sys.byteorder != "little":
        head.byteswap()
    h = blake2b(digest_size=16)
    for part in (scope, prompt_cache_key):
        h.update(b"-" if part is None else b"+" + part.encode())
        h.update(b"\0")
    h.update(head.tobytes())
    return h.hexdigest()


def spill(ranked_replicas: Sequence[str], recent: Mapping[str, int], limit: int) -> str:
    """The replica for the next request of one route.

    ``ranked_replicas`` is the route's preference order, ``recent[r]`` how many of its
    requests replica ``r`` took within the window, ``limit`` how many one replica takes
    before the overflow moves on: the first replica in rank order under the limit, else the
    one that took the fewest (the higher-ranked on a tie)."""
    if not ranked_replicas:
        raise ValueError("no replicas")
    for replica in ranked_replicas:
        if recent.get(replica, 0) < limit:
            return replica
    return min(ranked_replicas, key=lambda replica: recent.get(replica, 0))


class PrefixRouting:
    """Stateless requests → replicas by prefix, with the per-minute spill (module doc).

    Holds, per route, the times and replicas of the requests it routed within the last
    ``window_s`` seconds, for at most ``capacity`` routes (LRU).  ``clock`` gives seconds
    (monotonic); tests pass a fake one.
    """

    def __init__(
        self,
        requests_per_min: int = PREFIX_REQUESTS_PER_MIN,
        clock: Callable[[], float] = time.monotonic,
        *,
        window_s: float = 60.0,
        capacity: int = 65_536,
    ) -> None:
        if requests_per_min < 1:
            raise ValueError("requests_per_min must be >= 1")
        self._limit = requests_per_min
        self._clock = clock
        self._window = window_s
        self._capacity = capacity
        # per route: its requests in the window (oldest first) and how many each replica took
        self._routed: OrderedDict[str, tuple[deque[tuple[float, str]], dict[str, int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routed)

    def _current(self, key: str) -> dict[str, int]:
        """``key``'s live counts with the requests older than the window dropped (each
        request is dropped once: a storm of one route costs O(1) a request, not O(n))."""
        entry = self._routed.get(key)
        if entry is None:
            return {}
        routed, counts = entry
        horizon = self._clock() - self._window
        while routed and routed[0][0] <= horizon:
            _, replica = routed.popleft()
            left = counts[replica] - 1
            if left:
                counts[replica] = left
            else:
                del counts[replica]
        return counts

    def recent(self, key: str) -> dict[str, int]:
        """Requests of ``key`` each replica took within the window, as of now."""
        return dict(self._current(key))

    def choose(self, key: str, replicas: Sequence[str]) -> list[str]:
        """Route one request of ``key`` among the live ``replicas`` and count it; returns
        every replica in preference order, the chosen one first (the rest in rank order, for
        a caller that must fall back when the chosen one is full)."""
        order = ranked(key, replicas)
        chosen = spill(order, self._current(key), self._limit)
        routed, counts = self._routed.setdefault(key, (deque(), {}))
        routed.append((self._clock(), chosen))
        counts[chosen] = counts.get(chosen, 0) + 1
        self._routed.move_to_end(key)
        while len(self._routed) > self._capacity:
            self._routed.popitem(last=False)
        return [chosen, *(r for r in order if r != chosen)]


class SessionAffinity:
    """Sticky session → replica pins, at most ``capacity`` of them (LRU)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self._capacity = capacity
        self._pins: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins)

    def pinned(self, key: str, replicas: Sequence[str]) -> str | None:
        """The replica ``key`` is pinned to, if it is among the live ``replicas``."""
        pin = self._pins.get(key)
        if pin is None or pin not in replicas:
            return None
        self._pins.move_to_end(key)
        return pin

    def pin(self, key: str, replica: str) -> None:
        """Pin ``key`` to ``replica`` (replacing an earlier pin)."""
        self._pins[key] = replica
        self._pins.move_to_end(key)
        while len(self._pins) > self._capacity:
            self._pins.popitem(last=False)

    def choose(self, key: str, replicas: Sequence[str], first: Callable[[], str] | None = None) -> str:
        """The replica for ``key`` among the live ``replicas``.  A key not pinned to a live
        replica is pinned to ``first()`` — the caller's choice for a new key, e.g. its
        request's prefix route — or, without it, to ``rendezvous(key, replicas)``."""
        pin = self.pinned(key, replicas)
        if pin is None:
            pin = first() if first is not None else rendezvous(key, replicas)
            self.pin(key, pin)
        return pin


class Routes:
    """One process's routing state for one deployment: the session pins, the prefix counts
    and the live replicas its router last heard of (``update``), shared by threads under a
    lock (module doc, "One state a process")."""

    def __init__(
        self,
        *,
        prefix_tokens: int = PREFIX_TOKENS,
        requests_per_min: int = PREFIX_REQUESTS_PER_MIN,
        max_pins: int = 65_536,
        max_prefixes: int = 65_536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prefix_tokens = prefix_tokens
        self._affinity = SessionAffinity(max_pins)
        self._prefix = PrefixRouting(requests_per_min, clock, capacity=max_prefixes)
        self._lock = threading.RLock()  # the router's thread and the host's loop
        self.live: tuple[str, ...] = ()

    def update(self, live: Sequence[str]) -> None:
        """The replicas now running (the router's view of the deployment)."""
        self.live = tuple(sorted(live))

    def prefix(self, request: InferenceRequest, live: Sequence[str]) -> list[str]:
        """Route a stateless request (or a new key's first) by its prefix and count it: every
        live replica, the chosen first (:meth:`PrefixRouting.choose`)."""
        key = prefix_key(
            request.prompt_token_ids, request.cache_scope, request.prompt_cache_key, self._prefix_tokens
        )
        with self._lock:
            return self._prefix.choose(key, live)

    def session(
        self,
        key: str,
        request: InferenceRequest | None,
        live: Sequence[str],
        route: Callable[[], str] | None = None,
    ) -> str:
        """The replica of session ``key`` among ``live``: its pin, else (pinned now) the
        replica its request names (``replica_hint``) while live, else its prefix route
        (``route``, or :meth:`prefix`'s first), else — no request — rendezvous of the key."""
        first: Callable[[], str] | None = None
        if request is not None:
            hint = request.replica_hint
            if hint and hint in live:
                first = lambda: hint  # noqa: E731 - a value as the deferred choice
            else:
                first = route or (lambda: self.prefix(request, live)[0])
        with self._lock:
            return self._affinity.choose(key, live, first)

    def pin(self, key: str, replica: str) -> None:
        """Pin ``key`` to ``replica`` (e.g. a key of the caller's own, to reach that replica
        through the router)."""
        with self._lock:
            self._affinity.pin(key, replica)

    def first_call(self, request: InferenceRequest) -> str | None:
        """Where the router would send ``request`` (a connection's call: it has a session
        key), pinning its key there as the router would; ``None`` while no replica is known
        to run or for a call without a key (then the caller routes it through Serve)."""
        live = self.live
        if not live or not request.session_key:
            return None
        return self.session(request.session_key, request, live)


_PUBLISHED: dict[str, Routes] = {}


def routes_of(deployment: str, make: Callable[[], Routes] | None = None) -> Routes | None:
    """This process's :class:`Routes` published as ``deployment`` (the inference app's name:
    the router publishes by its ``app_name``): the one published, else ``make()``'s,
    published now; ``None`` when there is none and no ``make``."""
    routes = _PUBLISHED.get(deployment)
    if routes is None and make is not None:
        routes = _PUBLISHED.setdefault(deployment, make())
    return routes
