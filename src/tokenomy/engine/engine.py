"""One inference engine instance: continuous batching over paged KV with prefix caching.

Clock-agnostic: every call is given ``now``; the engine never reads a clock nor sleeps, so the
simulator (virtual clock) and the emulator (wall clock) drive the same object. A step's effects
are applied when ``step`` returns, and stamped with the step's end time.

Collaborators (one owner per piece of state): :class:`RequestQueues` owns the queues and the load
counters routers read, :class:`KVManager` the blocks, :class:`Retention` pinned blocks;
:class:`Scheduler` decides a step, :class:`Updater` and :class:`DecodeRunner` apply steps.

One unit on purpose: it owns the guards every public call checks (no step before the last ended,
no change while a decode run is open) and delegates the rest; a split would part guards from calls.
"""

from __future__ import annotations

import logging
from bisect import bisect_right

from tokenomy.core import Request, Role, Segment, StepTimeModel
from tokenomy.engine.block_keys import KeyChainCache
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.decode_run import DecodeRun, DecodeRunner
from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.queues import RequestQueues
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.results import EngineStats, FinishedRequest, StepResult
from tokenomy.engine.retention import Retention
from tokenomy.engine.scheduler import Scheduler
from tokenomy.engine.tpot_bank import tpot_bank_s
from tokenomy.engine.trace import EventTrace, active
from tokenomy.engine.tracer import Tracer
from tokenomy.engine.update import Updater, finished_record

logger = logging.getLogger(__name__)


