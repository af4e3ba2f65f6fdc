"""A latency-bound process's claim on a core: its scheduling niceness, set for every thread.

On a node whose cores are shared (Ray's own processes, the load's clients, other tenants),
a turn's slowest moments are the session host's and the inference replica's event loops
runnable and waiting for a core behind other work (docs/steady-tail.md).
:func:`prefer` lowers the niceness of each of this process's threads by a step (Linux applies
``setpriority`` per thread; threads started afterwards inherit it from the one that starts
them), so the scheduler gives them a larger share when the cores are contended and has
them preempt less urgent work sooner.  It never touches another process.  Lowering
niceness needs ``CAP_SYS_NICE`` (root, or room under ``RLIMIT_NICE``); without it the
process keeps its niceness and logs it (INFO: an unprivileged node is an ordinary set-up).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def prefer(nice: int) -> bool:
    """Add ``nice`` to each of this process's threads' niceness (as ``nice -n`` does: a
    process started at 15 by its operator goes to 10 with -5, not to -5), clamped to
    -20..19; 0 leaves it.  ``True`` when every thread has it."""
    if nice == 0 or not hasattr(os, "setpriority"):
        return nice == 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, now + nice)))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            log.info("niceness %+d not allowed here (needs CAP_SYS_NICE): keeping %d", nice, now)
            return False
    return True
