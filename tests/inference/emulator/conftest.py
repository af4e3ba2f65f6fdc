"""Fixtures for the inference tests: a fake clock and small, explicit configs.

Tests build their own profiles rather than reading ``inference/emulator/models.yaml`` so that tuning
the shipped numbers never changes what a test asserts.
"""

from __future__ import annotations

import pytest

from inference.emulator.profiles import InferenceConfig, ModelProfile, PolicyConfig


class FakeClock:
    """Clock and sleeper in one: ``sleep_until(t)`` jumps time to ``t`` and records it."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float, precise: bool = False) -> None:
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


class SimClock:
    """A discrete-event clock for several concurrent streams: ``sleep_until`` parks the
    caller; whenever every task is parked, time jumps to the earliest wake-up.  Times are
    exact and independent of the machine's speed."""

    def __init__(self, start: float = 0.0) -> None:
        import heapq
        import itertools

        self.t = start
        self._heap: list = []
        self._push = heapq.heappush
        self._pop = heapq.heappop
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float, precise: bool = False) -> None:
        import asyncio

        if t <= self.t:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        self._push(self._heap, (t, next(self._seq), fut))
        await fut

    def run(self, main):
        """Run coroutine ``main`` to completion under simulated time."""
        import asyncio

        async def driver(task):
            loop = asyncio.get_running_loop()
            while not task.done():
                await asyncio.sleep(0)
                if loop._ready:  # someone can still run at this instant
                    continue
                while self._heap and self._heap[0][2].cancelled():
                    self._pop(self._heap)
                if not self._heap:
                    continue
                t, _, fut = self._pop(self._heap)
                self.t = max(self.t, t)
                fut.set_result(None)

        async def outer():
            task = asyncio.ensure_future(main)
            await driver(task)
            return task.result()

        return asyncio.run(outer())


@pytest.fixture
def sim() -> SimClock:
    return SimClock()
