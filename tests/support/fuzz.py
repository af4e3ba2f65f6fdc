"""The hypothesis settings of the fuzz tests (the strategies are bench/fuzz_cases.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def fuzz_settings(examples: int) -> settings:
    """Deterministic (CI), no deadline, long inputs allowed."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
