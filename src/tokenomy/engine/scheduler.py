"""Deciding one step: which requests compute how many tokens, vLLM v1 style.

Running requests go first, in admission order: a decoding request costs one token, one still
prefilling gets a chunk. When a running request cannot get a block, the most recently admitted
running request is preempted (its blocks are freed but stay cached, its progress resets, it goes
to the head of the waiting queue) until the block fits or the request preempted itself. Then,
if nothing was preempted, waiting requests are admitted in FCFS order while the token budget,
``max_num_seqs`` and the free blocks allow; the first one that does not fit stops admission.

Scheduling takes KV blocks (like vLLM's ``schedule()``); the engine applies the computed
tokens afterwards (``update_from_output``).
"""

from __future__ import annotations

from tokenomy.core import StepShape
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.queues import RequestQueues
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.results import EngineStats


class SchedulePlan:
    """What one step computes. ``prefills`` pairs a request with its chunk size in tokens.

    A plain slotted class, built once per step: cheaper than a dataclass with factories.
    """

    __slots__ = (
        "decodes",
        "prefills",
        "preempted",
        "admitted",
        "prefill_tokens",
        "prefill_attn_pairs",
        "prefill_context_tokens",
        "decode_context_tokens",
    )

    def __init__(self) -> None:
        self.decodes: list[RequestState] = []
        self.prefills: list[tuple[RequestState, int]] = []
        self.preempted: list[RequestState] = []
        self.admitted: list[tuple[RequestState, int]] = []  # (request, prefix-cache hit tokens)
        self.prefill_tokens = 0
        self.prefill_attn_pairs = 0.0
        self.prefill_context_tokens = 0
        self.decode_context_tokens = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return self.prefill_tokens + len(self.decodes)

    def shape(self) -> StepShape:
        return StepShape(
            self.prefill_tokens,
            len(self.prefills),
            self.prefill_attn_pairs,
            self.prefill_context_tokens,
            len(self.decodes),
            self.decode_context_tokens,
        )


class Scheduler:
    """Decides each step over the instance's queues; changes them only through :class:`RequestQueues`."""

    def __init__(self, config: EngineConfig, kv: KVManager, stats: EngineStats, queues: RequestQueues) -> None:
        self.config = config
        self.kv = kv
        self.stats = stats
        self.queues = queues

    def _preempt_last(self) -> RequestState:
        """Preempt the most recently admitted running request and drop its KV (blocks stay cached)."""
        req = self.queues.preempt_last()
        self.kv.free(req)
        self.stats.num_preemptions += 1
        return req

    # ---- the decision -----------------------------------------------------------------------
    def schedule(self) -> SchedulePlan:
        plan = SchedulePlan()
        budget = self._schedule_running(plan, self.config.max_num_batched_tokens)
        if self.queues.waiting and not plan.preempted:
            self._schedule_waiting(plan, budget)
        return plan

    def _grow_or_preempt(self, req: RequestState, num_tokens_with_kv: int, plan: SchedulePlan) -> bool:
        """Room for the request's next tokens, preempting from the back of running; False if it was itself preempted."""
        while not self.kv.grow(req, num_tokens_with_kv):
            victim = self._preempt_last()
            plan.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _schedule_running(self, plan: SchedulePlan, budget: int) -> int:
        running, decodes = self.queues.running, plan.decodes
        threshold = self.config.long_prefill_token_threshold
        bs = self.kv.block_size
        dctx = 0
        # A preemption pops running's tail: iterating the list itself then stops before the victims.
        for req in running:
            if budget <= 0:
                break
            nc = req.num_computed
            if req.decoding:
                # Hot path: one token; a block only when crossing a block boundary.
                if nc >= len(req.blocks) * bs and not self._grow_or_preempt(req, nc + 1, plan):
                    break
                decodes.append(req)
                dctx += nc + 1
                budget -= 1
                continue
            n = req.num_tokens - nc
            if threshold and n > threshold:
                n = threshold
            cap = req.chunk_cap  # the most prompt tokens it computes a step (0: no cap)
            if cap and n > cap:
                n = cap
            if n > budget:
                n = budget
            if not self._grow_or_preempt(req, nc + n, plan):
                break
            self._add_prefill(plan, req, n)
            budget -= n
        plan.decode_context_tokens += dctx
        return budget

    def _schedule_waiting(self, plan: SchedulePlan, budget: int) -> None:
        cfg, kv, queues = self.config, self.kv, self.queues
        waiting, running = queues.waiting, queues.running
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.admit_blocked is not None and kv.still_blocked(req.admit_blocked, budget):
                break
            hits = kv.find_hits(req)
            hit_tokens = len(hits) * kv.block_size
            start = max(hit_tokens, req.preload_credit)
            n = req.num_tokens - start
            if cfg.long_prefill_token_threshold and n > cfg.long_prefill_token_threshold:
                n = cfg.long_prefill_token_threshold
            cap = req.chunk_cap  # the most prompt tokens it computes a step (0: no cap)
            if cap and n > cap:
                n = cap
            if n > budget and not cfg.enable_chunked_prefill:
                req.admit_blocked = kv.blocked_state(req, len(hits), n, over_budget=True)
                break
            n = min(n, budget)
            if not kv.admit(req, hits, start + n):
                req.admit_blocked = kv.blocked_state(req, len(hits), n, over_budget=False)
                break
            req.admit_blocked = None
            queues.admit_head()
            plan.admitted.append((req, hit_tokens))
            self._account_admission(req, hit_tokens, start)
            if n == 1 and start >= req.prompt_tokens and req.num_tokens - start == 1:
                queues.start_decoding(req)
                plan.decodes.append(req)
                plan.decode_context_tokens += start + 1
            else:
                self._add_prefill(plan, req, n)
            budget -= n

    def _account_admission(self, req: RequestState, hit_tokens: int, start: int) -> None:
        """Set the request's progress to ``start`` and split its prompt by origin on first admission."""
        if self.kv.caching:
            self.stats.prefix_cache_queries_tokens += req.num_tokens
            self.stats.prefix_cache_hits_tokens += hit_tokens
        if not req.admitted:
            req.admitted = True
            prompt = req.prompt_tokens
            req.cache_hit_tokens = min(hit_tokens, prompt)
            req.transferred_tokens = max(0, min(req.preload_credit, prompt) - req.cache_hit_tokens)
            req.recomputed_tokens = prompt - req.cache_hit_tokens - req.transferred_tokens
        elif start > hit_tokens:
            raise AssertionError("a re-admitted request has no preloaded KV")  # preload_credit was reset
        self.queues.set_progress(req, start)
        self.kv.commit_full_blocks(req)  # preloaded blocks hold real KV: make them findable

    @staticmethod
    def _add_prefill(plan: SchedulePlan, req: RequestState, n: int) -> None:
        nc = req.num_computed
        plan.prefills.append((req, n))
        plan.prefill_tokens += n
        plan.prefill_attn_pairs += n * (nc + (n + 1) / 2.0)
        plan.prefill_context_tokens += nc + n
