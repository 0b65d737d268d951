"""Percentiles of latency samples, plain and weighted.

Percentiles use numpy's "linear" method (the one vLLM's benchmark reports), with ``q`` in
[0, 100]. The weighted form serves pooled histograms: an inter-token-latency sample is a step
gap, weighted by the number of tokens that gap delayed, so it stands for that many samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def _as_samples(values: Sequence[float] | npt.ArrayLike, what: str) -> npt.NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{what}: no samples (percentiles of an empty set are undefined)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: samples must be finite numbers (found NaN or infinity)")
    return arr


def _check_q(q: float) -> None:
    if not (0.0 <= q <= 100.0) or math.isnan(q):
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")


def percentile(values: Sequence[float] | npt.ArrayLike, q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated (numpy's default).

    Raises ValueError on an empty or non-finite input or a ``q`` outside [0, 100].
    """
    _check_q(q)
    return float(np.percentile(_as_samples(values, "percentile"), q, method="linear"))


def weighted_percentile(
    values: Sequence[float] | npt.ArrayLike, weights: Sequence[float] | npt.ArrayLike, q: float
) -> float:
    """The ``q``-th percentile of ``values`` where each value occurs ``weights[i]`` times.

    Contract: with integer weights the result equals
    ``percentile(np.repeat(values, weights), q)`` exactly, without materialising the repeats;
    fractional weights extend the same rule (value ``i`` covers the sample positions
    ``[W_{i-1}, W_i)`` of the cumulative weight). Zero weights drop a value. Raises
    ValueError on length mismatch, negative or non-finite weights, or zero total weight.
    """
    return weighted_percentiles(values, weights, (q,))[0]


def weighted_percentiles(
    values: Sequence[float] | npt.ArrayLike, weights: Sequence[float] | npt.ArrayLike, qs: Sequence[float]
) -> list[float]:
    """:func:`weighted_percentile` at each of ``qs``, sorting the samples once."""
    for q in qs:
        _check_q(q)
    v = _as_samples(values, "weighted_percentile values")
    w = _as_samples(weights, "weighted_percentile weights")
    if v.shape != w.shape:
        raise ValueError(f"weighted_percentile: {v.size} values but {w.size} weights")
    if np.any(w < 0):
        raise ValueError("weighted_percentile: weights must be non-negative")
    keep = w > 0
    if not np.any(keep):
        raise ValueError("weighted_percentile: total weight is zero")
    if not np.all(keep):
        v, w = v[keep], w[keep]
    # Integer weights (pooled ITL: batch sizes) sum exactly in any order below 2**53, so a large
    # set of them is ranked by selection; anything else by a sort, its total the sorted cumsum's.
    w_sum = float(w.sum())
    select = v.size >= SELECT_MIN and w_sum < 2.0**53 and np.array_equal(w, np.trunc(w))
    by_sort = None if select else _sorted(v, w)
    total = w_sum if by_sort is None else float(by_sort[1][-1])
    wanted: list[tuple[float, int, int]] = []  # (position, sample below it, sample above it) per q
    for q in qs:
        # Position in the virtual array of repeated samples, numpy-linear style: q% of (n - 1).
        pos = max(0.0, q / 100.0 * (total - 1.0))
        wanted.append((pos, math.floor(pos), math.ceil(pos)))
    ranks = sorted({k for _, lo, hi in wanted for k in (lo, hi)})
    at = _select_ranks(v, w, ranks, total) if by_sort is None else _ranks(*by_sort, ranks)
    return [float(at[lo] + (pos - lo) * (at[hi] - at[lo])) for pos, lo, hi in wanted]


SELECT_MIN = 20_000
"""Samples from which integer-weighted percentiles select instead of sorting (:func:`_select_ranks`):
below it a sort costs less than the selection's passes."""


def _sorted(v: npt.NDArray[np.float64], w: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64],
                                                                             npt.NDArray[np.float64]]:
    """The values sorted (ties in their order) and the cumulative weight along them."""
    order = np.argsort(v, kind="stable")
    return v[order], np.cumsum(w[order])


def _ranks(v_sorted: npt.NDArray[np.float64], cum: npt.NDArray[np.float64], ranks: list[int]) -> dict[int, float]:
    """The value at each sample rank (0-based, in the virtual array of repeated samples): sample k
    belongs to the first value whose cumulative weight exceeds k."""
    last = v_sorted.size - 1
    return {k: float(v_sorted[min(int(np.searchsorted(cum, k, side="right")), last)]) for k in ranks}


def _select_ranks(v: npt.NDArray[np.float64], w: npt.NDArray[np.float64], ranks: list[int],
                  total: float) -> dict[int, float]:
    """:func:`_ranks` for integer weights (summing to ``total``), by selection: a sorted sample of
    the values brackets each rank, the weight below the bracket is summed, and only the values
    inside it are sorted (a few passes over the values instead of sorting them all: on a Mooncake
    replay's 1.9M pooled ITL samples, a fifth of the time). The sums are exact, so each rank's
    value is the sort's to the bit; a rank its bracket misses falls back to the sort."""
    stride = max(1, v.size // 4096)
    sample_v, sample_w = v[::stride], w[::stride]
    order = np.argsort(sample_v, kind="stable")
    sample_v = sample_v[order]
    # The sample's cumulative weight scaled to the whole: where each rank should fall.
    estimate = np.cumsum(sample_w[order]) * (total / float(sample_w.sum()))
    last = sample_v.size - 1
    out: dict[int, float] = {}
    for k in ranks:
        if k in out:
            continue
        j = int(np.searchsorted(estimate, k, side="right"))
        lo = float(sample_v[j - _MARGIN]) if j - _MARGIN > 0 else -math.inf
        hi = float(sample_v[j + _MARGIN]) if j + _MARGIN < last else math.inf
        inside = (v >= lo) & (v <= hi)
        below = float(w.sum(where=v < lo)) if lo > -math.inf else 0.0
        v_in, cum = _sorted(v[inside], w[inside])
        cum += below
        # Every rank this bracket holds (a percentile's two neighbouring ranks share one).
        for r in ranks:
            if r not in out and cum.size and below <= r < float(cum[-1]):
                out[r] = float(v_in[int(np.searchsorted(cum, r, side="right"))])
        if k not in out:
            return _ranks(*_sorted(v, w), ranks)  # (the sample misjudged it: not seen on real traces)
    return out


_MARGIN = 48
"""Sample values on each side of a rank's estimate that its bracket spans (of 4,096: about 1% of
the values each side, many standard errors of the estimate)."""


def weighted_mean(values: Sequence[float] | npt.ArrayLike, weights: Sequence[float] | npt.ArrayLike) -> float:
    """Mean of ``values`` weighted by ``weights`` (same validation as :func:`weighted_percentile`)."""
    v = _as_samples(values, "weighted_mean values")
    w = _as_samples(weights, "weighted_mean weights")
    if v.shape != w.shape:
        raise ValueError(f"weighted_mean: {v.size} values but {w.size} weights")
    if np.any(w < 0) or float(w.sum()) <= 0:
        raise ValueError("weighted_mean: weights must be non-negative with a positive total")
    return float(np.average(v, weights=w))
