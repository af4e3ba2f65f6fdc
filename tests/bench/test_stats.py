"""The benchmarks' one quantile, median and spread (bench/stats.py)."""

from __future__ import annotations

import statistics

from bench.stats import line, mean, median, pct, pstdev, spread


def test_the_median_is_the_interpolated_middle_rounded_or_not():
    assert median([4.0, 1.0, None, 2.0, 3.0]) == 2.5 == statistics.median([4.0, 1.0, 2.0, 3.0])
    assert median([1.0, 2.0, 2.0001], digits=None) == 2.0
    assert median([1 / 3, 1 / 3], digits=None) == 1 / 3
    assert median([None]) is None and median([], digits=None) is None


def test_a_spread_holds_the_figures_asked_for_in_their_order():
    values = [4.0, 1.0, 3.0, 2.0, 5.0, None]
    assert spread(values) == {"median": 3.0, "min": 1.0, "max": 5.0}
    s = spread(values, ("n", "p50", "p99", "min", "max"), digits=2)
    assert list(s) == ["n", "p50", "p99", "min", "max"] and s["n"] == 5 and s["p99"] == 4.96
    assert spread(values, ("median", "p25", "p75"))["p25"] == pct([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    assert spread([None], ("n", "median")) == {"n": 0, "median": None}


def test_the_mean_and_standard_deviation_agree_with_the_standard_library():
    values = [4.0, 1.0, 3.0, 2.5]
    assert mean([*values, None]) == statistics.fmean(values) and mean([None]) is None
    assert abs(pstdev(values) - statistics.pstdev(values)) < 1e-12 and pstdev([3.0]) == 0.0


def test_the_least_squares_line_recovers_a_line_and_refuses_a_single_x():
    xs = [0.0, 1.0, 2.0, 4.0]
    fitted = line(xs, [3.0 + 2.0 * x for x in xs])
    assert fitted is not None and abs(fitted[0] - 2.0) < 1e-12 and abs(fitted[1] - 3.0) < 1e-12
    assert line([1.0, 1.0], [2.0, 5.0]) is None and line([], []) is None
