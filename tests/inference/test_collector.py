"""freeze_startup: what a process holds once started moves to the permanent generation, so
a full collection afterwards walks only what was made since (run in a child process: a
freeze cannot be undone in this one).  serving: the session host's thresholds still collect
every cycle, and keep the heap bounded (in a child process too: the heap it counts is the
crowd's alone).  BurstPacing: the burst thresholds from a late probe
until enough on-time probes in a row, the serving ones after a reset."""

from __future__ import annotations

import json
import subprocess
import sys

from inference.collector import BURST_YOUNG, QUIET_PROBES, SERVING_THRESHOLDS, BurstPacing

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


# A crowd's turns in a process of its own: the heap it counts (gc.get_objects()) and the
# collections its allocations trigger are its own, not those of another thread of the test
# process (the loopback sweep's, tests/conftest.py, runs beside the unit tests).
CROWD = """
import gc, json
from inference.collector import SERVING_THRESHOLDS, serving
connections, turns = 256, 60_000
collected = [0, 0, 0]

def count(phase, info):
    if phase == "stop":
        collected[info["generation"]] += info["collected"]

serving()
gc.callbacks.append(count)
thresholds = gc.get_threshold()
gc.collect()
baseline = len(gc.get_objects())
states = [None] * connections
peaks = []
for t in range(turns):
    state = {"items": [[t], [t + 1]], "marks": (t,)}
    state["self"] = state  # a cycle: freed only by a collection
    states[t % connections] = state
    if t % 5_000 == 4_999:
        peaks.append(len(gc.get_objects()) - baseline)
states.clear()
gc.collect()
after = len(gc.get_objects()) - baseline
print(json.dumps({"thresholds": thresholds, "serving": SERVING_THRESHOLDS, "turns": turns,
                  "peaks": peaks, "collected": collected, "after": after}))
"""


def test_serving_thresholds_keep_the_heap_bounded_and_cycles_collected():
    """A crowd's turns, each replacing its connection's state with a new one that holds a
    reference cycle (so only the collector frees the old one): under the serving thresholds
    every cycle is still collected, and the heap, counted, stops growing."""
    out = subprocess.run([sys.executable, "-c", CROWD], capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout)
    assert figures["thresholds"] == figures["serving"] == list(SERVING_THRESHOLDS)
    peaks, collected = figures["peaks"], figures["collected"]
    made = figures["turns"] * 4  # tracked objects: the dict, its list and the list's two lists
    first, second = peaks[: len(peaks) // 2], peaks[len(peaks) // 2 :]
    assert max(second) <= max(first) * 1.5, peaks  # no growth with the number of turns
    assert max(peaks) < made / 4, peaks  # most of what was made was freed while the crowd ran
    assert collected[1] + collected[2] > 0  # cycles that outlived a gen-0 collection too
    assert figures["after"] < 1000


def test_burst_pacing_holds_young_collections_from_a_late_probe_until_the_loop_is_quiet():
    now = [SERVING_THRESHOLDS]
    set_to: list[tuple[int, int, int]] = []

    def set_threshold(*t: int) -> None:
        set_to.append(t)
        now[0] = t

    collected: list[int] = []
    count = [(60_000, 3, 0)]  # young objects the burst deferred; three young collections since a gen-1
    pacing = BurstPacing(
        young=50_000,
        busy_late_s=0.005,
        quiet=3,
        get_threshold=lambda: now[0],
        set_threshold=set_threshold,
        get_count=lambda: count[0],
        collect=lambda generation: collected.append(generation) or 0,
    )
    burst = (50_000, *SERVING_THRESHOLDS[1:])
    pacing.probed(0.001)
    assert set_to == [] and not pacing.busy  # on time: the thresholds stay
    pacing.probed(0.050)
    assert set_to == [burst] and pacing.busy
    for late in (0.0, 0.0, 0.020, 0.0, 0.0):  # a gap in the storm: one late probe starts the count again
        pacing.probed(late)
    assert set_to == [burst] and pacing.busy and collected == []
    pacing.probed(0.0)
    assert set_to == [burst, SERVING_THRESHOLDS] and not pacing.busy
    assert collected == [0]  # what the burst deferred, on a quiet loop
    pacing.probed(0.030)
    count[0] = (60_000, 10, 0)  # the next young collection would be a gen-1 one: both now
    pacing.reset()  # the probe stopped (no WebSocket open): the thresholds found again
    pacing.reset()
    assert set_to == [burst, SERVING_THRESHOLDS] * 2
    assert pacing.bursts == 2 and collected == [0, 1]
    now[0] = (100_000, 5, 5)  # already higher than young: only put back as found
    pacing.probed(0.030)
    pacing.reset()
    assert set_to[-2:] == [(100_000, 5, 5)] * 2


def test_the_default_young_threshold_while_behind_is_bounded():
    assert QUIET_PROBES >= 2
    assert SERVING_THRESHOLDS[0] < BURST_YOUNG <= 20 * SERVING_THRESHOLDS[0]
