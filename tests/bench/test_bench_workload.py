"""The agent-loop benchmark's pure parts: the workload is deterministic and realistically
sized, transports are pluggable, summaries compute what the table claims."""

from __future__ import annotations

import json

from bench import workload as wl
from bench.agentloop_report import summarise
from bench.conversation import output_as_input, server_timings
from bench.rollouts import RolloutRecord, TurnRecord, interleaved_jobs, rollout_model_s
from bench.stats import pct
from bench.transports import TRANSPORTS
from inference import tokenizer


def test_workload_is_deterministic_per_seed_and_differs_across_seeds():
    a, b = wl.Workload(seed=1), wl.Workload(seed=2)
    assert wl.instructions(3000, 1) == wl.instructions(3000, 1) != wl.instructions(3000, 2)
    assert wl.tools(a) == wl.tools(a) != wl.tools(b)
    assert wl.tool_output(a, 0, 3, 0, "shell") == wl.tool_output(a, 0, 3, 0, "shell")
    assert wl.tool_output(a, 0, 3, 0, "shell") != wl.tool_output(a, 1, 3, 0, "shell")
    assert wl.tool_time_s(a, 0, 1) == wl.tool_time_s(a, 0, 1)


def test_prompt_and_tool_outputs_have_the_configured_size_in_tokens():
    w = wl.Workload()
    system = len(tokenizer.encode(wl.instructions(w.system_tokens, w.seed)))
    tools = len(tokenizer.encode(json.dumps(wl.tools(w))))
    assert 0.8 * w.system_tokens <= system <= 1.3 * w.system_tokens
    assert system + tools >= 4000  # "several thousand tokens" before the task
    sizes = [len(tokenizer.encode(wl.tool_output(w, 0, t, 0, "read_file"))) for t in range(20)]
    assert 0.5 * w.tool_output_tokens <= sum(sizes) / len(sizes) <= 1.6 * w.tool_output_tokens


def test_metadata_shapes_the_emulated_model_per_request():
    md = wl.metadata(wl.Workload(tool_rounds=7, text_tokens=33), rollout=2)
    assert md["emulator.tool_rounds"] == "7" and md["emulator.text_tokens"] == "33"
    assert all(isinstance(v, str) for v in md.values())


def test_transports_are_registered_and_jobs_interleave():
    assert {"ws", "http-chained", "http-full"} <= set(TRANSPORTS)
    assert interleaved_jobs(["ws", "h"], 2) == [("ws", 0), ("h", 0), ("ws", 1), ("h", 1)]


def test_output_items_become_input_items_for_a_full_resend():
    out = [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "shell",
            "arguments": "{}",
            "status": "completed",
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    assert output_as_input(out) == [
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]


def test_server_timings_are_read_from_metadata_and_absent_ones_degrade_to_none():
    timings = {"render": 1.5, "api_overhead": 3.0}
    assert server_timings({"metadata": {"responses_ws.timings": json.dumps(timings)}}) == timings
    assert server_timings({"metadata": {"responses_ws.timings": "1"}}) is None  # echoed request flag
    assert server_timings({"metadata": {}}) is None
    assert server_timings({"metadata": {"responses_ws.timings": "{not json"}}) is None


def _rollout(transport: str, e2e: float, overhead: float) -> RolloutRecord:
    turns = [
        TurnRecord(
            i,
            10.0,
            20.0,
            100,
            input_tokens=1000,
            cached_tokens=500,
            output_tokens=10,
            server={"api_overhead": overhead},
        )
        for i in range(1, 4)
    ]
    return RolloutRecord(transport, 0, 2, e2e_s=e2e, turns=turns)


def test_summary_reports_gain_of_ws_over_each_other_transport():
    s = summarise(
        [_rollout("ws", 1.0, 2.0), _rollout("http-full", 2.0, 9.0), _rollout("http-chained", 1.25, 5.0)]
    )
    assert s["http-full"]["ws_gain"]["e2e_median"] == 0.5
    assert abs(s["http-chained"]["ws_gain"]["e2e_median"] - 0.2) < 1e-12
    assert "ws_gain" not in s["ws"]
    assert s["ws"]["cached_share"] == 0.5 and s["ws"]["api_overhead_ms"]["median"] == 2.0
    assert pct([1, 2, 3, 4], 0.5) == 2.5 and pct([], 0.5) is None


def test_the_floor_is_the_server_reported_model_time_plus_tool_time():
    model = {"queue": 1.0, "prefill": 30.0, "decode": 9.0, "render": 4.0, "api_overhead": 5.0}
    turns = [TurnRecord(i, 10.0, 50.0, 100, server=model) for i in range(1, 5)]
    assert rollout_model_s(turns, None) == 0.16
    assert rollout_model_s(turns[:1] + [TurnRecord(2, 10.0, 50.0, 100)], None) is None  # a turn unreported
    # append mode: the terminal response's timings cover the whole rollout
    assert rollout_model_s([TurnRecord(1, 10.0, 50.0, 100)], {"prefill": 150.0, "decode": 50.0}) == 0.2
    ws = RolloutRecord("ws", 0, 3, e2e_s=1.1, tool_s=0.84, model_s=0.16, turns=turns)
    append = RolloutRecord("append", 0, 3, e2e_s=1.05, tool_s=0.84, model_s=0.16, turns=turns)
    unreported = RolloutRecord("http-full", 0, 3, e2e_s=2.0, tool_s=0.84, turns=turns)
    s = summarise([ws, append, unreported])
    assert s["ws"]["floor_s"]["median"] == 1.0
    assert abs(s["ws"]["above_floor"]["median"] - 0.1) < 1e-12
    assert abs(s["ws"]["above_floor_ms_per_turn"]["median"] - 25.0) < 1e-9
    assert abs(s["append"]["above_floor"]["median"] - 0.05) < 1e-12
    assert s["http-full"]["above_floor"]["median"] is None and s["http-full"]["floor_s"]["n"] == 0


def test_the_overhead_benchmark_asks_only_for_policy_values_the_server_accepts():
    from bench.kinds.floor_length import META
    from inference.emulator.policy import metadata_overrides

    assert metadata_overrides(META.items())["tool_rounds"] == 10_000  # raises InvalidMetadata if not


def test_the_burst_summary_reads_each_socket_s_wait_and_the_server_s_phases():
    from investigations.burst import summary

    phases = {"parse_validate": 1.0, "render": 20.0, "classify": 3.0, "api_overhead": 25.0}
    turns = [
        {"created_ms": c, "nonmodel_ms": n, "server": {**phases, "render": r}}
        for c, n, r in [(50.0, 100.0, 10.0), (500.0, 600.0, 20.0), (900.0, 1000.0, 30.0)]
    ]
    s = summary(turns)
    assert s["created_ms"] == {"min": 50.0, "median": 500.0, "max": 900.0}
    assert s["nonmodel_ms_median"] == 600.0
    assert s["server_ms_median"] == {**phases, "render": 20.0}
