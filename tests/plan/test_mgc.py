"""The pool queueing formulas against known values, and pooling against independent queues."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenomy.plan.mgc import allen_cunneen, erlang_c
from tokenomy.plan.options import EngineLimits, build_models
from tokenomy.plan.stats import WorkloadStats


@pytest.mark.parametrize(
    ("servers", "erlangs", "expected"),
    [
        (1, 0.3, 0.3),  # M/M/1: P(wait) = rho
        (1, 0.9, 0.9),
        (2, 1.0, 1 / 3),  # rho = 0.5
        (2, 1.6, 0.7111111),  # 2 rho^2 / (1 + rho) at rho = 0.8
        (10, 8.0, 0.4092),  # Erlang C tables
        (3, 0.0, 0.0),
    ],
)
def test_erlang_c_matches_known_values(servers: int, erlangs: float, expected: float) -> None:
    assert erlang_c(servers, erlangs) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(("servers", "erlangs"), [(0, 0.5), (2, 2.0), (2, -0.1)])
def test_erlang_c_refuses_an_unstable_or_empty_pool(servers: int, erlangs: float) -> None:
    with pytest.raises(ValueError):
        erlang_c(servers, erlangs)


def test_erlang_c_stays_finite_for_large_pools() -> None:
    p = erlang_c(500, 480.0)
    assert 0.0 < p < 1.0


def test_allen_cunneen_reduces_to_pollaczek_khinchine_and_m_m_c() -> None:
    # M/G/1: E[W] = lambda E[S^2] / 2(1 - rho), P(wait) = rho.
    lam, mean, scv = 4.0, 0.2, 2.5
    law = allen_cunneen(1, lam, mean, scv)
    second_moment = (scv + 1) * mean**2
    assert law.p_wait == pytest.approx(0.8)
    assert law.mean_wait_s == pytest.approx(lam * second_moment / (2 * (1 - 0.8)))
    # M/M/2 at rho 0.5, mu 1: E[W] = C / (c mu - lambda) = (1/3) / 1; the wait's tail is exact.
    mm2 = allen_cunneen(2, 1.0, 1.0, 1.0)
    assert mm2.mean_wait_s == pytest.approx(1 / 3)
    assert mm2.tail(2.0) == pytest.approx(math.exp(-2.0) / 3)
    assert mm2.quantile_s(0.95) == pytest.approx(math.log((1 / 3) / 0.05))
    assert mm2.quantile_s(0.5) == 0.0  # two thirds never wait


def test_a_balanced_pool_waits_less_than_independent_instances() -> None:
    # Four servers at 70% busy each: one shared queue vs four independent M/G/1 queues.
    pool = allen_cunneen(4, 4 * 3.5, 0.2, 1.5)
    alone = allen_cunneen(1, 3.5, 0.2, 1.5)
    assert pool.p_wait < alone.p_wait
    assert pool.mean_wait_s < alone.mean_wait_s / 2
    assert pool.quantile_s(0.95) < alone.quantile_s(0.95)


def _stats(n: int = 400) -> WorkloadStats:
    rng = np.random.default_rng(0)
    prompt = rng.integers(200, 4000, n)
    out = rng.integers(50, 400, n)
    zeros = np.zeros(n, dtype=np.int64)
    return WorkloadStats("synthetic", 10.0, 10.0, prompt, out, zeros, zeros, 0.0)


@pytest.mark.parametrize("role", ["prefill", "mixed"])
def test_planner_predicts_a_lower_ttft_p95_for_a_pool_than_for_one_instance_at_the_same_load(role: str) -> None:
    models, _ = build_models("llama-3.1-8b", {"H100-SXM": 1}, _stats(), EngineLimits(), 8, (1,))
    model = next(m for c, m in models.items() if c.role == role)
    capacity = next(r for r in np.arange(1.0, 200.0, 0.5) if not model.predict(r).feasible)
    rate = 0.7 * capacity
    one, pool = model.predict(rate), model.predict(rate, servers=4)
    assert one.feasible and pool.feasible
    assert pool.utilization == pytest.approx(one.utilization)  # same load per instance
    assert pool.ttft_p95_s is not None and one.ttft_p95_s is not None
    assert pool.ttft_p95_s < 0.9 * one.ttft_p95_s
    floor = model.zero_load().ttft_p95_s or 0.0
    assert pool.ttft_p95_s >= floor  # never below prefilling alone
