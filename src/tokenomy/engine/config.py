"""Configuration of one engine instance (vLLM's scheduler and cache options)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity and batching knobs of one instance, named after their vLLM counterparts.

    * ``num_gpu_blocks``: KV-cache blocks the instance has (``--num-gpu-blocks-override``).
    * ``block_size_tokens``: tokens per KV block (``--block-size``).
    * ``max_num_batched_tokens``: token budget of one step, prefill chunks plus decodes.
    * ``max_num_seqs``: most requests in the running batch.
    * ``enable_prefix_caching``: reuse full blocks whose content matches (chained block keys).
    * ``enable_chunked_prefill``: False schedules a prompt whole or not at all.
    * ``long_prefill_token_threshold``: > 0 caps the tokens one request computes per step.
    """

    num_gpu_blocks: int
    block_size_tokens: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "block_size_tokens", "max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"EngineConfig.long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}"
            )
        if self.long_prefill_token_threshold > 0 and not self.enable_chunked_prefill:
            raise ValueError(
                "EngineConfig.long_prefill_token_threshold > 0 needs enable_chunked_prefill=True: "
                "a capped prompt that may not be chunked could never be scheduled"
            )

    @property
    def total_kv_tokens(self) -> int:
        """Tokens of KV the instance can hold."""
        return self.num_gpu_blocks * self.block_size_tokens
