"""freeze_startup: what a process holds once started moves to the permanent generation, so
a full collection afterwards walks only what was made since (run in a child process: a
freeze cannot be undone in this one)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
import actors.core.session  # what a session host holds once started, in part
from inference.collector import freeze_startup
tracked = len(gc.get_objects())
frozen = freeze_startup()
later = [[i] for i in range(1000)]  # made after the freeze: collected as usual
print(json.dumps({"tracked": tracked, "frozen": frozen, "after": len(gc.get_objects()),
                  "count": gc.get_freeze_count()}))
"""


def test_the_start_up_objects_are_frozen_and_later_ones_are_not():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout)
    assert figures["frozen"] == figures["count"] > 10_000
    assert figures["frozen"] >= figures["tracked"] * 0.9  # little of it was garbage
    assert 1000 <= figures["after"] < figures["frozen"] / 5  # the walk sees what came later
