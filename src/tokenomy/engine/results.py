"""What an engine step reports back: value objects, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.core import StepShape


@dataclass(slots=True)
class FinishedRequest:
    """A request that left this instance (completed, or aborted).

    Token counts concern this instance only. The first admission splits the prompt exactly:
    ``cache_hit_tokens + transferred_tokens + recomputed_tokens == prompt_tokens``; work redone
    after preemptions is counted apart, in ``preempted_recompute_tokens``.
    """

    request_id: str
    output_tokens: int
    first_token_s: float | None
    finish_s: float
    max_itl_s: float
    cache_hit_tokens: int
    transferred_tokens: int
    recomputed_tokens: int
    preempted_recompute_tokens: int
    num_preemptions: int
    aborted: bool = False


@dataclass(slots=True)
class StepResult:
    """One engine iteration that started at ``start_s`` and ends at ``end_s``.

    Everything listed happens at ``end_s``: each id in ``emitted`` produced one output token
    then, ``finished`` requests completed then. ``preempted`` lists ids whose KV was dropped
    while scheduling this step (they went back to the waiting queue).
    """

    start_s: float
    duration_s: float
    shape: StepShape
    flops: float
    emitted: list[str] = field(default_factory=list)
    first_token: list[str] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters of one instance, with vLLM's metric semantics.

    ``prefix_cache_queries_tokens`` grows by a request's token count each time it is admitted
    with prefix caching on (re-admissions after preemption included), ``prefix_cache_hits_tokens``
    by the tokens found cached then (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``).
    """

    num_preemptions: int = 0
    prefix_cache_queries_tokens: int = 0
    prefix_cache_hits_tokens: int = 0
    num_steps: int = 0
    num_generated_tokens: int = 0
    num_prefill_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queries_tokens
        return self.prefix_cache_hits_tokens / q if q else 0.0
