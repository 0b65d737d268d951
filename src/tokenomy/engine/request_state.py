"""An engine's private progress record of one request.

Progress is two counters, as in vLLM v1: ``num_tokens`` (prompt plus output tokens that exist)
and ``num_computed`` (tokens whose KV is in the blocks). A step computes up to
``num_tokens - num_computed`` tokens; when it catches up, one token is sampled
(``num_tokens += 1``). There is no prefill/decode code path, only this catching up.
"""

from __future__ import annotations

from tokenomy.core import Request
from tokenomy.engine.block_ids import BlockIds
from tokenomy.engine.block_keys import KeyChain


class RequestState:
    """Mutable per-request state; the engine never mutates the :class:`Request` itself."""

    __slots__ = (
        "request",
        "request_id",
        "uid",
        "prompt_tokens",
        "num_tokens",
        "max_num_tokens",
        "num_computed",
        "blocks",
        "num_keyed_blocks",
        "chain",
        "own_keys",
        "preload_credit",
        "prefill_only",
        "decoding",
        "admitted",
        "finished",
        "retain",
        "output_tokens",
        "first_token_s",
        "last_token_s",
        "max_itl_s",
        "cache_hit_tokens",
        "transferred_tokens",
        "recomputed_tokens",
        "recompute_until",
        "preempted_recompute_tokens",
        "num_preemptions",
        "continuation",
        "admit_blocked",
        "chunk_cap",
    )

    def __init__(
        self,
        request: Request,
        uid: int,
        *,
        chain: KeyChain | None,
        preloaded_tokens: int,
        emitted_tokens: int,
        prefill_only: bool,
        chunk_cap: int = 0,
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.uid = uid
        self.prompt_tokens = request.prompt_tokens
        self.num_tokens = request.prompt_tokens + emitted_tokens
        final = request.prompt_tokens + request.max_output_tokens
        self.max_num_tokens = min(final, self.num_tokens + 1) if prefill_only else final
        self.num_computed = 0
        self.blocks = BlockIds()
        self.num_keyed_blocks = 0  # leading blocks already registered in the prefix cache
        self.chain = chain
        self.own_keys: list[int] = []  # keys of full blocks past the content's coverage
        # KV that arrives from elsewhere on first admission; at least one token is always computed.
        self.preload_credit = min(preloaded_tokens, self.num_tokens - 1)
        self.prefill_only = prefill_only
        self.decoding = False  # running, prompt done, exactly one token to compute per step
        self.admitted = False
        self.finished = False
        self.retain = False
        self.output_tokens = 0  # emitted by this instance
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.max_itl_s = 0.0
        self.cache_hit_tokens = 0
        self.transferred_tokens = 0
        self.recomputed_tokens = 0
        self.recompute_until = 0  # tokens below this were computed once before a preemption
        self.preempted_recompute_tokens = 0
        self.num_preemptions = 0
        self.continuation = False  # queued ahead of not-yet-started requests (Engine.add_request)
        self.admit_blocked: tuple[int, tuple[int, int, int] | None, int, bool] | None = None  # see KVManager.still_blocked
        self.chunk_cap = chunk_cap  # > 0: most prompt tokens computed per step (Engine.add_request)

    @property
    def pending_tokens(self) -> int:
        """Tokens to compute before the request decodes (0 while decoding)."""
        if self.decoding or self.finished:
            return 0
        return self.num_tokens - self.num_computed - self.preload_credit
