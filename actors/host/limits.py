"""The process's open-file limit, raised at start as a deployment would.

Every held WebSocket is a descriptor in its session host and one in the gateway (its copy,
to close with 1011 should the host die), so a node holding tens of thousands of mostly idle
connections needs more than the usual soft limit (often 1024; 20 000 on the project's
machine).  Each server process raises its soft ``RLIMIT_NOFILE`` to
``session.open_files`` at start, and its hard limit too where it may (with
``CAP_SYS_RESOURCE``, up to the kernel's ``fs.nr_open``); otherwise up to the hard limit it
has (a container without that capability — root or not — keeps the hard limit it was given).
A deployment that sets the limit itself (``ulimit -n``, systemd's ``LimitNOFILE``, a
container's ``nofile``) and sets it higher is left alone (docs/scaling.md, "File descriptors").
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def nr_open() -> int | None:
    """The kernel's ceiling for a process's open-file limit (Linux), or ``None``."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def target(wanted: int, soft: int, hard: int, ceiling: int | None) -> tuple[int, int]:
    """The (soft, hard) limits to ask for: ``wanted`` capped by the kernel's ``ceiling``,
    never lower than what the process has."""
    want = min(wanted, ceiling) if ceiling else wanted
    return max(soft, want), max(hard, want)


# Descriptors a gateway keeps for other than held connections: Ray's own, links to its
# hosts, connections accepted and not yet admitted or refused.
RESERVED_FILES = 1024


def connection_budget(open_files: int, configured: int) -> int:
    """Connections one process can hold at its open-file limit (``configured`` at most):
    the limit less :data:`RESERVED_FILES`, never below half of it."""
    return min(configured, max(open_files - RESERVED_FILES, open_files // 2))


def raise_open_files(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted``; the soft limit it has after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new_soft, new_hard = target(wanted, soft, hard, nr_open())
    if (new_soft, new_hard) == (soft, hard):
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
    except (ValueError, OSError):  # not allowed to raise the hard limit: up to it
        if min(new_soft, hard) > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(new_soft, hard), hard))
    got = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if got < wanted:
        log.info("open-file limit %d (wanted %d; the hard limit is %d)", got, wanted, hard)
    return got
