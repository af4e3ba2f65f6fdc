"""A latency-bound process's claim on a core: its scheduling niceness, set for every thread.

On a node whose cores are shared (Ray's own processes, the load's clients, other tenants),
a turn's slowest moments are the session host's and the inference replica's event loops
runnable and waiting for a core behind other work (docs/capacity.md, "The steady tail").
:func:`prefer` lowers the niceness of each of this process's threads (Linux applies
``setpriority`` per thread; threads started afterwards inherit it from the one that starts
them), so the scheduler gives them a larger share when the cores are contended and has
them preempt less urgent work sooner.  It never touches another process.  Lowering niceness
below 0 needs ``CAP_SYS_NICE`` (root, or a raised ``RLIMIT_NICE``); without it the process
keeps its niceness and logs it (INFO: an unprivileged node is an ordinary set-up).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def prefer(nice: int) -> bool:
    """Set this process's threads' niceness to ``nice`` (0: leave it); ``True`` when every
    thread has it."""
    if nice == 0 or not hasattr(os, "setpriority"):
        return nice == 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            log.info(
                "niceness %d not allowed here (needs CAP_SYS_NICE): keeping %d",
                nice,
                os.getpriority(os.PRIO_PROCESS, 0),
            )
            return False
    return True
