"""``bench fidelity``'s fit of the real engine's timing (pure): each turn's fastest sample
over the runs, TTFT = overhead + uncached / rate."""

from __future__ import annotations

from bench.kinds.fidelity import fit_timing, summary


def turn(i: int, uncached: int, ttft_ms: float, decode: float) -> dict:
    return {
        "turn": i,
        "input_tokens": 1000 + uncached,
        "cached_tokens": 1000,
        "output_tokens": 8,
        "ttft_ms": ttft_ms,
        "total_ms": ttft_ms + 7000 / decode,
        "decode_tok_s": decode,
    }


def test_the_fit_takes_each_turns_fastest_sample():
    quiet = [
        turn(i, u, 100 + u / 2, 20.0) for i, u in enumerate((1200, 60, 80, 40), 1)
    ]  # 100 ms + 2000 tok/s
    loaded = [{**t, "ttft_ms": t["ttft_ms"] * 5, "decode_tok_s": 4.0} for t in quiet]
    fitted = fit_timing([loaded, quiet, loaded])
    assert fitted == {
        "prefill_overhead_ms": 100.0,
        "prefill_tokens_per_s": 2000.0,
        "decode_tokens_per_s": 20.0,
    }
    rows = summary([loaded, quiet, loaded])
    assert [r["turn"] for r in rows] == [1, 2, 3, 4] and rows[0]["ttft_ms"] == loaded[0][
        "ttft_ms"
    ]  # the median
