"""The cost model policies price their options with.

The perf team's ``PerfModel`` satisfies this protocol; tests use a hand-written linear fake.
Policies only ever call these members, so any object providing them (a fitted model, a
lookup table of measured profiles) can drive the same decisions.
"""

from __future__ import annotations

from typing import Protocol

from tokenomy.core import StepShape


class Estimator(Protocol):
    """Seconds that work takes on one instance, and KV size per token."""

    def prefill_time_s(self, n_new_tokens: int, n_cached_tokens: int = 0) -> float:
        """Time to prefill ``n_new_tokens`` after ``n_cached_tokens`` of context, alone in one step."""
        ...

    def decode_step_time_s(self, batch_size: int, mean_context_tokens: float) -> float:
        """Time of one decode step of ``batch_size`` sequences of mean context ``mean_context_tokens``."""
        ...

    def step_time_s(self, shape: StepShape) -> float:
        """Time of one mixed iteration (prefill chunks and decode tokens)."""
        ...

    def chunk_step_time_s(self, n_new_tokens: int, n_context_tokens: int, decode_seqs: int,
                          decode_context_tokens: int) -> float:
        """:meth:`step_time_s` of one prefill chunk of ``n_new_tokens`` after ``n_context_tokens`` beside
        ``decode_seqs`` decodes holding ``decode_context_tokens`` tokens of context, without building
        the :class:`StepShape` (policies price many such steps per decision)."""
        ...

    def kv_transfer_time_s(self, n_tokens: int, link_bytes_per_s: float | None = None) -> float:
        """Time to move the KV of ``n_tokens`` over a link (the model's default link when None)."""
        ...

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers of one instance."""
        ...
