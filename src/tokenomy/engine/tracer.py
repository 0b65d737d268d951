"""Turns one engine's state changes into :mod:`tokenomy.engine.trace` events.

Only built when the engine was given an active trace: without one, none of this runs. The
field names are the schema documented in ``docs/simulator.md`` ("Event trace").
"""

from __future__ import annotations

from tokenomy.core import Request, StepShape
from tokenomy.engine.results import FinishedRequest
from tokenomy.engine.scheduler import SchedulePlan
from tokenomy.engine.trace import EventTrace


class Tracer:
    """Emits the events of one instance to ``trace``."""

    __slots__ = ("_emit", "_instance")

    def __init__(self, trace: EventTrace, instance_id: str) -> None:
        self._emit = trace.emit
        self._instance = instance_id

    def queued(self, now: float, request: Request, preloaded_tokens: int, continuation: bool) -> None:
        self._emit({
            "t_s": now, "kind": "queued", "instance": self._instance, "request": request.request_id,
            "prompt_tokens": request.prompt_tokens, "max_output_tokens": request.max_output_tokens,
            "preloaded_tokens": preloaded_tokens, "continuation": continuation,
        })

    def scheduled(self, now: float, plan: SchedulePlan, evicted_blocks: int) -> None:
        """What scheduling one step changed: preemptions, admissions, then evictions (all at ``now``)."""
        emit, instance = self._emit, self._instance
        for req in plan.preempted:
            emit({
                "t_s": now, "kind": "preempt", "instance": instance, "request": req.request_id,
                "num_preemptions": req.num_preemptions, "recompute_tokens": req.recompute_until,
            })
        for req, hit_tokens in plan.admitted:
            emit({
                "t_s": now, "kind": "admit", "instance": instance, "request": req.request_id,
                "prompt_tokens": req.prompt_tokens, "cache_hit_tokens": hit_tokens,
                "computed_tokens": req.num_computed, "readmission": req.num_preemptions > 0,
            })
        self.evicted(now, evicted_blocks)

    def evicted(self, now: float, evicted_blocks: int) -> None:
        if evicted_blocks:
            self._emit({"t_s": now, "kind": "evict", "instance": self._instance, "blocks": evicted_blocks})

    def step(
        self, now: float, duration_s: float, shape: StepShape, emitted: int, running: int, waiting: int,
        free_blocks: int,
    ) -> None:
        self._emit({
            "t_s": now, "kind": "step", "instance": self._instance, "duration_s": duration_s,
            "prefill_tokens": shape.prefill_tokens, "prefill_seqs": shape.prefill_seqs,
            "decode_seqs": shape.decode_seqs, "decode_context_tokens": shape.decode_context_tokens,
            "emitted": emitted, "running": running, "waiting": waiting, "free_blocks": free_blocks,
        })

    def finished(self, fin: FinishedRequest) -> None:
        self._emit({
            "t_s": fin.finish_s, "kind": "abort" if fin.aborted else "finish", "instance": self._instance,
            "request": fin.request_id, "output_tokens": fin.output_tokens, "first_token_s": fin.first_token_s,
            "cache_hit_tokens": fin.cache_hit_tokens, "num_preemptions": fin.num_preemptions,
        })
