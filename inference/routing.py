"""Session affinity: which replica serves a session's requests (pure; the Serve request
router in ``inference.deployment`` calls it).

A request carrying a session key goes to the replica the key is pinned to, for as long as
that replica is alive.  A key seen for the first time (or whose replica died) is pinned by
rendezvous hashing (highest random weight) over the live replicas, so different routers —
e.g. the handles of two processes that both see the same replicas — pick the same replica
for a new key, and when a replica dies only its keys move.  Pins are sticky: a replica
added later (autoscaling) does not take existing sessions away from a live replica.  The
table of pins is a bounded LRU; a key that fell out of it is re-pinned by the hash, which
gives the same replica unless the set of replicas changed in between.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from hashlib import blake2b


def rendezvous(key: str, replicas: Sequence[str]) -> str:
    """The replica with the highest ``blake2b(key, replica)`` weight (stable across
    processes and Python's hash salting)."""
    if not replicas:
        raise ValueError("no replicas")
    k = key.encode() + b"\0"

    def weight(replica: str) -> bytes:
        return blake2b(k + replica.encode(), digest_size=8).digest()

    return max(replicas, key=weight)


class SessionAffinity:
    """Sticky session → replica pins, at most ``capacity`` of them (LRU)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self._capacity = capacity
        self._pins: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins)

    def choose(self, key: str, replicas: Sequence[str]) -> str:
        """The replica for ``key`` among the live ``replicas`` (pinning it if new)."""
        pinned = self._pins.get(key)
        if pinned is not None and pinned in replicas:
            self._pins.move_to_end(key)
            return pinned
        chosen = rendezvous(key, replicas)
        self._pins[key] = chosen
        self._pins.move_to_end(key)
        while len(self._pins) > self._capacity:
            self._pins.popitem(last=False)
        return chosen
