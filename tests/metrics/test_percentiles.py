from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tokenomy.metrics import percentile, percentiles, weighted_mean, weighted_percentile, weighted_percentiles


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


QS = (0, 1, 50, 90, 99, 99.9, 100)


def _by_sort(values: np.ndarray, weights: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The same percentiles with selection turned off (every set sorted)."""
    with monkeypatch.context() as m:
        m.setattr(percentiles, "SELECT_MIN", 10**18)
        return weighted_percentiles(values, weights, QS)


@pytest.mark.parametrize("seed", range(3))
def test_large_integer_weighted_sets_select_exactly_what_the_sort_finds(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SELECT_MIN samples, integer weights (pooled ITL's batch sizes) are ranked by selection:
    the result is the sort's to the bit, ties and zero weights included, and the repeated samples'."""
    rng = np.random.default_rng(seed)
    n = 3 * percentiles.SELECT_MIN
    values = np.round(rng.gamma(2.0, 0.01, n), 4)  # rounded: many ties
    weights = rng.integers(0, 15, n).astype(np.float64)
    got = weighted_percentiles(values, weights, QS)
    assert got == _by_sort(values, weights, monkeypatch)
    assert got == pytest.approx([float(np.percentile(np.repeat(values, weights.astype(int)), q)) for q in QS])


def test_a_sample_that_misjudges_the_set_falls_back_to_the_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The values the selection samples (every ``n // 4096``-th) are made the largest, so its
    brackets miss the true ranks: the answer is still the sort's."""
    n = 3 * percentiles.SELECT_MIN
    values = np.random.default_rng(0).uniform(0.0, 1.0, n)
    values[:: n // 4096] += 10.0
    weights = np.ones(n)
    got = weighted_percentiles(values, weights, QS)
    assert got == _by_sort(values, weights, monkeypatch)
    assert got[2] < 1.0  # the median lies among the small values the sample never saw


def test_fractional_weights_are_sorted_not_selected() -> None:
    """Selection needs exact sums; fractional weights on a large set take the sort (same contract)."""
    rng = np.random.default_rng(1)
    n = 2 * percentiles.SELECT_MIN
    values, weights = rng.uniform(0.0, 1.0, n), rng.uniform(0.5, 1.5, n)
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    position = 0.5 * (float(cum[-1]) - 1.0)
    lo, hi = (values[order][int(np.searchsorted(cum, k, side="right"))] for k in (int(position), int(position) + 1))
    assert weighted_percentile(values, weights, 50) == float(lo + (position - int(position)) * (hi - lo))


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
