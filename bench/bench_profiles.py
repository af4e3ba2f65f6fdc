"""The bench-only model profiles the benchmarks add next to the shipped ones (all with zero
jitter; the shipped ``emu-fast`` lends them its prefill and stream shape):

* ``bench-zero``: no prefill overhead, effectively instant decode (a turn is all server);
* ``bench-1k``: 1000 tok/s, no burst, the shipped emu-fast batching (knee 16, +0.5 %/seq);
* ``bench-4k``: 4000 tok/s with no burst phase (a burst held for a whole response);
* ``bench-flat``: the *ideal hardware*: like bench-1k but a batch that never slows (knee 64,
  no growth), so 64 × 1000 tok/s asks the machine for 64k tok/s.
"""

from __future__ import annotations

from inference.emulator.profiles import InferenceConfig, load_inference_config


def bench_inference_config(replicas: int | None = None) -> InferenceConfig:
    """The shipped inference config plus the bench profiles (``replicas`` if given)."""
    base = load_inference_config().model_dump()
    fast = next(p for p in base["profiles"] if p["id"] == "emu-fast")
    common = {
        k: fast[k] for k in ("prefill_tokens_per_s", "prefill_overhead_ms", "chunk_ms", "min_chunk_tokens")
    }
    base["profiles"] += [
        {
            "id": "bench-zero",
            "decode_tokens_per_s": 1e9,
            "prefill_tokens_per_s": 1e12,
            "prefill_overhead_ms": 0,
        },
        {**common, "id": "bench-1k", "decode_tokens_per_s": 1000, "batching": fast["batching"]},
        {**common, "id": "bench-4k", "decode_tokens_per_s": 4000, "batching": fast["batching"]},
        {
            **common,
            "id": "bench-flat",
            "decode_tokens_per_s": 1000,
            "batching": {**fast["batching"], "knee": 64, "itl_growth_per_seq": 0.0},
        },
    ]
    if replicas is not None:
        base["replicas"] = replicas
    return InferenceConfig.model_validate(base)
