"""The pooled ITL buffer: samples in event order, weights run-length encoded and expanded exactly."""

from __future__ import annotations

import numpy as np

from tokenomy.core import SLO
from tokenomy.metrics.summary import summarize
from tokenomy.sim.instance import ITL_CHUNK, PooledItl


def test_samples_keep_their_order_and_weights_whatever_way_they_came() -> None:
    pooled = PooledItl()
    expected: list[tuple[float, int]] = []
    durations = [0.010, 0.011, 0.012, 0.013, 0.014]
    for value, weight in [(0.02, 3), (0.03, 3), (0.04, 7)]:
        pooled.add(value, weight)
        expected.append((value, weight))
    pooled.add_run(durations, 1, 4, 7)  # same weight as the last single sample: one run of weights
    expected += [(d, 7) for d in durations[1:4]]
    pooled.add_run(durations, 2, 2, 9)  # an empty stretch adds nothing
    pooled.add_run(durations, 0, 2, 2)
    expected += [(d, 2) for d in durations[0:2]]
    pooled.add(0.05, 7)
    expected.append((0.05, 7))
    assert len(pooled) == len(expected)
    assert pooled.values().tolist() == [v for v, _ in expected]
    weights = pooled.weights()
    assert weights.dtype == np.float64
    assert weights.tolist() == [float(w) for _, w in expected]


def test_samples_past_a_chunk_keep_their_order() -> None:
    """Past ITL_CHUNK samples the older ones move to vectors: the values still come back whole, in
    order, beside their weights (a single sample and a run each crossing the boundary)."""
    pooled = PooledItl()
    values = [float(i) for i in range(2 * ITL_CHUNK + 10)]
    pooled.add_run(values, 0, ITL_CHUNK - 1, 1)
    pooled.add(values[ITL_CHUNK - 1], 2)  # the sample that fills the first chunk
    pooled.add_run(values, ITL_CHUNK, 2 * ITL_CHUNK + 10, 3)  # fills the second, and 10 beyond
    assert len(pooled) == len(values)
    assert pooled.values().tolist() == values
    assert pooled.weights().tolist() == [1.0] * (ITL_CHUNK - 1) + [2.0] + [3.0] * (ITL_CHUNK + 10)


def test_an_empty_buffer_gives_no_itl() -> None:
    pooled = PooledItl()
    assert len(pooled) == 0 and pooled.weights().size == 0
    summary = summarize([], slo=SLO(), duration_s=0.0, num_gpus=1, usd_per_gpu_hour=0.0,
                        itl_values=pooled.values(), itl_weights=pooled.weights())
    assert summary.itl_p50_s is None


def test_the_summary_reads_it_as_the_lists_it_replaces() -> None:
    """The expanded weights give the summary the same ITL figures as a plain list of int weights."""
    pooled = PooledItl()
    rng = np.random.default_rng(0)
    values: list[float] = []
    weights: list[int] = []
    for _ in range(50):
        n = int(rng.integers(1, 6))
        run = [float(x) for x in rng.uniform(0.005, 0.05, n)]
        batch = int(rng.integers(1, 4))
        pooled.add_run(run, 0, n, batch)
        values += run
        weights += [batch] * n
    a = summarize([], slo=SLO(), duration_s=0.0, num_gpus=1, usd_per_gpu_hour=0.0,
                  itl_values=pooled.values(), itl_weights=pooled.weights())
    b = summarize([], slo=SLO(), duration_s=0.0, num_gpus=1, usd_per_gpu_hour=0.0,
                  itl_values=values, itl_weights=weights)
    assert (a.itl_p50_s, a.itl_p99_s, a.itl_mean_s) == (b.itl_p50_s, b.itl_p99_s, b.itl_mean_s)
    assert a.itl_p50_s is not None

