"""inference.priority.prefer moves the niceness of every thread of its process by a step (Linux
applies setpriority per thread), threads started afterwards inheriting it; run in a child
process so that this one keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """
import json, os, threading
from inference.priority import prefer
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
ok = prefer({nice})
after = threading.Thread(target=stop.wait); after.start()
nice = {{t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}}
stop.set(); before.join(); after.join()
print(json.dumps({{"ok": ok, "nice": sorted(set(nice.values())), "threads": len(nice)}}))
"""


def child(nice: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(nice=nice)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_every_thread_gets_the_niceness_and_new_threads_inherit_it() -> None:
    base = child(0)
    assert base["ok"] is True and base["threads"] == 3
    raised = child(3)  # a step up from where it started; raising needs no privilege
    assert raised == {"ok": True, "nice": [min(19, int(base["nice"][0]) + 3)], "threads": 3}
