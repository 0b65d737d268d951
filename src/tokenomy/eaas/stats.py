"""Order statistics for the paired experiments (``paired_failover``, ``overlap``)."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (``q`` in [0, 1]) of a non-empty sequence (numpy's default rule)."""
    if not values or not 0 <= q <= 1:
        raise ValueError(f"need a non-empty sequence and 0 <= q <= 1, got {len(values)} values, q={q}")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
