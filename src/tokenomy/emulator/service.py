"""One emulated instance without HTTP: tokenize, plan the answer, run it on the engine, PD hand-off.

The HTTP layer (:mod:`tokenomy.emulator.server`) parses and formats; everything an answer's
content and timing depend on happens here, on the event loop that owns the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenomy.core import Request
from tokenomy.emulator.chat import render
from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.driver import EngineDriver, EngineStopped, RequestHandle
from tokenomy.emulator.generation import OutputPlan, content_of, plan_output
from tokenomy.emulator.metrics import EmulatorMetrics
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest, CompletionRequest
from tokenomy.emulator.tokenizer import Tokenizer, load_tokenizer
from tokenomy.engine import Engine, FinishedRequest
from tokenomy.engine.trace import JsonlTrace

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

KV_RELEASE_PATH = "/tokenomy/kv_release"
"""Where a decode instance tells the prefill instance that it pulled a request's KV."""

RETAIN_PATH = "/v1/tokenomy/retain"
"""Extension: ``{"request_id": <the x-request-id of a coming request>, "ttl_s": s}`` pins that
request's KV for ``ttl_s`` modelled seconds after it finishes (a gateway's retention hint);
``ttl_s: 0`` for a request whose KV is pinned now releases it at once (the gateway's pressure relief)."""

HISTORY_KEY = "tokenomy_history_tokens"
"""Extension in a prefill request's ``kv_transfer_params``: the first N prompt tokens' KV sits on the
session's decode instance; the prefill instance pulls what its own prefix cache lacks (modelled
transfer time) instead of recomputing it, as AMPD's remote incremental prefill does. Engines
without the extension ignore the key and recompute (docs/ampd-live.md)."""

_RETAIN_HINTS = 10_000  # pending hints remembered (oldest forgotten first)


