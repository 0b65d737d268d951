"""MoE block configuration and named presets.

A preset is a tiny model with the *shape* of a real family (DeepSeek-V3: sigmoid scoring, top-k
renormalised, one shared expert; Mixtral: softmax scoring, top-2, no shared expert), small enough to
run many servers on a laptop CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Scoring = Literal["softmax", "sigmoid"]
SCORINGS: tuple[Scoring, ...] = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEConfig:
    """Shape of one MoE block.

    ``moe_intermediate`` is the inner width of one routed expert; the shared expert (if any) has
    width ``moe_intermediate * n_shared_experts`` as in DeepSeek-V3. ``routed_scaling`` multiplies
    the combined routed output (DeepSeek-V3 uses 2.5; 1.0 means none).
    """

    hidden: int
    moe_intermediate: int
    n_experts: int
    top_k: int
    n_shared_experts: int = 0
    norm_topk_prob: bool = True
    scoring: Scoring = "softmax"
    routed_scaling: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hidden", "moe_intermediate", "n_experts", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoEConfig.top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if self.n_shared_experts < 0:
            raise ValueError(f"MoEConfig.n_shared_experts must be >= 0, got {self.n_shared_experts}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"unknown scoring {self.scoring!r}; known: {', '.join(SCORINGS)}")
        if self.routed_scaling <= 0:
            raise ValueError(f"MoEConfig.routed_scaling must be > 0, got {self.routed_scaling}")


PRESETS: dict[str, MoEConfig] = {
    "deepseek-tiny": MoEConfig(
        hidden=64, moe_intermediate=32, n_experts=16, top_k=4, n_shared_experts=1,
        norm_topk_prob=True, scoring="sigmoid",
    ),
    "mixtral-tiny": MoEConfig(
        hidden=64, moe_intermediate=128, n_experts=8, top_k=2, n_shared_experts=0,
        norm_topk_prob=True, scoring="softmax",
    ),
}


def preset(name: str, **overrides: object) -> MoEConfig:
    """Return the named preset, optionally with fields replaced; unknown names list the known ones."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown MoE preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
    return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]
