from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tokenomy.metrics import percentile, weighted_mean, weighted_percentile, weighted_percentiles


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4, 5], 50, 3.0),
        ([1, 2, 3, 4], 50, 2.5),
        (list(range(1, 101)), 99, 99.01),
        ([10, 20], 25, 12.5),
        ([7], 99, 7.0),
        ([3, 1, 2], 0, 1.0),
        ([3, 1, 2], 100, 3.0),
    ],
)
def test_percentile_known_arrays(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("values", "weights"),
    [
        ([0.01, 0.02, 0.5], [10, 5, 1]),
        ([3.0, 1.0, 2.0, 9.0], [1, 4, 0, 2]),
        ([0.2], [7]),
        ([5.0, 1.0], [1, 1]),
    ],
)
@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_weighted_percentile_equals_repeated_samples(values: list[float], weights: list[int], q: float) -> None:
    expected = float(np.percentile(np.repeat(values, weights), q))
    assert weighted_percentile(values, weights, q) == pytest.approx(expected)


def test_weighted_percentiles_sort_once_and_agree_with_repeated_samples() -> None:
    values, weights = [3.0, 1.0, 2.0, 9.0, 0.5], [1, 4, 0, 2, 3]
    qs = (0, 50, 90, 99, 100)
    expected = [float(np.percentile(np.repeat(values, weights), q)) for q in qs]
    assert weighted_percentiles(values, weights, qs) == pytest.approx(expected)
    with pytest.raises(ValueError, match="percentile q"):
        weighted_percentiles(values, weights, (50, 101))


def test_weighted_mean_counts_each_token() -> None:
    # A 0.5 s stall that delayed 4 tokens weighs like four 0.5 s gaps.
    assert weighted_mean([0.1, 0.5], [4, 4]) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: percentile([], 50), "no samples"),
        (lambda: percentile([1.0, float("nan")], 50), "finite"),
        (lambda: percentile([1.0], 101), r"\[0, 100\]"),
        (lambda: weighted_percentile([1.0, 2.0], [1.0], 50), "2 values but 1 weights"),
        (lambda: weighted_percentile([1.0], [-1.0], 50), "non-negative"),
        (lambda: weighted_percentile([1.0, 2.0], [0, 0], 50), "total weight is zero"),
    ],
)
def test_bad_input_gets_clear_error(call: Callable[[], float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
