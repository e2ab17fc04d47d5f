"""`rlslice.planner.stats.percentile`: the one percentile of the profiles and the benches.

Case matrix:

| part | checked |
|---|---|
| linear | the median of an even count is the mean of the middle two (as `statistics.median`); p10/p90 interpolate; one value is every percentile |
| nearest-rank | the smallest value with p% at or below it (bench scale's table) |
| both | no values give 0.0; p outside 0..100 refused; order of the input does not matter; the result lies within the values and grows with p; nearest-rank is always a sample |
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.planner.stats import Method, percentile

# Whole numbers, so that the differences interpolated over are exact (the bounds below
# hold without a tolerance).
samples = st.lists(st.integers(-(10**6), 10**6).map(float), min_size=1, max_size=50)
methods = st.sampled_from(["linear", "nearest-rank"])


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 10, 1.4),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 90, 4.6),
        ([float(n) for n in range(1, 101)], 99, 99.01),
        ([7.0], 99, 7.0),
    ],
)
def test_linear_percentiles_interpolate_between_order_statistics(
    values: list[float], p: float, expected: float
) -> None:
    assert percentile(values, p) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
        ([float(n) for n in range(1, 101)], 99, 99.0),
        ([float(n) for n in range(1, 101)], 100, 100.0),
        ([3.0, 1.0, 2.0], 0, 1.0),
    ],
)
def test_nearest_rank_is_the_smallest_value_with_p_percent_at_or_below(
    values: list[float], p: float, expected: float
) -> None:
    assert percentile(values, p, method="nearest-rank") == expected


@pytest.mark.parametrize("method", ["linear", "nearest-rank"])
def test_no_values_give_zero(method: Method) -> None:
    assert percentile([], 50, method=method) == 0.0


@pytest.mark.parametrize("p", [-1, 100.5, float("nan")])
def test_a_percentile_outside_0_to_100_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], p)


@given(samples)
def test_the_linear_median_is_the_statistics_median(values: list[float]) -> None:
    assert percentile(values, 50) == pytest.approx(statistics.median(values))


@given(samples, st.floats(0, 100), st.floats(0, 100), methods)
def test_a_percentile_lies_within_the_values_and_grows_with_p(
    values: list[float], p: float, q: float, method: Method
) -> None:
    low, high = sorted((p, q))
    assert min(values) <= percentile(values, low, method=method)
    assert percentile(values, low, method=method) <= percentile(values, high, method=method)
    assert percentile(values, high, method=method) <= max(values)
    assert percentile(values, p, method=method) == percentile(values[::-1], p, method=method)


@given(samples, st.floats(0, 100))
def test_nearest_rank_is_always_one_of_the_samples(values: list[float], p: float) -> None:
    assert percentile(values, p, method="nearest-rank") in values
