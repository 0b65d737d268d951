"""Service tiers and the closed loop's configuration (every figure a labelled default).

No public source gives weights or waits for tiers of an inference service; the defaults below
are our choices, picked in simulation (docs/closed-loop.md says how) and exposed everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TierSpec:
    """One service tier.

    ``rank`` 0 is the top tier. ``weight`` is a tenant's share of admission slots under weighted
    fair queueing (a tenant of weight 4 is admitted 4 times as often as one of weight 1 while both
    wait). ``max_defer_s`` is how long one of its requests may wait in the admission queue before
    it is shed: short enough that a request admitted at the end of its wait can still meet a TTFT
    SLO of a few seconds. ``max_load_fraction``: a request of this tier is admitted only while
    fewer than this fraction of ``max_in_flight`` slots are taken, so the top tiers keep headroom.
    """

    name: str
    rank: int
    weight: float
    max_defer_s: float
    max_load_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        if self.rank < 0:
            raise ValueError(f"tier {self.name!r}: rank must be >= 0, got {self.rank}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"tier {self.name!r}: weight must be a finite number > 0, got {self.weight}")
        if not (self.max_defer_s >= 0 and math.isfinite(self.max_defer_s)):
            raise ValueError(f"tier {self.name!r}: max_defer_s must be a finite number >= 0, got {self.max_defer_s}")
        if not 0 < self.max_load_fraction <= 1:
            raise ValueError(f"tier {self.name!r}: max_load_fraction must be in (0, 1], got {self.max_load_fraction}")


DEFAULT_TIERS: tuple[TierSpec, ...] = (
    TierSpec("gold", rank=0, weight=4.0, max_defer_s=1.5),
    TierSpec("silver", rank=1, weight=2.0, max_defer_s=1.0, max_load_fraction=0.9),
    TierSpec("free", rank=2, weight=1.0, max_defer_s=1.0, max_load_fraction=0.9),
)
"""Labelled defaults: weights 4 : 2 : 1, waits of 1.5 s / 1 s / 1 s before shedding (TTFT SLO 2 s);
picked in simulation over 8 : 3 : 1 and 16 : 4 : 1; the lower tiers stop at 90% of the slots (the
last tenth is the top tier's: trunk reservation), picked over 1.0 / 0.875 / 0.7 on the benchmark's
overload with retrying clients, seeds 0-5 (docs/closed-loop.md)."""


@dataclass(frozen=True)
class DegradeConfig:
    """Opt-in degradation of lower tiers under load.

    Under load (``in_flight >= load_fraction * max_in_flight``) a request of rank
    ``>= from_rank`` has its ``max_tokens`` capped at ``max_tokens_cap`` (None: no cap), and one
    whose prompt exceeds ``long_prompt_tokens`` (None: never) is held in the queue until the load
    drops or its wait runs out.
    """

    load_fraction: float = 0.9
    from_rank: int = 1
    max_tokens_cap: int | None = 256
    long_prompt_tokens: int | None = 16_384

    def __post_init__(self) -> None:
        if not 0 < self.load_fraction <= 1:
            raise ValueError(f"load_fraction must be in (0, 1], got {self.load_fraction}")
        if self.max_tokens_cap is not None and self.max_tokens_cap < 1:
            raise ValueError(f"max_tokens_cap must be >= 1, got {self.max_tokens_cap}")
        if self.long_prompt_tokens is not None and self.long_prompt_tokens < 1:
            raise ValueError(f"long_prompt_tokens must be >= 1, got {self.long_prompt_tokens}")


@dataclass(frozen=True)
class ClosedLoopConfig:
    """The closed loop's admission parameters (defaults labelled, docs/closed-loop.md).

    * ``tiers``: the tier table; a request whose tier is unknown or empty gets the lowest tier.
    * ``blind_max_defer_s``: the tenant-blind FIFO policy's one wait before shedding.
    * ``rate_window_s``: window of a tenant's consumption rate (tokens per second).
    * ``budget_slow_below``: under this fraction of its budget left a tenant is slowed: its
      weight shrinks in proportion and each of its requests waits up to ``budget_pace_s`` more
      (the full pause at an empty budget); it is refused only when the budget left cannot pay
      for the request.
    * ``degrade``: opt-in degradation of lower tiers under load (None: off).
    * ``retries_last``: within a tenant, requests sent again after a refusal wait behind first
      attempts (a retry has already missed its TTFT SLO; a first attempt can still meet it).
    """

    tiers: tuple[TierSpec, ...] = DEFAULT_TIERS
    blind_max_defer_s: float = 1.0
    rate_window_s: float = 60.0
    budget_slow_below: float = 0.2
    budget_pace_s: float = 2.0
    degrade: DegradeConfig | None = None
    cost_ref_tokens: int | None = None
    retries_last: bool = True
    tier_order: dict[str, TierSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("the closed loop needs at least one tier")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {', '.join(names)}")
        for name in ("blind_max_defer_s", "budget_pace_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if not self.rate_window_s > 0:
            raise ValueError(f"rate_window_s must be > 0, got {self.rate_window_s}")
        if not 0 <= self.budget_slow_below < 1:
            raise ValueError(f"budget_slow_below must be in [0, 1), got {self.budget_slow_below}")
        object.__setattr__(self, "tier_order", {t.name: t for t in self.tiers})

    @property
    def lowest(self) -> TierSpec:
        return max(self.tiers, key=lambda t: (t.rank, -t.weight))

    def tier(self, name: str) -> TierSpec:
        """The tier called ``name``; the lowest tier for an unknown or empty name."""
        return self.tier_order.get(name) or self.lowest
