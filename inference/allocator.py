"""The C allocator's policy in this server's processes (glibc on Linux; elsewhere nothing).

A turn moves buffers of a few hundred KB (a long prompt's ids over the inference channel,
the frames that echo a coding agent's instructions and tools), which glibc would serve with
a fresh ``mmap`` and trim back each time, so every turn faulted their pages in again.
:func:`tune` raises both thresholds, so a busy process reuses them from its heap (up to
:data:`TRIM_BYTES` of freed memory); :func:`release` gives what is free back once it is
idle (docs/reliability.md, "Memory per connection").
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_BYTES = 2 * 1024 * 1024  # allocations this large or more still get their own mapping
TRIM_BYTES = 32 * 1024 * 1024  # free memory at the heap's top kept for reuse


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def tune() -> bool:
    """Apply the policy to this process; ``False`` where there is no glibc ``mallopt``."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))
    if not ok:
        log.info("the C allocator did not take the thresholds; its defaults stay")
    return ok


def release() -> None:
    """Give the memory the process freed back to the OS (glibc keeps it in its arenas: a host
    reused for connection after connection would otherwise grow by 1–2 MiB per heavy
    connection, docs/reliability.md, memory per connection)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