@dataclass(slots=True)
class Job:
    """A validated request, ready to run: prompt ids, the planned answer, PD parameters."""

    request_id: str
    prompt_ids: list[int]
    plan: OutputPlan
    remote_decode: bool = False
    remote_prefill: dict[str, Any] | None = None
    cached_tokens: int = 0
    transfer_s: float = 0.0
    kv_transfer_params: dict[str, Any] | None = field(default=None)
    client_request_id: str = ""  # the x-request-id the client sent
    retain_ttl_s: float | None = None  # a retention hint applied to this job
    history_tokens: int = 0  # prefill side: prompt-prefix KV to pull from the decode instance (HISTORY_KEY)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class Emulator:
    """Owns the engine, its driver and metrics; create inside the running event loop."""

    def __init__(self, config: EmulatorConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer)
        self.perf = config.perf_model()
        self.engine_config = config.engine_config(self.perf)
        self._trace = JsonlTrace(config.trace_events) if config.trace_events is not None else None
        self.engine = Engine(config.instance_id, self.engine_config, self.perf, config.role, trace=self._trace)
        self.context_window = config.context_window(self.engine_config)
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
        self._held: dict[str, asyncio.TimerHandle] = {}  # KV kept for a decode instance or by a hint
        self._retain_hints: dict[str, float] = {}  # client request id -> ttl_s
        self._pinned_by_client: dict[str, str] = {}  # client request id -> engine id of a pin (latest _RETAIN_HINTS)
        self.kv_transfers_total = 0  # remote prefills pulled by this instance (P/D decode side)
        self.kv_transfer_tokens_total = 0
        self.kv_history_pulls_total = 0  # prefill side: history KV pulled from a decode instance (HISTORY_KEY)
        self.kv_history_pull_tokens_total = 0
        self.kv_retained_total = 0  # requests pinned after finishing by a retention hint
        self._http: httpx.AsyncClient | None = None
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
        for timer in self._held.values():
            timer.cancel()
        if self._http is not None:
            await self._http.aclose()
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
             self.kv_retained_total),
        ]

    def retain_hint(self, client_request_id: str, ttl_s: float) -> None:
        """Pin the KV of the coming request with this x-request-id for ``ttl_s`` after it finishes;
        ``ttl_s`` 0 releases the pin of a finished one (and forgets a hint not yet used)."""
        if ttl_s == 0:
            self._retain_hints.pop(client_request_id, None)
            job_id = self._pinned_by_client.pop(client_request_id, None)
            if job_id is not None:
                self.release(job_id)
            return
        self._retain_hints[client_request_id] = ttl_s
        while len(self._retain_hints) > _RETAIN_HINTS:
            self._retain_hints.pop(next(iter(self._retain_hints)))

    # ---- preparing a request --------------------------------------------------------------
    def prepare(self, body: CompletionRequest | ChatCompletionRequest) -> Job:
        """Validate against this instance and plan the answer; raises :class:`APIError`."""
        if body.model is not None and body.model != self.model_name:
            raise APIError(404, f"The model `{body.model}` does not exist.", param="model", type_="NotFoundError")
        if isinstance(body, ChatCompletionRequest):
            prompt_ids = self.tokenizer.encode(render(body.messages, body.add_generation_prompt))
        elif isinstance(body.prompt, str):
            prompt_ids = self.tokenizer.encode(body.prompt)
        else:
            prompt_ids = list(body.prompt)  # type: ignore[arg-type]
        n_prompt = len(prompt_ids)
        if n_prompt == 0:
            raise APIError(400, "The prompt is empty after tokenization.", param="prompt")
        window = self.context_window
        # vLLM 0.32's rules (tests/realvllm/test_conformance.py): a prompt that leaves no room for one
        # output token is refused, max_tokens above the window is refused, and a max_tokens that only
        # overflows together with the prompt is cut to what fits.
        if n_prompt >= window:
            raise APIError(400, f"This model's maximum context length is {window} tokens. However, your prompt "
                                f"contains at least {n_prompt} input tokens, which exceeds this limit even without "
                                "any output tokens. Please reduce the length of the input prompt.",
                           param="input_tokens")
        if body.max_tokens is not None and body.max_tokens > window:
            raise APIError(400, f"max_tokens={body.max_tokens} cannot be greater than max_model_len={window}. "
                                "Please request fewer output tokens.", param="max_tokens")
        max_tokens = window - n_prompt if body.max_tokens is None else min(body.max_tokens, window - n_prompt)
        remote_decode, remote_prefill = self._pd_params(body.kv_transfer_params)
        history = self._history_tokens(body.kv_transfer_params) if remote_decode else 0
        if remote_decode:
            max_tokens = 1  # the prefill side samples one token (the proxy sends max_tokens=1 anyway)
        plan = plan_output(
            self.tokenizer, prompt_ids, max_tokens=max_tokens, min_tokens=min(body.min_tokens, max_tokens),
            ignore_eos=body.ignore_eos, eos_mean_tokens=self.config.eos_mean_tokens, seed=body.seed,
            stop=body.stop_strings(), include_stop_str_in_output=body.include_stop_str_in_output,
        )
        if not plan.token_ids:  # a stop string inside the first token: vLLM still computes one token
            plan = OutputPlan(plan_output(self.tokenizer, prompt_ids, max_tokens=1, ignore_eos=True,
                                          seed=body.seed).token_ids, [""], "stop")
        job = Job(f"{self._prefix}{next(self._ids)}", prompt_ids, plan, remote_decode, remote_prefill)
        job.history_tokens = min(history, n_prompt - 1)
        return job

    @staticmethod
    def _history_tokens(params: dict[str, Any] | None) -> int:
        value = (params or {}).get(HISTORY_KEY, 0)
        if value is None:
            return 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise APIError(400, f"kv_transfer_params.{HISTORY_KEY} must be an integer >= 0, got {value!r}",
                           param="kv_transfer_params")
        return value

    @staticmethod
    def _pd_params(params: dict[str, Any] | None) -> tuple[bool, dict[str, Any] | None]:
        if not params:
            return False, None
        if params.get("do_remote_decode") and params.get("do_remote_prefill"):
            raise APIError(400, "kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive",
                           param="kv_transfer_params")
        if params.get("do_remote_prefill"):
            missing = [k for k in ("remote_request_id", "remote_host", "remote_port") if params.get(k) in (None, "")]
            if missing:
                raise APIError(400, f"kv_transfer_params.do_remote_prefill needs {', '.join(missing)}",
                               param="kv_transfer_params")
            return False, params
        return bool(params.get("do_remote_decode")), None

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
            job.transfer_s = self.perf.kv_transfer_time_s(max(0, preloaded - cached), self.config.link_bytes_per_s)
            self.kv_transfers_total += 1
            self.kv_transfer_tokens_total += max(0, preloaded - cached)
            await asyncio.sleep(job.transfer_s * self.config.time_scale)
            self._notify_pulled(job.remote_prefill)
            kwargs["preloaded_tokens"] = preloaded
        elif job.remote_decode:
            kwargs["prefill_only"] = True
            if job.history_tokens > 0:
                pull = max(0, job.history_tokens - self.engine.cached_prefix_tokens(content, n_prompt))
                if pull:
                    job.transfer_s = self.perf.kv_transfer_time_s(pull, self.config.link_bytes_per_s)
                    self.kv_history_pulls_total += 1
                    self.kv_history_pull_tokens_total += pull
                    await asyncio.sleep(job.transfer_s * self.config.time_scale)
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
        if job.remote_decode:
            self.engine.retain(job.request_id)
        elif job.client_request_id and job.client_request_id in self._retain_hints:
            job.retain_ttl_s = self._retain_hints.pop(job.client_request_id)
            self.engine.retain(job.request_id)
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """The client went away: free the request's KV now (no-op if it already finished)."""
        if handle.finished is None:
            self.driver.abort(handle.request_id)

    def finish_job(self, job: Job, handle: RequestHandle) -> None:
        """After the answer is complete: a prefill-side request keeps its KV for the decode side."""
        fin = handle.finished
        assert fin is not None
        job.cached_tokens = fin.cache_hit_tokens + fin.transferred_tokens
        remote_cached = (job.remote_prefill or {}).get("remote_prefill_cached_tokens")
        if isinstance(remote_cached, int) and not isinstance(remote_cached, bool) and remote_cached >= 0:
            # vLLM's NIXL decode side reports the prefill side's cache hits, not the KV it pulled
            job.cached_tokens = min(remote_cached, job.prompt_tokens)
        if job.retain_ttl_s is not None:
            if fin.aborted:
                with suppress(ValueError):  # an aborted request may hold no pinned KV
                    self.engine.release(job.request_id)
                    self.driver.kick()
            else:
                self.kv_retained_total += 1
                self._held[job.request_id] = asyncio.get_running_loop().call_later(
                    job.retain_ttl_s * self.config.time_scale, self.release, job.request_id)
                self._pinned_by_client[job.client_request_id] = job.request_id
                while len(self._pinned_by_client) > _RETAIN_HINTS:  # expired pins' entries age out
                    self._pinned_by_client.pop(next(iter(self._pinned_by_client)))
        if job.remote_decode and not fin.aborted:
            bs = self.engine_config.block_size_tokens
            loop = asyncio.get_running_loop()
            self._held[job.request_id] = loop.call_later(
                self.config.kv_release_timeout_s * self.config.time_scale, self.release, job.request_id)
            job.kv_transfer_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": list(range(-(-job.prompt_tokens // bs))),
                "remote_engine_id": self.config.instance_id,
                "remote_request_id": job.request_id,
                "remote_host": self.config.host,
                "remote_port": self.config.port,
                "tp_size": self.config.tp,
                "remote_num_tokens": job.prompt_tokens,
                "remote_prefill_cached_tokens": job.cached_tokens,
            }

    def release(self, request_id: str) -> bool:
        """Unpin KV held for a decode instance (it pulled it, or the timeout passed)."""
        timer = self._held.pop(request_id, None)
        if timer is None:
            return False
        timer.cancel()
        self.engine.release(request_id)
        self.driver.kick()  # the freed blocks may admit a request that waits for KV
        return True

    def _notify_pulled(self, params: dict[str, Any]) -> None:
        import httpx  # only PD decode instances need a client (and importing it is slow)

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0)
        url = f"http://{params['remote_host']}:{params['remote_port']}{KV_RELEASE_PATH}"
        payload = {"remote_request_id": params["remote_request_id"]}
        client = self._http

        async def send() -> None:
            try:
                await client.post(url, json=payload)
            except httpx.HTTPError as exc:  # the prefill side frees on its timeout instead
                log.warning("KV release notification to %s failed: %s", url, exc)

        asyncio.get_running_loop().create_task(send())

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
