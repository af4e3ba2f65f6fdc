"""bench floor: the workload it sends, the reference server, the summary."""

from __future__ import annotations

import argparse
import json

from bench.kinds import floor


def args(**over) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    floor.add_arguments(p)
    ns = p.parse_args(["--turns", "3"])
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


def test_the_workload_resends_instructions_and_twenty_distinct_tools():
    fixed, outputs = floor.creates_for(args())
    names = [t["name"] for t in fixed["tools"]]
    assert len(names) == 20 == len(set(names))
    assert len(fixed["instructions"].split()) == 8000
    assert fixed["store"] is False and fixed["metadata"][floor.TIMINGS_KEY] == "1"
    assert len(outputs) == 3 and all(outputs)


def test_the_reference_answers_each_create_with_that_turns_frames():
    frames = [
        [json.dumps({"type": "response.created", "n": i}), json.dumps({"type": "response.completed", "n": i})]
        for i in range(3)
    ]
    run = floor.Run(
        "deflate",
        [
            floor.Turn(json.dumps({"type": "response.create", "i": i}), f, 1.0, 0.5)
            for i, f in enumerate(frames)
        ],
    )
    laps, _ = floor.reference_laps(run)
    assert len(laps) == 3 and all(lap > 0 for lap in laps)


def test_the_summary_subtracts_the_model_and_divides_by_the_reference():
    turns = [
        floor.Turn("{}", ["a", "bb"], total_ms=10.0 + i, model_ms=6.0, api_overhead_ms=1.0) for i in range(5)
    ]
    s = floor.summarise(floor.Run("plain", turns, cpu_ms=50.0), [2.0] * 5, 20.0, skip=1)
    assert s["turns"] == 4
    assert s["server_nonmodel_ms"] == 6.5  # median of 5, 6, 7, 8 after the skipped turn
    assert s["ratio"] == 3.25 and s["client_minus_server_ms"] == 5.5
    assert s["frames_per_turn"] == 2 and s["bytes_per_turn"] == 3
    assert s["server_cpu_ms_per_turn"] == 10.0 and s["reference_cpu_ms_per_turn"] == 4.0  # over all 5 turns
