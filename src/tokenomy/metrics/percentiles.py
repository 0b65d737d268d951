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
    order = np.argsort(v, kind="stable")
    v_sorted = v[order]
    cum = np.cumsum(w[order])
    last = v_sorted.size - 1
    out: list[float] = []
    for q in qs:
        # Position in the virtual array of repeated samples, numpy-linear style: q% of (n - 1).
        pos = max(0.0, q / 100.0 * (float(cum[-1]) - 1.0))
        lo, hi = math.floor(pos), math.ceil(pos)
        # Sample k belongs to the first value whose cumulative weight exceeds k.
        v_lo = v_sorted[min(int(np.searchsorted(cum, lo, side="right")), last)]
        v_hi = v_sorted[min(int(np.searchsorted(cum, hi, side="right")), last)]
        out.append(float(v_lo + (pos - lo) * (v_hi - v_lo)))
    return out


def weighted_mean(values: Sequence[float] | npt.ArrayLike, weights: Sequence[float] | npt.ArrayLike) -> float:
    """Mean of ``values`` weighted by ``weights`` (same validation as :func:`weighted_percentile`)."""
    v = _as_samples(values, "weighted_mean values")
    w = _as_samples(weights, "weighted_mean weights")
    if v.shape != w.shape:
        raise ValueError(f"weighted_mean: {v.size} values but {w.size} weights")
    if np.any(w < 0) or float(w.sum()) <= 0:
        raise ValueError("weighted_mean: weights must be non-negative with a positive total")
    return float(np.average(v, weights=w))
