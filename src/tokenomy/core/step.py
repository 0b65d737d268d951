"""The shape of one engine iteration: what the performance model prices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StepShape:
    """Aggregates of one batch that mixes prefill chunks and decode tokens.

    * ``prefill_tokens``: new tokens computed by prefill chunks in this step.
    * ``prefill_seqs``: number of prefill chunks.
    * ``prefill_attn_pairs``: sum over chunks of ``n * (c + (n + 1) / 2)`` for a chunk of
      ``n`` new tokens after ``c`` tokens of context (cached or earlier chunks): the
      query-key pairs of causal attention.
    * ``prefill_context_tokens``: sum over chunks of ``c + n`` (KV read by attention).
    * ``decode_seqs``: sequences that each produce one token.
    * ``decode_context_tokens``: sum of their context lengths (KV read by attention).
    """

    prefill_tokens: int = 0
    prefill_seqs: int = 0
    prefill_attn_pairs: float = 0.0
    prefill_context_tokens: int = 0
    decode_seqs: int = 0
    decode_context_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @staticmethod
    def chunk_attn_pairs(n_new: int, n_context: int) -> float:
        return n_new * (n_context + (n_new + 1) / 2.0)


class StepTimeModel(Protocol):
    """What an engine needs from a performance model."""

    def step_time_s(self, shape: StepShape) -> float:
        """Wall time of one iteration with this batch, in seconds."""
        ...

    def step_flops(self, shape: StepShape) -> float:
        """Useful model FLOPs of this batch (for MFU)."""
        ...
