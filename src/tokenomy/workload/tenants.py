"""Tenants in workloads: a mix of tiers (``gold:0.2,silver:0.3,free:0.5``) assigned to sessions.

A mix entry is ``TIER:SHARE`` or ``TIER:SHARE:N`` (N tenants of that tier, named ``TIER-0`` ..
``TIER-{N-1}``; one tenant named ``TIER`` by default). Shares are normalised to sum to 1. Each
session draws its tier from the shares and, within the tier, one of its tenants uniformly; the
draw is a pure function of the seed and the session's index, so the same ``--seed`` gives the
same assignment whatever else changed. A session that already names a tenant (a session file
that carries them) keeps it: :func:`assign_tenants` fills only sessions of tenant ``"default"``.
Tenant-wide budgets and rate limits come from :class:`TenantMix` entries (none by default).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenomy.core import Session


@dataclass(frozen=True)
class TierShare:
    """One entry of a mix: ``share`` of the sessions go to ``tenants`` tenants of ``tier``."""

    tier: str
    share: float
    tenants: int = 1
    budget_tokens: int | None = None
    rate_limit_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if not self.tier or any(c in self.tier for c in ":,= "):
            raise ValueError(f"tier name must be non-empty without ':', ',', '=' or spaces, got {self.tier!r}")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"tier {self.tier!r}: share must be a finite number > 0, got {self.share}")
        if self.tenants < 1:
            raise ValueError(f"tier {self.tier!r}: tenants must be >= 1, got {self.tenants}")

    def tenant_names(self) -> list[str]:
        return [self.tier] if self.tenants == 1 else [f"{self.tier}-{i}" for i in range(self.tenants)]


@dataclass(frozen=True)
class TenantMix:
    """Tiers and their shares of the sessions (module docstring)."""

    tiers: tuple[TierShare, ...]

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("a tenant mix needs at least one tier")
        names = [t.tier for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"a tenant mix names a tier twice: {', '.join(names)}")

    @classmethod
    def parse(cls, text: str) -> TenantMix:
        """``gold:0.2,silver:0.3,free:0.5`` (optionally ``TIER:SHARE:N``); ValueError naming the bad entry."""
        entries: list[TierShare] = []
        for raw in (e.strip() for e in text.split(",")):
            if not raw:
                continue
            parts = raw.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(f"--tenants entry {raw!r}: expected TIER:SHARE or TIER:SHARE:TENANTS")
            try:
                share = float(parts[1])
                n = int(parts[2]) if len(parts) == 3 else 1
            except ValueError:
                raise ValueError(f"--tenants entry {raw!r}: SHARE must be a number, TENANTS an integer") from None
            try:
                entries.append(TierShare(parts[0], share, n))
            except ValueError as exc:
                raise ValueError(f"--tenants entry {raw!r}: {exc}") from None
        if not entries:
            raise ValueError(f"--tenants {text!r}: no entries; expected e.g. gold:0.2,silver:0.3,free:0.5")
        return cls(tuple(entries))

    def to_text(self) -> str:
        return ",".join(f"{t.tier}:{t.share:g}" + (f":{t.tenants}" if t.tenants > 1 else "") for t in self.tiers)


def assign_tenants(sessions: Sequence[Session], mix: TenantMix, seed: int = 0) -> list[Session]:
    """``sessions`` with a tenant and tier drawn from ``mix`` for each session of tenant ``"default"``."""
    shares = np.array([t.share for t in mix.tiers], dtype=np.float64)
    cum = np.cumsum(shares / shares.sum())
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7E4A47]))
    draws = rng.random((len(sessions), 2))
    out: list[Session] = []
    for s, (u_tier, u_tenant) in zip(sessions, draws, strict=True):
        if s.tenant != "default":
            out.append(s)
            continue
        entry = mix.tiers[min(int(np.searchsorted(cum, u_tier, side="right")), len(mix.tiers) - 1)]
        names = entry.tenant_names()
        tenant = names[min(int(u_tenant * len(names)), len(names) - 1)]
        out.append(dataclasses.replace(s, tenant=tenant, tier=entry.tier, budget_tokens=entry.budget_tokens,
                                       rate_limit_tokens_per_s=entry.rate_limit_tokens_per_s))
    return out
