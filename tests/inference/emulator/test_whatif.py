"""The what-if services' cost models, on a fake clock: exact times, no machine speed."""

from __future__ import annotations

import asyncio

import pytest

from inference.emulator.whatif import (
    Hop,
    HopConfig,
    SafetyModel,
    SafetyModelConfig,
    ServiceReply,
    WhatIfConfig,
    hop_seconds,
    parameters,
)
from tests.inference.emulator.conftest import FakeClock


def test_the_services_are_off_by_default():
    assert not WhatIfConfig().enabled
    assert parameters(WhatIfConfig()) == []


def test_a_classifier_call_costs_its_overhead_plus_its_tokens_at_the_replica_rate():
    clock = FakeClock(start=10.0)
    model = SafetyModel(SafetyModelConfig(tokens_per_s=100_000, overhead_ms=2.0), clock, clock)
    reply = asyncio.run(model.classify(5_000))
    assert reply == ServiceReply(5_000, pytest.approx(52.0), 0.0)
    assert clock.sleeps == [pytest.approx(10.052)]
    assert (model.calls, model.tokens) == (1, 5_000)


class StoppedClock:
    """Time stands still while calls arrive; sleeps are recorded, not taken."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep_until(self, t: float, precise: bool = False) -> None:
        self.sleeps.append(t)


def test_concurrent_classifier_calls_queue_first_in_first_out_on_the_accelerator():
    clock = StoppedClock()
    model = SafetyModel(SafetyModelConfig(tokens_per_s=1_000, overhead_ms=1.0), clock, clock)

    async def both():
        return await asyncio.gather(model.classify(100), model.classify(50))

    first, second = asyncio.run(both())
    assert clock.sleeps == [pytest.approx(0.101), pytest.approx(0.151)]
    assert first.ms == pytest.approx(101.0) and first.queue_ms == 0.0
    # Ready after its overhead at 1 ms, the second waits until the first is read (101 ms).
    assert second.queue_ms == pytest.approx(100.0) and second.ms == pytest.approx(151.0)


def test_an_idle_accelerator_does_not_bank_time():
    clock = FakeClock()
    model = SafetyModel(SafetyModelConfig(tokens_per_s=1_000, overhead_ms=0.0), clock, clock)
    asyncio.run(model.classify(10))
    clock.advance(5.0)
    reply = asyncio.run(model.classify(10))
    assert reply.ms == pytest.approx(10.0) and reply.queue_ms == 0.0


def test_a_hop_costs_its_latency_plus_its_bytes():
    config = HopConfig(latency_ms=0.5, per_kb_us=10.0, bytes_per_token=4.0)
    assert hop_seconds(config, 256) == pytest.approx(0.0005 + 10e-6)  # 1 KB
    clock = FakeClock()
    hop = Hop(config, clock, clock)

    async def many():
        return await asyncio.gather(*(hop.forward(256) for _ in range(3)))

    assert [r.ms for r in asyncio.run(many())] == [pytest.approx(0.51)] * 3  # no queueing
    assert (hop.calls, hop.tokens) == (3, 768)


def test_every_cost_parameter_has_a_source_or_is_marked_an_assumption():
    config = WhatIfConfig(safety_model=SafetyModelConfig(enabled=True), hop=HopConfig(enabled=True))
    rows = {r["parameter"]: r for r in parameters(config)}
    assert set(rows) == {
        "safety_model.tokens_per_s",
        "safety_model.overhead_ms",
        "safety_model.window_tokens",
        "hop.latency_ms",
        "hop.per_kb_us",
        "hop.bytes_per_token",
    }
    assert rows["safety_model.tokens_per_s"]["source"] == "assumption"
    assert rows["hop.latency_ms"]["source"] != "assumption"
    for section in (SafetyModelConfig, HopConfig):
        for name, info in section.model_fields.items():
            if name in (
                "tokens_per_s",
                "overhead_ms",
                "window_tokens",
                "latency_ms",
                "per_kb_us",
                "bytes_per_token",
            ):
                assert "[source: " in info.description or "[assumption]" in info.description, name
