"""Small, typed length and latency distributions used by the synthetic generators.

Every distribution is a log-normal described by its *mean* and *coefficient of variation*
(std / mean), the two numbers papers and traces usually report, clipped to ``[low, high]``.
Clipping moves the mean a little; :meth:`LogNormal.expected` gives the exact mean after
clipping, so documentation and tests can quote what a generator really produces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal with the given (unclipped) ``mean`` and ``cv``, clipped to ``[low, high]``.

    ``cv == 0`` is the constant ``mean`` (clipped).
    """

    mean: float
    cv: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.mean > 0:
            raise ValueError(f"mean must be > 0, got {self.mean}")
        if self.cv < 0:
            raise ValueError(f"cv must be >= 0, got {self.cv}")
        if not 0 <= self.low <= self.high:
            raise ValueError(f"need 0 <= low <= high, got low={self.low}, high={self.high}")

    @property
    def _sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv * self.cv))

    @property
    def _mu(self) -> float:
        return math.log(self.mean) - self._sigma**2 / 2.0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` float samples."""
        if self.cv == 0:
            return np.full(size, min(max(self.mean, self.low), self.high), dtype=float)
        return np.clip(rng.lognormal(self._mu, self._sigma, size), self.low, self.high)

    def sample_int(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` samples rounded to the nearest integer (token counts, turn counts)."""
        return np.rint(self.sample(rng, size)).astype(np.int64)

    def expected(self) -> float:
        """Exact mean after clipping (before integer rounding, which is unbiased to ~0.5)."""
        if self.cv == 0:
            return min(max(self.mean, self.low), self.high)
        mu, s = self._mu, self._sigma
        below = _phi((math.log(self.low) - mu) / s) if self.low > 0 else 0.0
        above = 1.0 - _phi((math.log(self.high) - mu) / s)
        z_low = (math.log(self.low) - mu - s * s) / s if self.low > 0 else -math.inf
        z_high = (math.log(self.high) - mu - s * s) / s
        inner = math.exp(mu + s * s / 2.0) * (_phi(z_high) - (_phi(z_low) if z_low > -math.inf else 0.0))
        return self.low * below + self.high * above + inner
