"""Seeded lognormal jitter with mean 1.

A factor ``X = exp(sigma * Z - sigma**2 / 2)`` with ``Z ~ N(0, 1)`` has ``E[X] = 1`` for
every ``sigma``, so jitter varies a request's timing without changing the profile's mean
rates.  ``sigma == 0`` gives exactly 1.0 (zero-jitter mode).

Each request gets its own RNG, seeded by the profile's jitter seed and a stable digest of
the request id (never Python's salted ``hash()``), so its factors are the same on any
replica and whatever else runs concurrently.
"""

from __future__ import annotations

import math
import random
from hashlib import blake2b

from inference.emulator.profiles import JitterConfig


def lognormal_mean_one(rng: random.Random, sigma: float) -> float:
    """One factor with mean 1; exactly 1.0 when ``sigma == 0`` (the RNG is not touched)."""
    if sigma == 0:
        return 1.0
    return math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2.0)


class RequestJitter:
    """The jitter factors of one request: ``request`` (one number) and ``token(i)``."""

    def __init__(self, config: JitterConfig, request_id: str) -> None:
        self._token_sigma = config.token_sigma
        if config.request_sigma == 0 and config.token_sigma == 0:  # zero-jitter mode: no RNG to seed
            self.request = 1.0
            return
        digest = blake2b(request_id.encode(), digest_size=8, person=b"emu-jitter").digest()
        self._rng = random.Random(config.seed * 0x9E3779B97F4A7C15 ^ int.from_bytes(digest, "little"))
        self.request = lognormal_mean_one(self._rng, config.request_sigma)

    def tokens(self, n: int) -> list[float]:
        """The next ``n`` per-token factors (drawn in order from the request's RNG)."""
        if self._token_sigma == 0:
            return [1.0] * n
        return [lognormal_mean_one(self._rng, self._token_sigma) for _ in range(n)]
