"""Arrival processes: rates, burstiness, determinism, argument checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tokenomy.workload import ARRIVALS, gamma_arrivals, get_arrival, poisson_arrivals, trace_arrivals


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_poisson_rate_and_cv_over_long_window() -> None:
    t = poisson_arrivals(5.0, 4000.0, np.random.default_rng(1))
    assert abs(len(t) / 4000.0 - 5.0) < 0.15  # ~20k events: sd of the rate is ~0.035
    assert abs(_cv(t) - 1.0) < 0.05
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < 4000.0


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_keeps_rate_and_sets_burstiness(cv: float) -> None:
    t = gamma_arrivals(4.0, cv, 5000.0, np.random.default_rng(2))
    assert abs(len(t) / 5000.0 - 4.0) / 4.0 < 0.1
    assert abs(_cv(t) - cv) / cv < 0.15


@pytest.mark.parametrize("name", sorted(ARRIVALS))
def test_same_seed_same_arrivals(name: str) -> None:
    fn = get_arrival(name)
    a = fn(2.0, 100.0, 1.0, np.random.default_rng(7))
    b = fn(2.0, 100.0, 1.0, np.random.default_rng(7))
    c = fn(2.0, 100.0, 1.0, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_trace_arrivals_spread_within_bucket_and_sorted() -> None:
    stamps = np.repeat([0.0, 3.0, 6.0], 50)
    t = trace_arrivals(stamps, 3.0, np.random.default_rng(0))
    assert np.all(np.diff(t) >= 0)
    for bucket in (0.0, 3.0, 6.0):
        inside = t[(t >= bucket) & (t < bucket + 3.0)]
        assert len(inside) == 50
    assert len(np.unique(t)) == len(t)  # the bursts are broken up
    assert np.array_equal(trace_arrivals(stamps, 0.0, np.random.default_rng(0)), stamps)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: poisson_arrivals(0.0, 10.0, r), "rate_per_s"),
        (lambda r: poisson_arrivals(1.0, -1.0, r), "duration_s"),
        (lambda r: poisson_arrivals(1.0, float("inf"), r), "duration_s"),
        (lambda r: gamma_arrivals(1.0, 0.0, 10.0, r), "cv"),
        (lambda r: trace_arrivals(np.array([1.0]), -1.0, r), "jitter_s"),
        (lambda r: trace_arrivals(np.array([-1.0]), 1.0, r), "timestamps_s"),
        (lambda r: get_arrival("poisson")(1.0, 10.0, 2.0, r), "gamma"),
        (lambda r: get_arrival("weibull"), "known: gamma, poisson"),
    ],
)
def test_bad_arguments_fail_with_clear_message(
    call: Callable[[np.random.Generator], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(np.random.default_rng(0))
