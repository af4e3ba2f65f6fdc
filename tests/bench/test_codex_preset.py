"""The codex workload preset and the time breakdown of ``responses-ws demo`` / ``bench``:
sizes follow the published statistics they were fitted to, rollouts are deterministic, a
rollout's parts add up to its end-to-end time, and the text fits a narrow terminal."""

from __future__ import annotations

import random

import pytest

from bench import breakdown, sweeps
from bench import workload as wl
from bench.rollouts import RolloutRecord, TurnRecord
from inference import tokenizer
from inference.emulator.profiles import load_inference_config

CODEX = wl.PRESETS["codex"]


def quantiles(draws: list[float]) -> tuple[float, float]:
    s = sorted(draws)
    return s[len(s) // 2], s[int(len(s) * 0.9)]


@pytest.mark.parametrize(
    "dist",
    [wl.CODEX.tool_output_tokens, wl.CODEX.step_output_tokens, wl.CODEX.tool_time_ms, wl.CODEX.tool_rounds],
)
def test_lognormal_draws_have_the_published_median_and_p90(dist):
    rng = random.Random(1)
    median, p90 = quantiles([dist.draw(rng) for _ in range(20_000)])
    assert median == pytest.approx(dist.median, rel=0.05)
    assert p90 == pytest.approx(min(dist.p90, dist.cap), rel=0.06)
    assert all(dist.low <= dist.draw(rng) <= dist.cap for _ in range(2000))


def test_tool_outputs_follow_the_distribution_and_stop_at_codexs_truncation():
    sizes = [
        len(tokenizer.encode(wl.tool_output(CODEX, r, t, 0, "shell"))) for r in range(6) for t in range(20)
    ]
    median, _ = quantiles(sizes)
    assert 0.6 * 886 <= median <= 1.5 * 886
    assert max(sizes) <= 1.15 * 10_000  # the 10k cap, in tokens (the filler is ~7 tokens a line)


def test_a_codex_rollout_is_deterministic_and_rollouts_differ():
    assert wl.rounds(CODEX, 3) == wl.rounds(CODEX, 3)
    assert len({wl.rounds(CODEX, r) for r in range(20)}) > 3
    assert wl.metadata(CODEX, 2) == wl.metadata(CODEX, 2) != wl.metadata(CODEX, 3)
    assert wl.history(CODEX, 0) == wl.history(CODEX, 0) != wl.history(CODEX, 1)
    assert wl.tool_time_s(CODEX, 0, 2) == wl.tool_time_s(CODEX, 0, 2)


def test_the_resumed_history_has_about_the_asked_size_and_counts_in_tool_rounds():
    w = CODEX
    items = wl.history(w, 0)
    text = [i.get("output") or i.get("arguments") or i["content"][0]["text"] for i in items]
    tokens = sum(len(tokenizer.encode(t)) for t in text)
    assert 0.85 * w.resume_tokens <= tokens <= 1.15 * w.resume_tokens
    outputs = sum(1 for i in items if i.get("type") == "function_call_output")
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    assert calls == {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    md = wl.metadata(w, 0)
    # the model calls tools until the context holds the history's results plus this rollout's rounds
    assert int(md["emulator.tool_rounds"]) == outputs + wl.rounds(w, 0)
    # every step reasons for a length whose median and p90 make the step's output the published one
    assert int(md["emulator.reasoning_tokens"]) + w.shape.call_tokens == 184
    assert int(md["emulator.reasoning_tokens_p90"]) + w.shape.call_tokens == 939
    assert wl.history(wl.Workload(), 0) == []


def turn(i: int, total: float, prefill: float, decode: float, tool: float, context: int = 1000) -> TurnRecord:
    return TurnRecord(
        i,
        1.0,
        total,
        100,
        input_tokens=context,
        tool_ms=tool,
        server={"queue": 1.0, "prefill": prefill - 1.0, "decode": decode, "api_overhead": 3.0},
    )


def rollout(transport: str, r: int, api: float) -> RolloutRecord:
    turns = [turn(1, 60 + api, 20, 40, 100), turn(2, 80 + api, 30, 50, 0.0, 2000)]
    e2e = sum(t.total_ms + t.tool_ms for t in turns) / 1000 + 0.005  # + connecting
    return RolloutRecord(transport, r, 1, e2e_s=e2e, tool_s=0.1, turns=turns)


def test_a_rollouts_parts_add_up_to_its_end_to_end_time_and_transports_compare_on_the_same_rollouts():
    records = [rollout("ws", r, 2.0) for r in range(3)] + [rollout("http-full", r, 20.0) for r in range(3)]
    records.append(RolloutRecord("http-full", 3, 1, error="boom"))
    records.append(rollout("ws", 3, 2.0))  # no http-full counterpart: left out of the comparison
    cmp = breakdown.compare(records, ["ws", "http-full"])
    assert cmp["rollouts"] == 3
    ws, full = cmp["transports"]["ws"], cmp["transports"]["http-full"]
    for s, api in ((ws, 2.0), (full, 20.0)):
        assert sum(s["total_ms"].values()) == pytest.approx(s["e2e_s"] * 1000)
        assert s["total_ms"]["tool"] == pytest.approx(300)
        assert s["total_ms"]["prefill"] == pytest.approx(3 * 50)
        assert s["total_ms"]["api"] == pytest.approx(3 * (2 * api + 5))
        assert s["above_floor"] == pytest.approx(s["total_ms"]["api"] / (300 + 150 + 270))
    assert full["gain_of_ws"]["e2e"] == pytest.approx(1 - ws["e2e_s"] / full["e2e_s"])
    assert full["gain_of_ws"]["without_tools"] > full["gain_of_ws"]["e2e"] > 0


def test_a_transport_without_per_turn_timings_is_left_out_not_the_rollouts():
    records = [
        rollout("ws", 0, 2.0),
        rollout("http-full", 0, 20.0),
        RolloutRecord("append", 0, 1, e2e_s=0.3, turns=[TurnRecord(1, 1.0, 50.0, 10)]),
    ]
    cmp = breakdown.compare(records, ["ws", "append", "http-full"])
    assert cmp["rollouts"] == 1 and list(cmp["transports"]) == ["ws", "http-full"]


def test_the_demo_text_fits_80_columns():
    records = [rollout("ws", 0, 2.0), rollout("http-full", 0, 20.0)]
    cmp = breakdown.compare(records, ["ws", "http-full"])
    rows = breakdown.turn_rows(records, 0, ["ws", "http-full"])
    lines = breakdown.render_turns(rows, ["ws", "http-full"], 0) + breakdown.render_summary(cmp)
    assert max(map(len, lines)) <= 80
    assert any("ws faster than http-full by" in line for line in lines)


def test_speed_profiles_scale_every_rate_alike():
    config = load_inference_config()
    fast = config.profile("emu-fast")
    scaled = sweeps.with_speeds(config, "emu-fast", [65, 4000]).profile("emu-speed-65")
    f = 65 / fast.decode_tokens_per_s
    assert scaled.decode_tokens_per_s == pytest.approx(65)
    assert scaled.prefill_tokens_per_s == pytest.approx(fast.prefill_tokens_per_s * f)
    assert scaled.burst_tokens_per_s == pytest.approx(fast.burst_tokens_per_s * f)
    assert scaled.prefill_overhead_ms == fast.prefill_overhead_ms


def test_a_sweep_runs_every_point_and_compares_the_transports_at_each():
    labels = []

    def run(w, label):
        labels.append((label, w.resume_tokens))
        api = w.resume_tokens / 1000  # HTTP's overhead grows with the context here
        return [rollout("ws", 0, 2.0), rollout("http-full", 0, 2.0 + api)]

    points = sweeps.run_points(sweeps.context_points(CODEX, [10_000, 100_000]), ["ws", "http-full"], run)
    assert labels == [("10000", 10_000), ("100000", 100_000)]
    gains = [p["comparison"]["transports"]["http-full"]["gain_of_ws"]["e2e"] for p in points]
    assert 0 < gains[0] < gains[1]
    assert [w.model for _, w in sweeps.speed_points(CODEX, [65])] == ["emu-speed-65"]
