"""The streams kind's figures from the load runner's records (pure: records built by hand)."""

from __future__ import annotations

import pytest

from bench.kinds import streams
from bench.runner import ClientStats, LoadResult, TurnRecord

pytestmark = pytest.mark.unit


def record(
    loop: int, sent: float, ttft_ms: float, total_ms: float, tokens: int, ok: bool = True
) -> TurnRecord:
    return TurnRecord(loop, "first", sent, total_ms, None, ok, ttft_ms=ttft_ms, output_tokens=tokens)


def client(cpu_s: float, saturated: bool = False) -> ClientStats:
    return ClientStats(
        None, None, 1, cpu_s, 3.0, cpu_s / 3.0, 1.0, 2.0, saturated, "lag" if saturated else None
    )


def test_a_stream_rate_counts_the_tokens_after_the_first_over_first_delta_to_its_end():
    r = record(0, 100.0, 50.0, 2050.0, 2001)  # first delta at 100.05, the end at 102.05
    assert streams.rate(r) == pytest.approx(1000.0)
    assert streams.answered(
        [r, record(1, 100.0, 50.0, 60.0, 0), record(2, 100.0, 50.0, 2050.0, 2001, ok=False)]
    ) == [r]


def test_a_round_holds_the_slowest_the_median_the_aggregate_and_the_cores():
    recs = [record(0, 100.0, 50.0, 2050.0, 2001), record(1, 100.0, 100.0, 4100.0, 2001)]  # 1000, 500 tok/s
    recs.append(record(2, 100.0, 0.0, 10.0, 0, ok=False))
    result = LoadResult(recs, [client(0.4)], window=(100.0, 105.0), loops=3, connected=3)
    s = streams.summarise(result, {"host": 0.5})
    assert s["rate_tok_s"]["min"] == 500.0 and s["rate_tok_s"]["median"] == 750.0 and s["at_95pct"] == 1
    assert s["wall_s"] == 4.1 and s["aggregate_tok_s"] == round(4002 / 4.1, 1)
    assert s["cpu_cores"] == {"host": 0.5, "clients": round(0.4 / 4.1, 3)}
    assert s["errors"] == ["error"] and s["valid"]
    saturated = LoadResult(recs, [client(0.4, saturated=True)], window=(100.0, 105.0))
    assert not streams.summarise(saturated, {})["valid"]


def test_a_stream_workload_is_one_text_answer_without_a_tool_call():
    spec = streams.spec("http://127.0.0.1:1", 64, 2000)
    w = spec.custom_workload
    assert w is not None and w.model == streams.MODEL and w.tool_rounds == 0 and w.text_tokens == 2000
    assert spec.rollouts_per_loop == 1 and spec.loops == 64 and spec.warmup_s == 0


def test_a_stream_create_sends_no_tools_and_no_instructions():
    from bench.runner.loop import Encoder

    head = Encoder.build(streams.stream_workload(2000), "ws", False, "0").head
    assert '"tools"' not in head and '"instructions"' not in head and streams.MODEL in head
