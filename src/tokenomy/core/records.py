"""What happened to one request: the input of every metric."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.core.usage import TokenUsage


@dataclass(slots=True)
class RequestRecord:
    """Timestamps (seconds, same clock as ``arrival_s``) and token counts of a finished request.

    ``output_tokens`` counts tokens actually produced. ``max_itl_s`` is the largest gap
    between two consecutive output tokens. ``finished`` is False for a request that was
    cut off (simulation horizon, abort); such requests count against SLO attainment.
    """

    request_id: str
    arrival_s: float
    first_token_s: float | None
    finish_s: float | None
    prompt_tokens: int
    output_tokens: int
    session_id: str = ""
    turn: int = 0
    tenant: str = "default"
    tier: str = ""
    usage: TokenUsage = field(default_factory=TokenUsage)
    max_itl_s: float = 0.0
    preemptions: int = 0
    finished: bool = True
    prefill_instance: str = ""
    decode_instance: str = ""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's TPOT: (E2E - TTFT) / (output_tokens - 1); 0 for one-token answers."""
        if self.first_token_s is None or self.finish_s is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)
