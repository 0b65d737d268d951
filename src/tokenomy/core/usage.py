"""Token accounting by the whitepaper's classes."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class TokenUsage:
    """Tokens of one request (or a sum of requests), by class.

    Two partitions of the prompt hold at all times:

    * by origin: ``input_tokens + incremental_prefill_tokens + history_tokens == prompt_tokens``
      (new input of a first turn, new input appended by a later turn, context re-sent from
      earlier turns);
    * by work: ``cache_hit_tokens + recomputed_tokens == prompt_tokens`` (KV found in a
      prefix cache or received over a link, versus KV computed by a prefill).

    ``transferred_tokens`` is the part of ``cache_hit_tokens`` whose KV arrived over a link.
    Recomputation after a preemption is counted in ``preempted_recompute_tokens`` only, so
    the partitions stay exact.
    """

    input_tokens: int = 0
    incremental_prefill_tokens: int = 0
    history_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
    recomputed_tokens: int = 0
    transferred_tokens: int = 0
    preempted_recompute_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.incremental_prefill_tokens + self.history_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def add(self, other: TokenUsage) -> None:
        # Field by field, not a getattr/setattr loop over __slots__ (a summary adds one per request:
        # the loop cost 3 us a call). tests/metrics/test_usage.py checks that every field is added.
        self.input_tokens += other.input_tokens
        self.incremental_prefill_tokens += other.incremental_prefill_tokens
        self.history_tokens += other.history_tokens
        self.output_tokens += other.output_tokens
        self.cache_hit_tokens += other.cache_hit_tokens
        self.recomputed_tokens += other.recomputed_tokens
        self.transferred_tokens += other.transferred_tokens
        self.preempted_recompute_tokens += other.preempted_recompute_tokens

    def check(self) -> None:
        """Raise if the two prompt partitions disagree."""
        if self.cache_hit_tokens + self.recomputed_tokens != self.prompt_tokens:
            raise AssertionError(
                f"cache_hit {self.cache_hit_tokens} + recomputed {self.recomputed_tokens} "
                f"!= prompt {self.prompt_tokens}"
            )

    def to_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["prompt_tokens"] = self.prompt_tokens
        return d
