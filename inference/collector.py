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
"""

from __future__ import annotations

import gc

# gen-0 after this many more tracked allocations than deallocations; gen-1 after this
# many gen-0 collections; a full collection after this many gen-1 ones (and only when
# what was promoted since the last is a quarter of what it walks: CPython's own rule).
SERVING_THRESHOLDS = (7000, 10, 10)


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


__all__ = ["SERVING_THRESHOLDS", "freeze_startup", "serving"]
