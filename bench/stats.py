"""The statistics the benchmarks' summaries share, one copy of each: a quantile and a median."""

from __future__ import annotations

from collections.abc import Iterable


def pct(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by linear interpolation; ``None`` for no values."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(values: Iterable[float | None], digits: int = 2) -> float | None:
    """The median of the values that are not ``None``, rounded; ``None`` when there are none."""
    m = pct([v for v in values if v is not None], 0.5)
    return None if m is None else round(m, digits)
