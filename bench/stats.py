"""The statistics the lab's summaries share, one copy of each: a quantile, a median, a mean, a
spread (chosen figures of a sample: its size, quantiles, extremes), the population standard
deviation and a least-squares line.  No other lab module computes its own
(tests/bench/test_lab_layout.py: none imports ``statistics``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pct(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by linear interpolation; ``None`` for no values."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(values: Iterable[float | None], digits: int | None = 2) -> float | None:
    """The median of the values that are not ``None``, rounded to ``digits`` (``None``: not
    rounded); ``None`` when there are none."""
    m = pct([v for v in values if v is not None], 0.5)
    if m is None:
        return None
    return m if digits is None else round(m, digits)


# The figures a spread can hold: the quantiles by their q, ``n`` the sample's size.
QUANTILES = {
    "median": 0.5,
    "p25": 0.25,
    "p50": 0.5,
    "p75": 0.75,
    "p90": 0.9,
    "p99": 0.99,
    "min": 0.0,
    "max": 1.0,
}
MEDIAN_RANGE = ("median", "min", "max")


def spread(
    values: Iterable[float | None], keys: Sequence[str] = MEDIAN_RANGE, digits: int = 3
) -> dict[str, float | int | None]:
    """``keys`` (of :data:`QUANTILES` and ``n``) of the values that are not ``None``, in that
    order, rounded to ``digits``; each ``None`` (``n`` 0) when there are none."""
    vs = sorted(v for v in values if v is not None)
    out: dict[str, float | int | None] = {}
    for k in keys:
        if k == "n":
            out[k] = len(vs)
        else:
            x = pct(vs, QUANTILES[k])
            out[k] = None if x is None else round(x, digits)
    return out


def mean(values: Iterable[float | None]) -> float | None:
    """The arithmetic mean of the values that are not ``None``; ``None`` when there are none."""
    vs = [v for v in values if v is not None]
    return math.fsum(vs) / len(vs) if vs else None


def pstdev(values: Iterable[float]) -> float:
    """The population standard deviation (0.0 for fewer than two values)."""
    vs = list(values)
    m = mean(vs)
    if m is None or len(vs) < 2:
        return 0.0
    return math.sqrt(math.fsum((v - m) ** 2 for v in vs) / len(vs))


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """The least-squares line through the points ``(xs[i], ys[i])`` as ``(slope, intercept)``;
    ``None`` when there are none or every ``x`` is the same (no slope to fit)."""
    mx, my = mean(xs), mean(ys)
    if mx is None or my is None:
        return None
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx
