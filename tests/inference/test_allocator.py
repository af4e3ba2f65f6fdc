"""The C allocator's policy (inference.allocator) on this machine's glibc: it is taken, and
a process tuned by it still gives its free memory back when told."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_thresholds_are_taken_and_an_idle_process_still_returns_what_it_freed() -> None:
    # In a process of its own: the policy is process-wide.
    script = """
import resource, sys
from inference import allocator
assert allocator.tune()
def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024
before = rss_kib()
blocks = [bytearray(b"x" * 300_000) for _ in range(60)]  # ~18 MB, each under MMAP_BYTES
del blocks
kept = rss_kib() - before  # freed, but kept in the heap for reuse (under TRIM_BYTES)
allocator.release()
given_back = rss_kib() - before
print(kept, given_back)
assert kept > 10_000 and given_back < kept / 2, (kept, given_back)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
