"""Applying one step's plan: the counterpart of vLLM's ``update_from_output``.

Every scheduled request catches up by the tokens it computed; one that caught up samples a
token (emitted at the step's end); one that reached its limit finishes. The O(1) view
counters of the scheduler are kept exact here.
"""

from __future__ import annotations

from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.results import EngineStats, FinishedRequest, StepResult
from tokenomy.engine.retention import Retention
from tokenomy.engine.scheduler import SchedulePlan, Scheduler


class Updater:
    """Applies plans to request progress, KV keys and counters."""

    __slots__ = ("_sched", "_kv", "stats", "_requests", "_retention")

    def __init__(
        self,
        sched: Scheduler,
        kv: KVManager,
        stats: EngineStats,
        requests: dict[str, RequestState],
        retention: Retention,
    ) -> None:
        self._sched = sched
        self._kv = kv
        self.stats = stats
        self._requests = requests
        self._retention = retention

    def apply(self, plan: SchedulePlan, end_s: float, result: StepResult) -> None:
        """Advance every scheduled request by the tokens it computed; sample, finish."""
        sched, kv = self._sched, self._kv
        emitted, first = result.emitted, result.first_token
        done: list[RequestState] = []
        bs = kv.block_size
        caching = kv.caching
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
            emitted.append(req.request_id)
            if nc + 1 >= req.max_num_tokens:
                done.append(req)
        sched.decode_context_tokens += len(plan.decodes)
        self.stats.num_generated_tokens += len(plan.decodes)
        for req, n in plan.prefills:
            if self._apply_chunk(req, n, end_s, result):
                done.append(req)
        self.stats.num_prefill_tokens += plan.prefill_tokens
        if done:
            for req in done:
                result.finished.append(self._finish(req, end_s))
            sched.running = [r for r in sched.running if not r.finished]

    def _apply_chunk(self, req: RequestState, n: int, end_s: float, result: StepResult) -> bool:
        """Apply a prefill chunk; True when the request finished.

        Invariant kept: ``sched.pending_tokens`` includes every unfinished request's contribution.
        """
        sched = self._sched
        sched.pending_tokens -= req.pending_tokens
        start = req.num_computed
        end = start + n
        if start < req.recompute_until:
            req.preempted_recompute_tokens += min(end, req.recompute_until) - start
        req.num_computed = end
        self._kv.commit_full_blocks(req)
        if end == req.num_tokens:
            # Caught up: sample one token.
            req.num_tokens = end + 1
            if req.output_tokens:
                req.max_itl_s = max(req.max_itl_s, end_s - req.last_token_s)
            else:
                req.first_token_s = end_s
                result.first_token.append(req.request_id)
            req.output_tokens += 1
            req.last_token_s = end_s
            result.emitted.append(req.request_id)
            self.stats.num_generated_tokens += 1
        sched.pending_tokens += req.pending_tokens
        if req.num_tokens >= req.max_num_tokens:
            return True
        if req.num_tokens - end == 1 and end >= req.prompt_tokens:
            sched.start_decoding(req)
        return False

    def _finish(self, req: RequestState, end_s: float) -> FinishedRequest:
        sched = self._sched
        if req.decoding:
            sched.stop_decoding(req)
        sched.pending_tokens -= req.pending_tokens
        req.finished = True
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
