"""Service-level objectives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SLO:
    """A request meets its SLO when its TTFT and its TPOT are both within bounds.

    TPOT follows vLLM's definition (excludes the first token). Defaults are the
    DistServe chatbot example scaled for an 8B model; every CLI exposes them.
    """

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0:
            raise ValueError(f"SLO bounds must be positive, got ttft_s={self.ttft_s}, tpot_s={self.tpot_s}")

    def met(self, ttft_s: float, tpot_s: float) -> bool:
        return ttft_s <= self.ttft_s and tpot_s <= self.tpot_s
