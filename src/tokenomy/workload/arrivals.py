"""Arrival processes: when sessions (or single requests) start.

All functions return a sorted float64 array of start times in seconds within
``[0, duration_s)`` and draw only from the ``rng`` they are given, so a seed fixes them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ArrivalFn = Callable[[float, float, float, np.random.Generator], np.ndarray]
"""``(rate_per_s, duration_s, cv, rng) -> sorted start times``: the registry's uniform signature."""


def _check_rate_duration(rate_per_s: float, duration_s: float) -> None:
    if not 0 < rate_per_s < float("inf"):
        raise ValueError(f"rate_per_s must be finite and > 0, got {rate_per_s}")
    if not 0 < duration_s < float("inf"):
        raise ValueError(f"duration_s must be finite and > 0, got {duration_s}")


def _renewal(gaps: Callable[[int], np.ndarray], rate_per_s: float, duration_s: float) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps until ``duration_s`` is passed.

    Gaps are drawn in chunks sized for the expected count plus slack, so the loop runs a
    handful of times at most; a hard cap keeps a pathological gap source from spinning.
    """
    chunk = int(rate_per_s * duration_s * 1.1) + 64
    times: list[np.ndarray] = []
    t0 = 0.0
    for _ in range(10_000):
        t = t0 + np.cumsum(gaps(chunk))
        times.append(t)
        if t[-1] >= duration_s:
            break
        t0 = float(t[-1])
    else:  # pragma: no cover - needs gaps that almost never advance time
        raise RuntimeError("arrival process did not reach duration_s; check rate and cv")
    out = np.concatenate(times)
    return out[out < duration_s]


def poisson_arrivals(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson process: exponential inter-arrival gaps with mean ``1 / rate_per_s``."""
    _check_rate_duration(rate_per_s, duration_s)
    return _renewal(lambda n: rng.exponential(1.0 / rate_per_s, n), rate_per_s, duration_s)


def gamma_arrivals(rate_per_s: float, cv: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Bursty renewal process: gamma inter-arrival gaps with mean ``1 / rate_per_s`` and CV ``cv``.

    ``cv == 1`` has the statistics of a Poisson process; ``cv > 1`` clusters arrivals in
    bursts separated by lulls (the Azure code trace has CV ~13), ``cv < 1`` is more regular.
    """
    _check_rate_duration(rate_per_s, duration_s)
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_per_s * shape)
    return _renewal(lambda n: rng.gamma(shape, scale, n), rate_per_s, duration_s)


def jitter_timestamps(timestamps_s: np.ndarray, jitter_s: float, rng: np.random.Generator) -> np.ndarray:
    """Add ``U[0, jitter_s)`` to every timestamp, keeping the input order (not sorted)."""
    ts = np.asarray(timestamps_s, dtype=float)
    if jitter_s < 0:
        raise ValueError(f"jitter_s must be >= 0, got {jitter_s}")
    if ts.size and (not np.all(np.isfinite(ts)) or ts.min() < 0):
        raise ValueError("timestamps_s must be finite and >= 0")
    if jitter_s == 0:
        return ts.copy()
    return ts + rng.uniform(0.0, jitter_s, ts.size)


def trace_arrivals(timestamps_s: np.ndarray, jitter_s: float, rng: np.random.Generator) -> np.ndarray:
    """Replay quantised trace timestamps: each is spread uniformly over ``[t, t + jitter_s)``.

    Traces such as Mooncake's round arrivals into buckets (~3 s); replaying them as-is
    would send each bucket as one burst. Pass the bucket width as ``jitter_s``. Sorted.
    """
    return np.sort(jitter_timestamps(timestamps_s, jitter_s, rng))


def _poisson_entry(rate_per_s: float, duration_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    if cv != 1.0:
        raise ValueError(f"the poisson arrival process has cv 1; got cv={cv} (use 'gamma' for other cvs)")
    return poisson_arrivals(rate_per_s, duration_s, rng)


def _gamma_entry(rate_per_s: float, duration_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    return gamma_arrivals(rate_per_s, cv, duration_s, rng)


ARRIVALS: dict[str, ArrivalFn] = {"poisson": _poisson_entry, "gamma": _gamma_entry}


def get_arrival(name: str) -> ArrivalFn:
    """The arrival process registered under ``name``; unknown names list the known ones."""
    try:
        return ARRIVALS[name]
    except KeyError:
        raise ValueError(f"unknown arrival process {name!r}; known: {', '.join(sorted(ARRIVALS))}") from None
