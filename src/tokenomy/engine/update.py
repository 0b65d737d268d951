"""Applying one step's plan: the counterpart of vLLM's ``update_from_output``.

Every scheduled request catches up by the tokens it computed; one that caught up samples a
token (emitted at the step's end); one that reached its limit finishes. Progress that the view
counters depend on goes through :class:`RequestQueues`, which keeps them exact.
"""

from __future__ import annotations

from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.queues import RequestQueues
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.results import EngineStats, FinishedRequest, StepResult
from tokenomy.engine.retention import Retention
from tokenomy.engine.scheduler import SchedulePlan


class Updater:
    """Applies plans to request progress, KV keys and counters."""

    __slots__ = ("_queues", "_kv", "stats", "_requests", "_retention")

    def __init__(
        self,
        queues: RequestQueues,
        kv: KVManager,
        stats: EngineStats,
        requests: dict[str, RequestState],
        retention: Retention,
    ) -> None:
        self._queues = queues
        self._kv = kv
        self.stats = stats
        self._requests = requests
        self._retention = retention

    def apply(self, plan: SchedulePlan, end_s: float, result: StepResult) -> None:
        """Advance every scheduled request by the tokens it computed; sample, finish."""
        queues, kv = self._queues, self._kv
        emitted, first = result.emitted, result.first_token
        done: list[RequestState] = []
        bs = kv.block_size
        caching = kv.caching
        # Decoding requests advance here, not through ``queues`` (the hot loop): it is told the total.
        # Every decode emits a token, in plan order, ahead of the prefills' first tokens.
        emitted += [req.request_id for req in plan.decodes]
        for req in plan.decodes:
            nc = req.num_computed + 1
            req.num_computed = nc
            if caching and nc % bs == 0:
                kv.commit_full_blocks(req)
            req.num_tokens = nc + 1
            if req.output_tokens:
                gap = end_s - req.last_token_s
                if gap > req.max_itl_s:
                    req.max_itl_s = gap
            else:
                req.first_token_s = end_s
                first.append(req.request_id)
            req.output_tokens += 1
            req.last_token_s = end_s
            if nc + 1 >= req.max_num_tokens:
                done.append(req)
        queues.advance_decodes(len(plan.decodes))
        self.stats.num_generated_tokens += len(plan.decodes)
        for req, n in plan.prefills:
            if self._apply_chunk(req, n, end_s, result):
                done.append(req)
        self.stats.num_prefill_tokens += plan.prefill_tokens
        if done:
            for req in done:
                result.finished.append(self._finish(req, end_s))
            queues.drop_finished()

    def _apply_chunk(self, req: RequestState, n: int, end_s: float, result: StepResult) -> bool:
        """Apply a prefill chunk; True when the request finished."""
        start = req.num_computed
        end = start + n
        if start < req.recompute_until:
            req.preempted_recompute_tokens += min(end, req.recompute_until) - start
        sampled = self._queues.compute_chunk(req, n)
        self._kv.commit_full_blocks(req)
        if sampled:
            if req.output_tokens:
                req.max_itl_s = max(req.max_itl_s, end_s - req.last_token_s)
            else:
                req.first_token_s = end_s
                result.first_token.append(req.request_id)
            req.output_tokens += 1
            req.last_token_s = end_s
            result.emitted.append(req.request_id)
            self.stats.num_generated_tokens += 1
        return req.num_tokens >= req.max_num_tokens

    def _finish(self, req: RequestState, end_s: float) -> FinishedRequest:
        self._queues.finish(req)
        del self._requests[req.request_id]
        self._retention.on_finish(req)
        return finished_record(req, end_s, aborted=False)


def finished_record(req: RequestState, finish_s: float, *, aborted: bool) -> FinishedRequest:
    return FinishedRequest(
        request_id=req.request_id,
        output_tokens=req.output_tokens,
        first_token_s=req.first_token_s,
        finish_s=finish_s,
        max_itl_s=req.max_itl_s,
        cache_hit_tokens=req.cache_hit_tokens,
        transferred_tokens=req.transferred_tokens,
        recomputed_tokens=req.recomputed_tokens,
        preempted_recompute_tokens=req.preempted_recompute_tokens,
        num_preemptions=req.num_preemptions,
        aborted=aborted,
    )
