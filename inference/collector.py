"""The garbage collector's policy in this server's long-running processes (the session
hosts, the gateway, the inference replicas).

CPython's full collection walks every tracked container object, and a started server
process holds well over a hundred thousand that it never frees (Ray's, pydantic's schemas,
the modules, the tokenizer): with only those, a full collection costs about 80 ms of CPU on
the 2-core reference node (``python -m investigations.gc_pause``), and it runs on the
event loop that serves every connection of the process, whenever the objects the
connections keep have grown by a quarter.  :func:`freeze_startup`, called once a process
is warm, collects once and moves everything alive to the permanent generation
(``gc.freeze``): later collections walk only what was made since.  Nothing it froze is
ever collected, so it is called after start-up, not while serving.

A session host serving a crowd makes almost no reference cycles: what a turn makes is freed
by reference counting when the turn, or the connection's next turn, lets go of it
(docs/performance.md, "What a session host's heap holds").  Every collection still walks
the young objects, and every object a turn keeps until the connection's next turn is
promoted, so with CPython's default thresholds (700, 10, 10) a host under 256 loops paused
for a collection that found nothing about 19 times a second, for a gen-1 collection twice
a second and for a full one (30-40 ms) every eight seconds.  :data:`SERVING_THRESHOLDS` (:func:`serving`)
collects the youngest generation ten times less often: each collection walks more young
objects, but the objects a turn keeps until the next are mostly gone before a gen-1
collection could promote them, so gen-1 and full collections are rarer still.  The bound
on what waits to be collected stays a fixed number of allocations (ten times the
default's), so memory stays bounded (tests/inference/test_collector.py).

A burst of work (256 connections' first creates released at once) holds the loop for a
few hundred milliseconds, and what a first turn keeps for the connection's next turn
outlives its young collection: with the serving thresholds such a storm paused for
7.6-66 ms of collections (median 12.5), a gen-1 one (24-51 ms) in 20 storms of 50, on the
loop every first turn waits on (``python -m investigations.storm_host --no-gc-pacing``, its
``gc_ms_by_generation``); with the pacing, a median 1.9 ms, a gen-1 one in 2 of 20.  :class:`BurstPacing`, fed how late the
host's loop probe ran (:class:`actors.host.loop_watch.LoopWatch`), raises the young
threshold to :data:`BURST_YOUNG` from a probe that ran late, and puts the thresholds it
found back once :data:`QUIET_PROBES` probes in a row ran on time (a storm's loop has short
gaps between its long turns, where one probe runs on time), and collects then, on a loop
with nothing waiting, what the burst deferred: the youngest generation, or the two young
ones when the next young collection would be a gen-1 one anyway (CPython's cadence kept,
moved out of the next burst).  The bound stays a fixed count of allocations.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

# gen-0 after this many more tracked allocations than deallocations; gen-1 after this
# many gen-0 collections; a full collection after this many gen-1 ones (and only when
# what was promoted since the last is a quarter of what it walks: CPython's own rule).
SERVING_THRESHOLDS = (7000, 10, 10)
# While the loop is behind, young collections wait for this many more tracked allocations
# than deallocations (a storm keeps ~140 a first create: 256 of them, ~36 000).
BURST_YOUNG = 70_000
BUSY_LATE_S = 0.005  # a loop probe this late (beyond its timer's slack): the loop is behind
QUIET_PROBES = 3  # on time in a row: the loop has caught up (60 ms of the host's 20 ms probe)


def freeze_startup() -> int:
    """Collect, then freeze what is alive (what start-up made); returns how many objects
    are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def serving() -> tuple[int, int, int]:
    """Collect as :data:`SERVING_THRESHOLDS` says from now on; returns the thresholds it
    replaced."""
    before = gc.get_threshold()
    gc.set_threshold(*SERVING_THRESHOLDS)
    return before


class BurstPacing:
    """The collector's thresholds by the loop's lateness: the young one raised to ``young``
    from a probe that ran more than ``busy_late_s`` late, the thresholds found then put back
    once ``quiet`` probes in a row ran on time, or at :meth:`reset` (the probe stops), and
    what the burst deferred collected then (gen 0, or gens 0 and 1 when a gen-1 collection
    is due).  ``get_threshold``, ``set_threshold``, ``get_count``, ``collect``: ``gc``'s."""

    def __init__(
        self,
        young: int = BURST_YOUNG,
        busy_late_s: float = BUSY_LATE_S,
        quiet: int = QUIET_PROBES,
        get_threshold: Callable[[], tuple[int, int, int]] = gc.get_threshold,
        set_threshold: Callable[[int, int, int], None] = gc.set_threshold,
        get_count: Callable[[], tuple[int, int, int]] = gc.get_count,
        collect: Callable[[int], int] = gc.collect,
    ) -> None:
        self._young = young
        self._busy_late_s = busy_late_s
        self._quiet = quiet
        self._get = get_threshold
        self._set = set_threshold
        self._count = get_count
        self._collect = collect
        self._found: tuple[int, int, int] | None = None  # the thresholds to put back (while busy)
        self._on_time = 0  # probes on time in a row while busy
        self.bursts = 0  # times the loop was found behind

    @property
    def busy(self) -> bool:
        return self._found is not None

    def probed(self, late_s: float) -> None:
        """The loop probe ran ``late_s`` after it was due."""
        if late_s > self._busy_late_s:
            self._on_time = 0
            if self._found is None:
                found = self._found = self._get()
                self.bursts += 1
                self._set(max(found[0], self._young), found[1], found[2])
        elif self._found is not None:
            self._on_time += 1
            if self._on_time >= self._quiet:
                self.reset()

    def reset(self) -> None:
        """The thresholds found when the loop fell behind, whatever the last probe saw; what
        the burst deferred collected."""
        if self._found is not None:
            found, self._found, self._on_time = self._found, None, 0
            self._set(*found)
            self._collect(1 if self._count()[1] >= found[1] else 0)


__all__ = [
    "BURST_YOUNG",
    "BUSY_LATE_S",
    "QUIET_PROBES",
    "SERVING_THRESHOLDS",
    "BurstPacing",
    "freeze_startup",
    "serving",
]
