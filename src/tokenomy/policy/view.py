"""Read-only views of the cluster that policies decide on.

The simulator and the live gateway both hand policies objects satisfying these
protocols; a policy never sees the simulator, an engine's internals or a clock.
"""

from __future__ import annotations

from typing import Protocol

from tokenomy.core import Role, Segment


class InstanceView(Protocol):
    """What a policy may read about one engine instance, at the moment of deciding."""

    @property
    def instance_id(self) -> str: ...

    @property
    def role(self) -> Role: ...

    @property
    def num_running(self) -> int:
        """Requests in the running batch (prefilling or decoding)."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests admitted to the instance but not yet scheduled."""
        ...

    @property
    def num_waiting_tokens(self) -> int:
        """Prompt tokens still to compute, over waiting and running requests.

        Includes the prefill chunks of the step in flight until that step ends.
        """
        ...

    @property
    def num_decoding(self) -> int:
        """Running requests past their prefill (each emits one token per step)."""
        ...

    @property
    def decode_context_tokens(self) -> int:
        """Sum of the context lengths of the decoding requests."""
        ...

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks held by requests (0-1), like ``vllm:kv_cache_usage_perc``."""
        ...

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request (cached-but-free blocks count as free)."""
        ...

    @property
    def total_blocks(self) -> int: ...

    @property
    def block_size_tokens(self) -> int: ...

    def cached_prefix_tokens(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        """Prompt tokens of a request with this content that would hit this instance's prefix cache now."""
        ...
