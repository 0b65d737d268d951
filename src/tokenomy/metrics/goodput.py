"""DistServe's goodput: the highest request rate a deployment sustains at an SLO attainment target.

A sweep runs the same workload at increasing request rates and measures SLO attainment at
each. Goodput is the rate where attainment crosses the target (DistServe uses 90%). Dividing
by the GPUs used makes deployments of different sizes comparable (goodput per GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_ATTAINMENT_TARGET = 0.9  # DistServe's evaluation target; configurable everywhere.


def _sorted_points(rates: Sequence[float], attainments: Sequence[float]) -> list[tuple[float, float]]:
    if len(rates) != len(attainments):
        raise ValueError(f"{len(rates)} rates but {len(attainments)} attainments")
    if not rates:
        raise ValueError("goodput needs at least one (rate, attainment) point")
    for rate in rates:
        if not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"rates must be finite and positive, got {rate}")
    for att in attainments:
        if not (0.0 <= att <= 1.0):
            raise ValueError(f"attainments are fractions in [0, 1], got {att}")
    if len(set(rates)) != len(rates):
        raise ValueError("rates must be distinct (one attainment per rate)")
    return sorted(zip(rates, attainments, strict=True))


def max_rate_at_attainment(
    rates: Sequence[float], attainments: Sequence[float], target: float = DEFAULT_ATTAINMENT_TARGET
) -> float:
    """Largest request rate (same unit as ``rates``) at which SLO attainment stays >= ``target``.

    Points are taken in increasing rate order. The answer is the rate where attainment first
    drops below ``target``, linearly interpolated between the last meeting point and the first
    failing point after it. If the lowest rate already fails the answer is 0.0; if every rate
    meets the target the answer is the highest rate swept (the true goodput may be higher:
    sweep further). A recovery above the first failing point is treated as noise and ignored,
    because attainment can only fall as load rises and capacity must hold at every lower rate.
    """
    if not (0.0 < target <= 1.0):
        raise ValueError(f"target attainment must lie in (0, 1], got {target}")
    points = _sorted_points(rates, attainments)
    prev: tuple[float, float] | None = None
    for rate, att in points:
        if att < target:
            if prev is None:
                return 0.0
            r0, a0 = prev
            # a0 >= target > att, so the crossing lies in [r0, rate).
            return r0 + (a0 - target) / (a0 - att) * (rate - r0)
        prev = (rate, att)
    return points[-1][0]


def max_rate_per_gpu_at_attainment(
    rates: Sequence[float],
    attainments: Sequence[float],
    num_gpus: int,
    target: float = DEFAULT_ATTAINMENT_TARGET,
) -> float:
    """:func:`max_rate_at_attainment` divided by the ``num_gpus`` the deployment used."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be at least 1, got {num_gpus}")
    return max_rate_at_attainment(rates, attainments, target) / num_gpus
