"""What a process's busiest thread ran in a window of wall time, from a py-spy recording
(``py-spy record --idle -f speedscope``): :mod:`investigations.storm_cpu`'s ``--profile``
slices each session host's and inference replica's recording to the storm of first turns.

With ``--idle`` py-spy keeps a sample every period, busy or not, in time order, so a
sample's wall time is its place in the recording counted back from its end (``stopped``, when
py-spy was told to stop) at the rate it kept (``rate``: its samples over the recording's wall
time).  Approximate: py-spy does not keep an even rate (it samples a busy process more
slowly), so a window placed this way is off by up to a fifth of its distance from the end;
widen it (``storm_cpu --margin``) and look at its busy share.  A sample whose innermost frame
is a thread's wait in C (:data:`IDLE_LEAVES`) is idle.  Of the busy samples in the window: each
function's inclusive share (once a sample, however often it is on the stack) and its own
(innermost frame).  Pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

# Innermost Python frames of a thread that waits in C (py-spy names a method with its class):
# a Ray worker's main thread, the thread that runs its actor's event loop (uvloop's loop is C:
# idle, the stack ends at the thread's ``run``), condition waits, a pool's idle workers.
IDLE_LEAVES = frozenset(
    {"Thread.run", "Worker.main_loop", "Condition.wait", "Event.wait", "_worker", "Thread._bootstrap_inner",
     "EpollSelector.select", "BaseEventLoop.run_forever", "Thread._wait_for_tstate_lock", "sleep"}
)  # fmt: skip


def frame_label(frame: Mapping[str, Any]) -> str:
    """``name (file.py)``: a function by its name and its file's last part."""
    file = str(frame.get("file", "")).rsplit("/", 1)[-1]
    return f"{frame.get('name', '?')} ({file})" if file else str(frame.get("name", "?"))


def window_samples(
    profile: Mapping[str, Any], stopped: float, rate: float, a: float, b: float
) -> list[Sequence[int]]:
    """The samples of one thread's speedscope ``profile`` (``rate`` a second, its last at
    wall time ``stopped``) that fall in ``[a, b]``."""
    samples = profile["samples"]
    last = len(samples) - 1  # sample k was taken at stopped - (last - k) / rate
    lo = max(0, last - math.floor((stopped - a) * rate + 1e-6))
    hi = min(last + 1, max(0, last + 1 - math.ceil((stopped - b) * rate - 1e-6)))
    return samples[lo:hi]


def summary(
    speedscope: Mapping[str, Any], stopped: float, rate: float, a: float, b: float, top: int = 30
) -> dict[str, Any]:
    """The busiest thread's samples in ``[a, b]``: how many, how many busy, and the ``top``
    functions by inclusive and by own share of the busy ones (percent)."""
    frames = speedscope["shared"]["frames"]
    labels = [frame_label(f) for f in frames]
    idle = {i for i, f in enumerate(frames) if f.get("name") in IDLE_LEAVES}
    best: dict[str, Any] = {"thread": None, "samples": 0, "busy": 0, "inclusive": {}, "own": {}}
    for profile in speedscope["profiles"]:
        window = window_samples(profile, stopped, rate, a, b)
        busy = [s for s in window if s and s[-1] not in idle]
        if len(busy) <= best["busy"]:
            continue
        inclusive: Counter[str] = Counter()
        own: Counter[str] = Counter()
        for stack in busy:
            inclusive.update({labels[i] for i in stack})
            own[labels[stack[-1]]] += 1
        n = len(busy)
        best = {
            "thread": profile.get("name"),
            "samples": len(window),
            "busy": n,
            "inclusive": {k: round(100 * v / n, 1) for k, v in inclusive.most_common(top)},
            "own": {k: round(100 * v / n, 1) for k, v in own.most_common(top)},
        }
    return best
