"""One emulated instance without HTTP: tokenize, plan the answer, run it on the engine, PD hand-off.

The HTTP layer (:mod:`tokenomy.emulator.server`) parses and formats; everything an answer's
content and timing depend on happens here, on the event loop that owns the engine. A request's
checks and plan live in :mod:`tokenomy.emulator.job`, the P/D parameters and release notices in
:mod:`tokenomy.emulator.pd`, and KV kept after a request finished in :mod:`tokenomy.emulator.pins`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from contextlib import suppress
from typing import Any

from tokenomy.core import Request
from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.driver import EngineDriver, EngineStopped, RequestHandle
from tokenomy.emulator.generation import content_of
from tokenomy.emulator.job import Job, plan_job
from tokenomy.emulator.kv_link import AsyncKVLink, KVTransferTimeout
from tokenomy.emulator.metrics import EmulatorMetrics
from tokenomy.emulator.pd import ReleaseNotifier, prefill_answer_params, remote_cached_tokens
from tokenomy.emulator.pins import KVPins
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest, CompletionRequest
from tokenomy.emulator.tokenizer import Tokenizer, load_tokenizer
from tokenomy.engine import Engine, FinishedRequest
from tokenomy.engine.trace import JsonlTrace

log = logging.getLogger(__name__)


class Emulator:
    """Owns the engine, its driver and metrics; create inside the running event loop."""

    def __init__(self, config: EmulatorConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer)
        self.perf = config.perf_model()
        self.engine_config = config.engine_config(self.perf)
        self._trace = JsonlTrace(config.trace_events) if config.trace_events is not None else None
        self.engine = Engine(config.instance_id, self.engine_config, self.perf, config.role, trace=self._trace)
        self.context_window = config.context_window(self.engine_config, self.perf.model.max_context_tokens)
        self.model_name = config.model_name
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0
        self.generation_tokens_total = 0
        self.metrics = EmulatorMetrics(self.engine, self.model_name, self._counters)
        self.driver = EngineDriver(
            self.engine, time_scale=config.time_scale, max_lag_s=config.max_lag_s,
            on_token=self._on_token, on_finish=self._on_finish,
        )
        self._ids = itertools.count()
        self._prefix = f"{config.instance_id}-{os.getpid()}-"
        self.pins = KVPins(self.engine, self.driver, config.time_scale)
        self.kv_transfers_total = 0  # remote prefills pulled by this instance (P/D decode side)
        self.kv_transfer_tokens_total = 0
        self.kv_history_pulls_total = 0  # prefill side: history KV pulled from a decode instance (pd.HISTORY_KEY)
        self.kv_history_pull_tokens_total = 0
        # The inbound KV port (every TP rank its own NIC): concurrent pulls share its bandwidth.
        link = config.link_bytes_per_s or self.perf.gpu.inter_node_bytes_per_s
        self.kv_link = AsyncKVLink(link * self.perf.tp, latency_s=self.perf.coeffs.kv_transfer_setup_s,
                                   time_scale=config.time_scale, timeout_s=config.kv_transfer_timeout_s)
        self._notifier = ReleaseNotifier()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.driver.run(), name="engine-driver")
        self._task.add_done_callback(self._driver_done)

    def _driver_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("engine driver stopped", exc_info=task.exception())

    @property
    def healthy(self) -> bool:
        """False once the engine driver has stopped (``/health`` then answers 503)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # A crashed driver's exception was logged by _driver_done; shutting down is not an error.
            with suppress(asyncio.CancelledError, Exception):
                await self._task
        self.pins.close()
        self.kv_link.close()
        await self._notifier.aclose()
        if self._trace is not None:
            self._trace.close()

    def _counters(self) -> list[tuple[str, str, float]]:
        return [
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens_total),
            ("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens_total),
            ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
             self.prompt_tokens_cached_total),
            ("tokenomy:kv_transfers", "Remote prefills whose KV this instance pulled (P/D decode side).",
             self.kv_transfers_total),
            ("tokenomy:kv_transfer_tokens", "Prompt tokens of KV pulled from prefill instances.",
             self.kv_transfer_tokens_total),
            ("tokenomy:kv_history_pulls", "Prefills that pulled a session's history KV from its decode instance.",
             self.kv_history_pulls_total),
            ("tokenomy:kv_history_pull_tokens", "Prompt tokens of history KV pulled instead of recomputed.",
             self.kv_history_pull_tokens_total),
            ("tokenomy:kv_retained_requests", "Requests whose KV was pinned after finishing by a retention hint.",
             self.pins.retained_total),
            ("tokenomy:kv_transfer_seconds", "Modelled seconds KV pulls took, start to arrival, summed.",
             self.kv_link.counters.seconds),
            ("tokenomy:kv_transfer_wait_seconds", "Modelled seconds KV pulls queued behind concurrent pulls on "
             "this instance's port (beyond their time alone), summed.", self.kv_link.counters.wait_seconds),
            ("tokenomy:kv_transfer_bytes", "Bytes of KV moved into this instance.", self.kv_link.counters.bytes),
            ("tokenomy:kv_transfer_timeouts", "KV pulls cut by --kv-transfer-timeout (their requests failed).",
             self.kv_link.counters.timeouts),
        ]

    def retain_hint(self, client_request_id: str, ttl_s: float) -> None:
        """A gateway's retention hint (:data:`tokenomy.emulator.pins.RETAIN_PATH`)."""
        self.pins.hint(client_request_id, ttl_s)

    def prepare(self, body: CompletionRequest | ChatCompletionRequest) -> Job:
        """Validate against this instance and plan the answer; raises :class:`APIError`."""
        return plan_job(body, lambda: f"{self._prefix}{next(self._ids)}", config=self.config,
                        tokenizer=self.tokenizer, model_name=self.model_name, window=self.context_window)

    # ---- running it -----------------------------------------------------------------------
    async def start_job(self, job: Job, arrival_wall: float) -> RequestHandle:
        """Put the job on the engine (after the modelled KV pull for a remote prefill)."""
        ids = job.prompt_ids + job.plan.token_ids
        content = content_of(ids, self.engine_config.block_size_tokens)
        n_prompt = job.prompt_tokens
        request = Request(job.request_id, 0.0, n_prompt, len(job.plan.token_ids), content=content)
        kwargs: dict[str, Any] = {}
        if job.remote_prefill is not None:
            preloaded = n_prompt - 1  # the last prompt token is recomputed to sample the first output token
            cached = self.engine.cached_prefix_tokens(content, n_prompt)
            job.transfer_s = await self._pull(max(0, preloaded - cached))
            self.kv_transfers_total += 1
            self.kv_transfer_tokens_total += max(0, preloaded - cached)
            self._notifier.notify(job.remote_prefill)
            kwargs["preloaded_tokens"] = preloaded
        elif job.remote_decode:
            kwargs["prefill_only"] = True
            if job.history_tokens > 0:
                pull = max(0, job.history_tokens - self.engine.cached_prefix_tokens(content, n_prompt))
                if pull:
                    job.transfer_s = await self._pull(pull)
                    self.kv_history_pulls_total += 1
                    self.kv_history_pull_tokens_total += pull
                kwargs["preloaded_tokens"] = job.history_tokens
        try:
            # A pulled prefill already waited its transfer: its step may not start before now.
            since = None if job.remote_prefill is not None or job.transfer_s > 0 else arrival_wall
            handle = self.driver.submit(request, since, **kwargs)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        except EngineStopped as exc:
            raise APIError(503, str(exc)) from None
        handle.arrival_wall = arrival_wall
        handle.last_token_wall = arrival_wall
        handle.prompt_tokens = n_prompt
        handle.finish_reason = job.plan.finish_reason
        if not job.remote_decode and job.client_request_id:
            job.retain_ttl_s = self.pins.take_hint(job.client_request_id)
        if job.remote_decode or job.retain_ttl_s is not None:
            self.engine.retain(job.request_id)
        return handle

    async def _pull(self, tokens: int) -> float:
        """Pull ``tokens`` of KV over the inbound port (shared with concurrent pulls); modelled
        seconds taken. A pull cut by ``--kv-transfer-timeout`` fails the request (504)."""
        if tokens <= 0:
            return 0.0
        try:
            return await self.kv_link.transfer(tokens * self.perf.kv_bytes_per_token)
        except KVTransferTimeout as exc:
            raise APIError(504, str(exc), type_="KVTransferTimeoutError") from None

    def abort(self, handle: RequestHandle) -> None:
        """The client went away: free the request's KV now (no-op if it already finished)."""
        if handle.finished is None:
            self.driver.abort(handle.request_id)

    def finish_job(self, job: Job, handle: RequestHandle) -> None:
        """After the answer is complete: a prefill-side request keeps its KV for the decode side."""
        fin = handle.finished
        assert fin is not None
        job.cached_tokens = fin.cache_hit_tokens + fin.transferred_tokens
        remote_cached = remote_cached_tokens(job.remote_prefill)
        if remote_cached is not None:
            # vLLM's NIXL decode side reports the prefill side's cache hits, not the KV it pulled
            job.cached_tokens = min(remote_cached, job.prompt_tokens)
        block = self.engine_config.block_size_tokens
        job.created_cache_tokens = max(0, job.prompt_tokens // block * block - job.cached_tokens)
        if job.retain_ttl_s is not None:
            self.pins.keep_hinted(job.request_id, job.client_request_id, job.retain_ttl_s, aborted=fin.aborted)
        if job.remote_decode and not fin.aborted:
            self.pins.hold(job.request_id, self.config.kv_release_timeout_s)
            job.kv_transfer_params = prefill_answer_params(self.config, job.request_id, job.prompt_tokens,
                                                           job.cached_tokens, self.engine_config.block_size_tokens)

    def release(self, request_id: str) -> bool:
        """Unpin KV held for a decode instance (it pulled it, or the timeout passed)."""
        return self.pins.release(request_id)

    # ---- metrics hooks (called by the driver) ---------------------------------------------
    def _on_token(self, h: RequestHandle, wall: float) -> None:
        scale = self.config.time_scale
        m = self.metrics
        if h.first_token_wall is None:
            m.ttft.observe((wall - h.arrival_wall) / scale)
            self.prompt_tokens_total += h.prompt_tokens
        else:
            m.itl.observe((wall - h.last_token_wall) / scale)
        self.generation_tokens_total += 1

    def _on_finish(self, h: RequestHandle, fin: FinishedRequest) -> None:
        m = self.metrics
        m.e2e.observe((h.last_token_wall - h.arrival_wall) / self.config.time_scale)
        m.request_prompt_tokens.observe(h.prompt_tokens)
        m.request_generation_tokens.observe(fin.output_tokens)
        self.prompt_tokens_cached_total += fin.cache_hit_tokens + fin.transferred_tokens
        m.request_prefill_kv_computed_tokens.observe(fin.recomputed_tokens)
        m.success(h.finish_reason)