class Engine:
    """A vLLM-v1-like instance. Satisfies :class:`tokenomy.policy.view.InstanceView`.

    ``key_chains``: where content key chains are memoised; each engine makes its own unless one
    is given (engines driven from one thread may share one, so a router's lookups on every
    instance hash a prompt once). ``trace``: where to report events (see
    :mod:`tokenomy.engine.trace`); None, the default, costs nothing.
    """

    def __init__(
        self,
        instance_id: str,
        config: EngineConfig,
        perf: StepTimeModel,
        role: Role = Role.MIXED,
        *,
        key_chains: KeyChainCache | None = None,
        trace: EventTrace | None = None,
    ) -> None:
        self._instance_id = instance_id
        self._role = Role(role)
        self.config = config
        self.perf = perf
        self.stats = EngineStats()
        self._kv = KVManager(
            config.num_gpu_blocks, config.block_size_tokens, config.enable_prefix_caching, key_chains
        )
        self._queues = RequestQueues()
        self._sched = Scheduler(config, self._kv, self.stats, self._queues)
        self._requests: dict[str, RequestState] = {}
        self._retention = Retention(self._kv)
        self._updater = Updater(self._queues, self._kv, self.stats, self._requests, self._retention)
        self._runner = DecodeRunner(config, self._queues, self._kv, self.stats, perf)
        sink = active(trace)
        self._tracer = Tracer(sink, instance_id) if sink is not None else None
        self._run: DecodeRun | None = None
        self._next_uid = 0
        self._busy_until = float("-inf")
        # Prefill tokens of the step in flight: applied at its start, still to compute until it
        # ends, so views count them (a router must not see a prefilling instance as idle).
        self._step_prefill_tokens = 0

    # ---- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request: Request,
        now: float,
        *,
        preloaded_tokens: int = 0,
        emitted_tokens: int = 0,
        prefill_only: bool = False,
        continuation: bool = False,
        max_chunk_tokens: int = 0,
    ) -> None:
        """Queue a request (FCFS, but see ``continuation``).

        ``preloaded_tokens``: prompt prefix whose KV arrived from another instance (PD transfer):
        it needs blocks but no compute. ``emitted_tokens``: output tokens already produced
        elsewhere (they count toward ``max_output_tokens`` and the context). ``prefill_only``:
        finish once the prompt is computed and one token sampled (the prefill side of PD).
        ``continuation``: the client already has this request's first token (its prefill ran
        elsewhere), so every step it waits stalls a live stream: it is queued behind preempted
        requests and other continuations but ahead of requests that have not started.
        ``max_chunk_tokens``: > 0 caps the prompt tokens this request computes per step (a
        per-request ``long_prefill_token_threshold``: AMPD sizes a decode node's local prefill
        chunks to the ITL slack of its running batch).

        Raises ValueError for a duplicate id, counts out of range, or a request that could never
        run here (more KV than the instance has; without chunked prefill, more tokens than a step).
        """
        rid = request.request_id
        self._no_open_run("add_request")
        if rid in self._requests or self._retention.holds(rid):
            raise ValueError(f"request {rid!r} is already on instance {self._instance_id!r}")
        if request.prompt_tokens < 1 or request.max_output_tokens < 1:
            raise ValueError(
                f"request {rid!r}: prompt_tokens and max_output_tokens must be >= 1, "
                f"got {request.prompt_tokens} and {request.max_output_tokens}"
            )
        if not 0 <= preloaded_tokens <= request.prompt_tokens:
            raise ValueError(
                f"request {rid!r}: preloaded_tokens must be in [0, {request.prompt_tokens}], got {preloaded_tokens}"
            )
        if max_chunk_tokens < 0:
            raise ValueError(f"request {rid!r}: max_chunk_tokens must be >= 0, got {max_chunk_tokens}")
        if max_chunk_tokens and not self.config.enable_chunked_prefill:
            raise ValueError(f"request {rid!r}: max_chunk_tokens needs chunked prefill")
        if not 0 <= emitted_tokens < request.max_output_tokens:
            raise ValueError(
                f"request {rid!r}: emitted_tokens must be in [0, max_output_tokens={request.max_output_tokens}), "
                f"got {emitted_tokens}"
            )
        chain = self._kv.chains.get(request.content, self.config.block_size_tokens) if request.content else None
        req = RequestState(
            request,
            self._next_uid,
            chain=chain,
            preloaded_tokens=preloaded_tokens,
            emitted_tokens=emitted_tokens,
            prefill_only=prefill_only,
            chunk_cap=max_chunk_tokens,
        )
        self._check_fits(req)
        self._next_uid += 1
        self._requests[rid] = req
        self._queues.enqueue(req, continuation=continuation)
        if self._tracer is not None:
            self._tracer.queued(now, request, preloaded_tokens, continuation)

    def _check_fits(self, req: RequestState) -> None:
        cfg = self.config
        kv_tokens = req.max_num_tokens - 1  # the last sampled token's KV is never computed
        if -(-kv_tokens // cfg.block_size_tokens) > cfg.num_gpu_blocks:
            raise ValueError(
                f"request {req.request_id!r} needs KV for {kv_tokens} tokens but instance "
                f"{self._instance_id!r} holds {cfg.total_kv_tokens}"
            )
        if not cfg.enable_chunked_prefill and kv_tokens > cfg.max_num_batched_tokens:
            raise ValueError(
                f"request {req.request_id!r} may need {kv_tokens} tokens in one step (after a preemption) but "
                f"max_num_batched_tokens={cfg.max_num_batched_tokens} and chunked prefill is off"
            )

    def abort(self, request_id: str, now: float) -> FinishedRequest | None:
        """Stop a queued or running request now, freeing its KV; None if it is not here."""
        self._no_open_run("abort")
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self._queues.abort(req)
        self._kv.free(req)
        record = finished_record(req, now, aborted=True)
        if self._tracer is not None:
            self._tracer.finished(record)
        return record

    def set_chunk_cap(self, request_id: str, tokens: int) -> int:
        """Re-cap ``request_id``'s chunks as ``max_chunk_tokens`` does; its prompt tokens left (0: none)."""
        req = self._requests.get(request_id)
        if req is not None:
            req.chunk_cap = max(0, tokens)
        return req.pending_tokens if req is not None else 0

    def tpot_bank_s(self, tpot_s: float, now: float, expected_tokens: int = 0, itl_s: float = 0.0) -> float:
        """The streams' banked TPOT slack when the next step can start (:mod:`tokenomy.engine.tpot_bank`)."""
        ran = self._run.applied if self._run is not None else 0
        return tpot_bank_s(self._requests.values(), max(now, self._busy_until), ran, tpot_s, expected_tokens, itl_s)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ---- the step ---------------------------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        """Schedule one iteration at ``now``, apply it, and report what happened at ``now + duration``.

        Returns None when nothing can run (no requests, or the waiting head does not fit the
        free KV, which only retained blocks can cause). The caller must not call ``step``
        again before the returned ``end_s``.
        """
        if now < self._busy_until:
            raise ValueError(f"step at {now} before the previous step ended at {self._busy_until}")
        self._no_open_run("step")
        self._step_prefill_tokens = 0
        self._retention.forget_recent()
        if not self._requests:
            return None
        tracer = self._tracer
        evicted0 = self._kv.pool.num_evicted if tracer is not None else 0
        plan = self._sched.schedule()
        if plan.preempted:
            logger.debug("%s: preempted %d requests at %.6f", self._instance_id, len(plan.preempted), now)
        if tracer is not None:
            tracer.scheduled(now, plan, self._kv.pool.num_evicted - evicted0)
        if not plan.decodes and not plan.prefills:
            logger.debug("%s: nothing fits at %.6f (%d waiting, %d free blocks, %d retained)", self._instance_id,
                         now, len(self._queues.waiting), self._kv.pool.num_free, self._retention.num_blocks)
            return None
        shape = plan.shape()
        duration = self.perf.step_time_s(shape)
        preempted = [r.request_id for r in plan.preempted] if plan.preempted else []
        result = StepResult(now, duration, shape, self.perf.step_flops(shape), [], [], [], preempted)
        self._busy_until = now + duration
        self._step_prefill_tokens = plan.prefill_tokens
        self._updater.apply(plan, now + duration, result)
        self.stats.num_steps += 1
        if tracer is not None:
            self._trace_step(result)
        return result

    def end_step(self) -> None:
        """The step in flight has ended: its prefill tokens no longer count as waiting.

        Drivers call this when they deliver a step's result; the next :meth:`step` (or
        :meth:`plan_decode_run`) does it too.
        """
        self._step_prefill_tokens = 0

    def _trace_step(self, result: StepResult) -> None:
        assert self._tracer is not None
        queues = self._queues
        self._tracer.step(
            result.start_s, result.duration_s, result.shape, len(result.emitted), len(queues.running),
            len(queues.waiting), self._kv.pool.num_free,
        )
        for fin in result.finished:
            self._tracer.finished(fin)

    # ---- decode fast-forward ----------------------------------------------------------------
    def plan_decode_run(self, now: float, max_steps: int = 4096) -> DecodeRun | None:
        """Plan up to ``max_steps`` back-to-back decode-only steps from ``now`` without applying them.

        Only when no request waits and every running request decodes; the run stops before the
        first step that would finish a request or need a block the free pool lacks (those steps
        go through :meth:`step`). None when fewer than 2 steps qualify. While the run is open,
        the caller applies it with :meth:`advance_decode_run` before anything reads or changes
        the engine at a later time, and closes it with :meth:`close_decode_run` before calling
        ``step``, ``add_request`` or ``abort`` (those raise while it is open); ``retain`` and
        ``release`` are allowed between advances (they do not change what a decode step does).
        """
        if max_steps < 2:
            raise ValueError(f"max_steps must be >= 2, got {max_steps}")
        if now < self._busy_until:
            raise ValueError(f"run at {now} before the previous step ended at {self._busy_until}")
        self._no_open_run("plan_decode_run")
        self._step_prefill_tokens = 0  # a run starts after the previous step ended
        run = self._runner.plan(now, max_steps)
        if run is not None:
            self._retention.forget_recent()  # what ``step`` does when the run's first step starts
            self._run = run
        return run

    def advance_decode_run(self, now: float) -> int:
        """Apply the open run's steps that start at or before ``now`` (each one's effects when it starts,
        as :meth:`step` does): every view and the KV pool are then what single steps would show. The
        running requests' own progress is settled when the run closes. Returns the steps applied in all."""
        run = self.price_decode_run(now)
        if now >= run.next_start_s and run.applied < run.num_steps:
            stop = bisect_right(run.starts, now, run.applied, run.num_steps)
            if self._tracer is None:
                self._runner.apply(run, stop)
            else:
                self._apply_traced(run, stop)
            self._busy_until = run.starts[stop]
        return run.applied

    def price_decode_run(self, now: float) -> DecodeRun:
        """The open run, priced at least through its steps that start by ``now``; none is applied."""
        run = self._run
        if run is None:
            raise ValueError("no open decode run")
        while now >= run.end_s and not run.priced_all:  # a step not priced yet starts by now
            self._runner.extend(run)
        return run

    def _apply_traced(self, run: DecodeRun, stop: int) -> None:
        """Apply the run's steps one at a time, tracing each as :meth:`step` would have."""
        tracer, pool = self._tracer, self._kv.pool
        assert tracer is not None
        for j in range(run.applied, stop):
            evicted0 = pool.num_evicted
            self._runner.apply(run, j + 1)
            (result,) = run.results(j, j + 1)
            tracer.evicted(result.start_s, pool.num_evicted - evicted0)
            self._trace_step(result)

    def close_decode_run(self, now: float) -> DecodeRun:
        """Advance the open run to ``now`` and end it after its step in progress: the run keeps only
        its applied steps, and the engine may step again at the returned run's ``end_s``."""
        self.advance_decode_run(now)
        run = self._run
        assert run is not None
        run.num_steps = run.limit = run.applied
        self._runner.settle(run)
        self._run = None
        return run

    def _no_open_run(self, what: str) -> None:
        if self._run is not None:
            raise ValueError(f"{what} on instance {self._instance_id!r} while a decode run is open; close it first")

    # ---- KV retention across tool calls -----------------------------------------------------
    def retain(self, request_id: str) -> None:
        """Keep the request's blocks referenced (pinned, not evictable) after it finishes; call it before it
        finishes or right after the step that finished it (before the next ``step``). Idempotent."""
        req = self._requests.get(request_id)
        if req is not None:
            req.retain = True
        else:
            self._retention.retain_finished(request_id)

    def release(self, request_id: str) -> None:
        """Drop a retained request's pin: its blocks become free-cached (evictable by LRU)."""
        req = self._requests.get(request_id)
        if req is not None and req.retain:
            req.retain = False
        else:
            self._retention.release(request_id)

    def retained_blocks(self) -> int:
        """Blocks pinned by retention (a block pinned by two requests counts twice)."""
        return self._retention.num_blocks

    # ---- InstanceView -----------------------------------------------------------------------
    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def num_running(self) -> int:
        return len(self._queues.running)

    @property
    def num_waiting(self) -> int:
        return len(self._queues.waiting)

    @property
    def num_waiting_tokens(self) -> int:
        """Tokens still to compute before requests decode, over waiting and running requests.

        Waiting requests count their whole context (less preloaded KV): cache hits are only known
        at admission. The prefill chunks of the step in flight count until it ends
        (:meth:`end_step`): a step's effects are applied at its start, and an instance computing
        its last chunk is not idle.
        """
        return self._queues.pending_tokens + self._step_prefill_tokens

    @property
    def num_decoding(self) -> int:
        return self._queues.num_decoding

    @property
    def decode_context_tokens(self) -> int:
        return self._queues.decode_context_tokens

    @property
    def kv_usage(self) -> float:
        pool = self._kv.pool
        return 1.0 - pool.num_free / pool.num_blocks

    @property
    def free_blocks(self) -> int:
        return self._kv.pool.num_free

    @property
    def total_blocks(self) -> int:
        return self.config.num_gpu_blocks

    @property
    def block_size_tokens(self) -> int:
        return self.config.block_size_tokens

    def cached_prefix_tokens(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        """Prompt tokens that would hit the prefix cache now (read-only: LRU order untouched)."""
        return self._kv.cached_prefix_tokens(content, prompt_tokens)

    def cached_prefix_free_blocks(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        """Blocks of that cached prefix in the free pool: admitting the request takes them off it."""
        return self._kv.cached_prefix_free_blocks(content, prompt_tokens)
