"""The gateway's closed-loop admission settings (``ops.admission.closed_loop``), docs/closed-loop.md."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenomy.policy.closedloop import ADMISSION_POLICIES, ClosedLoopConfig, DegradeConfig, TierSpec


class TierBinding(BaseModel):
    """A tier of the closed loop and the least key priority that puts a key in it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1)
    min_priority: int = Field(default=0, ge=0, le=100)
    weight: float | None = Field(default=None, gt=0, description="None: the policy's default for this name")
    max_defer_s: float | None = Field(default=None, ge=0)
    max_load_fraction: float | None = Field(default=None, gt=0, le=1)


class DegradeSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    load_fraction: float = Field(default=0.9, gt=0, le=1)
    from_rank: int = Field(default=1, ge=0)
    max_tokens_cap: int | None = Field(default=256, ge=1)
    long_prompt_tokens: int | None = Field(default=16_384, ge=1)


class ClosedLoopSettings(BaseModel):
    """A closed-loop admission policy by name and its parameters (defaults: the policy's labelled ones)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    policy: str = Field(default="tier_wfq", description="an ADMISSION_POLICIES name: tier_wfq | fifo")
    tiers: tuple[TierBinding, ...] = (TierBinding(name="gold", min_priority=20),
                                      TierBinding(name="silver", min_priority=10),
                                      TierBinding(name="free", min_priority=0))
    degrade: DegradeSettings | None = None
    budget_slow_below: float = Field(default=ClosedLoopConfig.budget_slow_below, ge=0, lt=1)
    budget_pace_s: float = Field(default=ClosedLoopConfig.budget_pace_s, ge=0)
    blind_max_defer_s: float = Field(default=ClosedLoopConfig.blind_max_defer_s, ge=0)
    retries_last: bool = Field(default=ClosedLoopConfig.retries_last,
                               description="a request's retries wait behind its tenant's first attempts")

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        ADMISSION_POLICIES.get(v)  # ValueError naming the known ones
        return v


def closed_loop_config(s: ClosedLoopSettings) -> ClosedLoopConfig:
    """The policy's config from the gateway's settings: tiers ranked by ``min_priority`` (highest
    first); a tier named like a default tier takes that tier's unset values."""
    defaults = {t.name: t for t in ClosedLoopConfig().tiers}
    ranked = sorted(s.tiers, key=lambda t: -t.min_priority)
    degrade = s.degrade
    specs = []
    for rank, t in enumerate(ranked):
        base = defaults.get(t.name) or ClosedLoopConfig().lowest
        specs.append(TierSpec(t.name, rank, t.weight or base.weight,
                              base.max_defer_s if t.max_defer_s is None else t.max_defer_s,
                              t.max_load_fraction or base.max_load_fraction))
    deg = None if degrade is None else DegradeConfig(degrade.load_fraction, degrade.from_rank, degrade.max_tokens_cap,
                                                     degrade.long_prompt_tokens)
    return ClosedLoopConfig(tiers=tuple(specs) or ClosedLoopConfig().tiers, degrade=deg,
                            budget_slow_below=s.budget_slow_below, budget_pace_s=s.budget_pace_s,
                            blind_max_defer_s=s.blind_max_defer_s, retries_last=s.retries_last)
