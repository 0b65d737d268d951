from __future__ import annotations

import pytest

from tokenomy.metrics import max_rate_at_attainment, max_rate_per_gpu_at_attainment


@pytest.mark.parametrize(
    ("rates", "attainments", "expected"),
    [
        pytest.param([1, 2, 4], [0.5, 0.4, 0.1], 0.0, id="never-met"),
        pytest.param([1, 2, 4], [1.0, 0.99, 0.95], 4.0, id="always-met"),
        # Meets at 2 (0.95), fails at 4 (0.85): 0.9 lies half-way, so 3.
        pytest.param([1, 2, 4], [1.0, 0.95, 0.85], 3.0, id="crossing"),
        pytest.param([4, 1, 2], [0.85, 1.0, 0.95], 3.0, id="unsorted-input"),
        pytest.param([1, 2], [0.9, 0.0], 1.0, id="exactly-at-target-counts"),
        # A recovery after the first failure is noise: capacity must hold at every lower rate.
        pytest.param([1, 2, 3, 4], [1.0, 0.8, 0.95, 0.5], 1.5, id="non-monotone"),
    ],
)
def test_max_rate_at_attainment(rates: list[float], attainments: list[float], expected: float) -> None:
    assert max_rate_at_attainment(rates, attainments) == pytest.approx(expected)


def test_custom_target_and_per_gpu() -> None:
    rates, att = [1.0, 2.0], [1.0, 0.0]
    assert max_rate_at_attainment(rates, att, target=0.5) == pytest.approx(1.5)
    assert max_rate_per_gpu_at_attainment(rates, att, num_gpus=3, target=0.5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("rates", "attainments", "target", "message"),
    [
        ([], [], 0.9, "at least one"),
        ([1, 2], [1.0], 0.9, "2 rates but 1"),
        ([1, 1], [1.0, 0.5], 0.9, "distinct"),
        ([0, 1], [1.0, 0.5], 0.9, "positive"),
        ([1], [90.0], 0.9, r"\[0, 1\]"),
        ([1], [1.0], 90, r"\(0, 1\]"),
    ],
)
def test_bad_sweeps_rejected(rates: list[float], attainments: list[float], target: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        max_rate_at_attainment(rates, attainments, target)
