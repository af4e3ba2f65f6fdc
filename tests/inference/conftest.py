"""Fixtures for the inference tests: a fake clock and small, explicit configs.

Tests build their own profiles rather than reading ``configs/models.yaml`` so that tuning
the shipped numbers never changes what a test asserts.
"""

from __future__ import annotations

import pytest

from inference.profiles import InferenceConfig, ModelProfile, PolicyConfig


class FakeClock:
    """Clock and sleeper in one: ``sleep_until(t)`` jumps time to ``t`` and records it."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float) -> None:
        self.sleeps.append(t)
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


def profile(**overrides: object) -> ModelProfile:
    """A 1000 tok/s profile without burst; override any field."""
    fields: dict[str, object] = {
        "id": "emu-test",
        "decode_tokens_per_s": 1000.0,
        "prefill_tokens_per_s": 10_000.0,
        "prefill_overhead_ms": 10.0,
    }
    fields.update(overrides)
    return ModelProfile.model_validate(fields)


def config(*profiles: ModelProfile, **overrides: object) -> InferenceConfig:
    profiles = profiles or (profile(),)
    fields: dict[str, object] = {
        "profiles": list(profiles),
        "policy": PolicyConfig(tool_rounds=2, text_tokens=40, seed=7),
        "default_model": profiles[0].id,
    }
    fields.update(overrides)
    return InferenceConfig.model_validate(fields)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_profile():
    return profile


@pytest.fixture
def make_config():
    return config
