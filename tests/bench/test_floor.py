"""bench floor: the workload it sends, the reference server, the summary."""

from __future__ import annotations

import argparse
import json

from bench import floor_budgets
from bench import floor_report as report
from bench.floor_budgets import rounds_spread
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
    run = report.Run(
        "deflate",
        [
            report.Turn(json.dumps({"type": "response.create", "i": i}), f, 1.0, 0.5)
            for i, f in enumerate(frames)
        ],
    )
    laps, _ = floor.reference_laps(run)
    assert len(laps) == 3 and all(lap > 0 for lap in laps)


def test_the_summary_subtracts_the_model_and_divides_by_the_reference():
    turns = [
        report.Turn("{}", ["a", "bb"], total_ms=10.0 + i, model_ms=6.0, api_overhead_ms=1.0) for i in range(5)
    ]
    s = report.summarise(report.Run("plain", turns, cpu_ms=50.0), [2.0] * 5, 20.0, skip=1)
    assert s["turns"] == 4
    assert s["server_nonmodel_ms"] == 6.5  # median of 5, 6, 7, 8 after the skipped turn
    assert s["ratio"] == 3.25 and s["client_minus_server_ms"] == 5.5
    assert s["frames_per_turn"] == 2 and s["bytes_per_turn"] == 3
    assert s["server_cpu_ms_per_turn"] == 10.0 and s["reference_cpu_ms_per_turn"] == 4.0  # over all 5 turns


def test_the_spread_is_the_median_quartiles_and_extremes():
    s = rounds_spread([4.0, 1.0, 3.0, 2.0, 5.0, None])
    assert s == {"median": 3.0, "p25": 2.0, "p75": 4.0, "min": 1.0, "max": 5.0, "n": 5}
    assert rounds_spread([]) is None


def test_cpu_per_turn_adds_the_api_tier_and_ray_background():
    cpu = {"gateway": 10.0, "session_host": 70.0, "inference": 40.0, "ray": 30.0}
    out = report.cpu_per_turn(cpu, 10, {"ray": 2.0}, wall_s=5.0)
    assert out["gateway"] == 1.0 and out["session_host"] == 7.0
    assert out["api_tier"] == 8.0 and out["all"] == 15.0
    assert out["ray_background"] == 1.0  # 2 ms/s over 5 s, across 10 turns
    assert report.cpu_per_turn({}, 10, {}, 1.0) == {}


def test_a_round_with_cpu_by_role_reports_the_api_tier_against_the_reference():
    turns = [report.Turn("{}", ["a"], total_ms=10.0, model_ms=6.0, api_overhead_ms=1.0) for _ in range(4)]
    cpu = {"gateway": 4.0, "session_host": 36.0, "inference": 8.0, "ray": 12.0}
    s = report.summarise(report.Run("plain", turns), [2.0] * 4, 16.0, 0, cpu_ms=cpu, wall_s=1.0)
    assert s["cpu_ms_per_turn"]["api_tier"] == 10.0 and s["server_cpu_ms_per_turn"] == 15.0
    assert s["reference_cpu_ms_per_turn"] == 4.0 and s["api_tier_cpu_ratio"] == 2.5


def test_over_rounds_spreads_each_rounds_medians():
    rounds = [
        {
            "server_nonmodel_ms": x,
            "reference_ms": 2.0,
            "ratio": x / 2,
            "cpu_ms_per_turn": {"api_tier": x},
            "server_phases_ms": {"render": 0.5},
        }
        for x in (3.0, 5.0, 4.0)
    ]
    s = report.over_rounds(rounds)
    assert s["rounds"] == 3
    assert s["server_nonmodel_ms"]["median"] == 4.0 and s["server_nonmodel_ms"]["min"] == 3.0
    assert s["ratio"]["median"] == 2.0 and s["cpu_ms_per_turn"]["api_tier"]["max"] == 5.0
    assert s["server_phases_ms"]["render"]["median"] == 0.5
    assert s["api_tier_cpu_ratio"] is None  # no round had CPU by role


def test_a_create_chains_the_previous_calls_output():
    fixed = {"model": "m"}
    first = json.loads(floor.build_create(fixed, "out", None))
    assert first["input"].startswith("The test suite") and "previous_response_id" not in first
    prev = {"id": "resp_1", "output": [{"type": "function_call", "call_id": "call_9"}]}
    nxt = json.loads(floor.build_create(fixed, "out", prev))
    assert nxt["previous_response_id"] == "resp_1"
    assert nxt["input"] == [{"type": "function_call_output", "call_id": "call_9", "output": "out"}]


def test_the_client_costs_parse_the_same_frames_raw_and_with_the_sdk():
    frames = [
        json.dumps(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "hi",
                "sequence_number": 1,
                "logprobs": [],
            }
        )
    ]
    run = report.Run(
        "plain", [report.Turn(json.dumps({"type": "response.create", "model": "m"}), frames, 1.0)]
    )
    costs = report.client_costs(run, skip=0, repeat=1)
    assert set(costs) == {"raw_parse_ms", "sdk_parse_ms", "raw_encode_ms", "sdk_encode_ms"}
    assert all(v >= 0 for v in costs.values())


def test_each_budget_is_judged_on_its_median_over_rounds():
    summary = {
        "cpu_ms_per_turn": {
            "all": rounds_spread([5.0, 7.0, 5.5]),
            "inference": rounds_spread([1.6, 1.7, 1.8]),
        },
        "api_tier_cpu_ratio": rounds_spread([1.2, 1.4, 1.3]),
        "api_tier_cpu_ratio_block": rounds_spread([1.6, 1.7]),
        "background_cpu_ms_per_s": {"gateway": 10.0, "ray": 45.0},
    }
    rows = {r["role"]: r for r in floor_budgets.budgets(summary)}
    assert [r["role"] for r in rows.values()] == [b[0] for b in floor_budgets.BUDGETS]
    assert rows["all server processes"]["met"] is True  # median 5.5, though a round took 7.0
    assert rows["emulator replica"]["met"] is False and rows["emulator replica"]["measured"]["min"] == 1.6
    assert rows["API tier (gateway + host) / reference, interleaved"]["met"] is True
    assert rows["API tier (gateway + host) / reference, in a block"]["met"] is False
    assert rows["idle server, every process"]["measured"]["median"] == 55.0


def test_a_budget_without_a_measurement_is_neither_met_nor_missed():
    rows = floor_budgets.budgets({})
    assert all(r["measured"] is None and r["met"] is None for r in rows)
