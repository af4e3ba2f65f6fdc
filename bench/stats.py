"""The statistics the benchmarks' summaries share, one copy of each: a quantile, a median and a
spread (chosen figures of a sample: its size, quantiles, extremes)."""

from __future__ import annotations

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
