"""Factories for metrics tests."""

from __future__ import annotations

from typing import Any

from tokenomy.core import RequestRecord, TokenUsage


def make_record(
    request_id: str = "r0",
    *,
    arrival_s: float = 0.0,
    ttft_s: float | None = 0.5,
    tpot_s: float = 0.05,
    output_tokens: int = 11,
    prompt_tokens: int = 100,
    finished: bool = True,
    **kwargs: Any,
) -> RequestRecord:
    """A record with the given TTFT and TPOT (vLLM definition: the first token excluded)."""
    first = None if ttft_s is None else arrival_s + ttft_s
    finish = None if first is None or not finished else first + tpot_s * max(output_tokens - 1, 0)
    usage = kwargs.pop("usage", None) or TokenUsage(
        input_tokens=prompt_tokens, output_tokens=output_tokens, recomputed_tokens=prompt_tokens
    )
    return RequestRecord(
        request_id=request_id,
        arrival_s=arrival_s,
        first_token_s=first,
        finish_s=finish,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        finished=finished,
        usage=usage,
        **kwargs,
    )
