"""``tokenomy perf profile``: measure a running OpenAI-compatible engine's step times and fit the
simulator's step-time model to them (:mod:`tokenomy.perf.stepfit`).

Two kinds of probe, each over ``/v1/completions`` streamed, with prompts sized in the target's
own tokens (:mod:`tokenomy.bench.sizing`) and made of fresh random words so nothing hits the
prefix cache by accident:

- **prefill**: one request alone on the engine, ``max_tokens=1``, at each prompt length; its
  TTFT covers the prompt's prefill steps (chunked by the engine's token budget) plus the
  server's own per-request work, which the fit's per-prefill-chunk term absorbs;
- **decode**: ``batch`` streams at once whose prompts share a ``context``-token prefix (cached by
  a first request, itself a prefill probe) plus a short unique tail, all asking for the same
  number of tokens; their mean gap between tokens is one decode step of ``batch`` sequences at
  the context they hold. The gaps are the engine's own when it exports vLLM's
  ``vllm:inter_token_latency_seconds`` histogram (vLLM stamps each step's output in its engine
  process; the probe reads the histogram's sum and count before and after), else the client's,
  taken while every stream is decoding (after the last first token, before the first stream
  ends). A client on a busy machine reads a stream late and in bursts (a whole answer can
  arrive within a millisecond); the engine's stamps do not move with it.

The plan runs ``repeats`` rounds, each probe once a round, and keeps each probe's median over
the rounds: a busy spell on a shared machine then slows one repeat of many probes, not every
repeat of a few.

The token counts come from the target's ``usage``, not from the plan, so a target that counts
differently is still priced on what it computed. The engine's limits are read from vLLM's
``vllm:cache_config_info`` metric or our emulator's ``/tokenomy/info``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from tokenomy.bench.bodies import request_body
from tokenomy.bench.client import AiohttpOpener, Opener, Outcome, WallClock, send
from tokenomy.bench.config import BenchConfig
from tokenomy.bench.engine_info import histogram_totals, read_engine_limits, time_scale_of
from tokenomy.bench.sizing import measure_sizing, probe_remote
from tokenomy.bench.text import Prompt, PromptSizing
from tokenomy.core.step import StepShape
from tokenomy.perf.engine_calibration import EngineCalibration
from tokenomy.perf.stepfit import Measurement, decode_step, fit_steps, mixed_step, prefill_steps

SUFFIX_TOKENS = 16
"""Unique tail of each decode probe's prompt after the shared context (one prefill chunk)."""

ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
"""vLLM's (and our emulator's) histogram of the gaps between a request's tokens, engine-timed."""

MIXED_DECODE_FACTOR = 3
"""A mixed probe's background streams ask for this many times ``decode_tokens``: they must still be
decoding while every chunk of ``mixed_tails`` is sent after the settle time."""

MIXED_SETTLE_S = 0.25
"""Seconds a mixed probe waits after starting its background streams before it sends its chunks, so
their prefills are done and they all decode (a chunk that lands otherwise is left out)."""

MIXED_JITTER_S = 0.05
"""Longest random pause before each chunk of a mixed probe, so it lands at a random moment of a
decode step (several steps of vLLM CPU's 10-15 ms)."""

ITL_SETTLE_TRIES = 10
"""Reads of ``/metrics`` after a decode probe until its gaps are all counted (vLLM records a step's
statistics just after sending its tokens), 20 ms apart."""


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure. ``repeats`` rounds of every prefill length and every decode point (each
    probe's median over the rounds is kept); ``decode_tokens`` per decode stream; ``cached_tails``:
    prompt lengths sent alone after each context while it is cached (an agent turn's shape:
    a chunk after a cached history); ``mixed_tails``: the same chunks sent while ``mixed_batches``
    streams decode on each context (the prefill joins their decode step: a mixed step, which is
    what pins how a step's constant cost splits between ``fixed_s`` and the per-chunk and floor
    terms; pure prefills and pure decodes leave that split free). ``max_num_batched_tokens`` is
    the engine's per-step token budget, which chunks long prompts (None: read from the target
    when it says, else a prompt is one step)."""

    prompt_tokens: tuple[int, ...] = (32, 128, 512, 1024, 2048)
    batches: tuple[int, ...] = (1, 4, 16, 32)
    contexts: tuple[int, ...] = (128, 1024)
    decode_tokens: int = 48
    repeats: int = 3
    cached_tails: tuple[int, ...] = ()
    mixed_tails: tuple[int, ...] = ()
    mixed_batches: tuple[int, ...] = (4,)
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "batches", "contexts"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"profile {name} must be a non-empty list of integers >= 1, got {values}")
        if self.decode_tokens < 8:
            raise ValueError(f"profile decode_tokens must be >= 8 (a decode probe needs gaps), got {self.decode_tokens}")
        if self.repeats < 1:
            raise ValueError(f"profile repeats must be >= 1, got {self.repeats}")
        for name in ("cached_tails", "mixed_tails", "mixed_batches"):
            values = getattr(self, name)
            if values and min(values) < 1:
                raise ValueError(f"profile {name} must be integers >= 1, got {values}")


class _Prompts:
    """Prompts of a given size in the target's tokens, of random words: no two share a block.
    ``seed`` None draws from fresh entropy, so a rerun against the same server (whose prefix
    cache still holds the last run's prompts) misses the cache too."""

    def __init__(self, sizing: PromptSizing, seed: int | None) -> None:
        self._words = sizing.words
        self._overhead = sizing.prompt_overhead_tokens
        self._rng = np.random.default_rng(seed)

    def text(self, n_tokens: int) -> str:
        n = max(1, n_tokens - self._overhead)
        return "".join(" " + self._words[i] for i in self._rng.integers(0, len(self._words), size=n))

    def tail(self, n_tokens: int) -> str:
        return "".join(" " + self._words[i] for i in self._rng.integers(0, len(self._words), size=n_tokens))


def _steady_step_s(outcomes: Sequence[Outcome]) -> tuple[float, int, float] | None:
    """``(step seconds, steps, midpoint)`` while every stream was decoding (after the last first
    token, before the first stream ended): per stream, the time between its first and last token
    in that window over the tokens between, the median over streams. Tokens a busy server
    delivers in bursts shift a window's ends, not its mean rate. None: no stream had two tokens
    in the window."""
    start = max(o.token_times_s[0] for o in outcomes)
    stop = min(o.token_times_s[-1] for o in outcomes)
    rates = []
    steps = 0
    for o in outcomes:
        inside = [t for t in o.token_times_s if start <= t <= stop]
        if len(inside) >= 3 and inside[-1] > inside[0]:
            rates.append((inside[-1] - inside[0]) / (len(inside) - 1))
            steps = max(steps, len(inside) - 1)
    if not rates:
        return None
    return statistics.median(rates), steps, (start + stop) / 2


class Profiler:
    """Runs a :class:`ProfilePlan` against one target with the bench's HTTP client."""

    def __init__(self, target: str, model: str, plan: ProfilePlan, sizing: PromptSizing, *,
                 api_key: str | None = None, seed: int | None = None, on_progress: Callable[[str], None] | None = None,
                 time_scale: float = 1.0) -> None:
        self.config = BenchConfig(targets=(target,), model=model, api="completions", api_key=api_key)
        self.url = self.config.targets[0] + "/v1/completions"
        self.metrics_url = self.config.targets[0] + "/metrics"
        self.time_scale = time_scale  # wall seconds per second the engine reports (our emulator's --time-scale)
        self.decode_timing = {"engine": 0, "client": 0}  # how each decode sample was timed
        self.plan = plan
        self.prompts = _Prompts(sizing, seed)
        self.clock = WallClock()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._say = on_progress or (lambda _msg: None)
        self.skipped: list[str] = []
        self.spreads: list[float] = []  # (max - min) / median of each probe's repeats
        self._jitter = np.random.default_rng(seed)  # mixed probes' pauses

    async def _send(self, opener: Opener, text: str, max_tokens: int) -> Outcome:
        body = request_body(self.config, Prompt(text=text, messages=()), max_tokens)
        out = await send(opener, self.url, body, self._headers, self.clock)
        if out.status == "empty_answer" and out.choice_times_s:
            out.status = "ok"  # a token that ends inside a UTF-8 character streams as empty text
        # Steps are timed by every chunk with a choice: one per generated token.
        out.token_times_s = out.choice_times_s
        if not out.ok or not out.token_times_s:
            raise RuntimeError(f"profile request to {self.url} failed: {out.status} {out.message[:200]}")
        if out.prompt_tokens is None:
            raise RuntimeError(f"{self.url} streamed no usage: the profile needs the prompt tokens the target counted "
                               "(stream_options.include_usage)")
        return out

    def _prefill(self, out: Outcome, chunk: int | None) -> tuple[StepShape, ...]:
        prompt = int(out.prompt_tokens or 0)
        cached = min(out.cached_tokens, prompt - 1)
        return prefill_steps(prompt, chunk or prompt, cached)

    def _median(self, kind: str, steps: tuple[StepShape, ...], times: Sequence[float]) -> Measurement:
        """One measurement from a probe's repeats: their median; their spread goes to ``spreads``."""
        mid = statistics.median(times)
        if len(times) > 1:
            self.spreads.append((max(times) - min(times)) / mid)
        return Measurement(kind, steps, mid)

    async def run(self, chunk_tokens: int | None) -> list[Measurement]:
        """Every probe of the plan, ``repeats`` rounds of it after a warm-up; each probe's median."""
        opener = AiohttpOpener(self.config)
        prefill: dict[int, list[Outcome]] = {n: [] for n in self.plan.prompt_tokens}
        decode: dict[tuple[int, int], list[tuple[float, int]]] = {}
        seen: dict[tuple[StepShape, ...], list[float]] = {}  # prefills the decode probes ran
        mixed: dict[tuple[int, int, int], list[tuple[StepShape, float]]] = {}  # (ctx, batch, tail) -> samples
        try:
            async with httpx.AsyncClient(timeout=10.0, headers=self._headers) as metrics:
                await self._send(opener, self.prompts.text(64), 4)  # warm-up: connections, first-request costs
                for r in range(self.plan.repeats):
                    for n in self.plan.prompt_tokens:
                        prefill[n].append(await self._send(opener, self.prompts.text(n), 1))
                    for ctx in self.plan.contexts:
                        for batch in self.plan.batches:
                            found, sample = await self._decode(opener, metrics, ctx, batch, chunk_tokens)
                            for m in found:
                                seen.setdefault(m.steps, []).append(m.time_s)
                            if sample is not None:
                                decode.setdefault((ctx, batch), []).append(sample)
                        if self.plan.mixed_tails:
                            for batch in self.plan.mixed_batches:
                                for n, landed in (await self._mixed(opener, ctx, batch, chunk_tokens)).items():
                                    mixed.setdefault((ctx, batch, n), []).append(landed)
                    self._say(f"round {r + 1} of {self.plan.repeats} done")
        finally:
            await opener.close()
        out = []
        for runs in prefill.values():
            out.append(self._median("prefill", self._prefill(runs[0], chunk_tokens),
                                    [o.token_times_s[0] - o.sent_s for o in runs]))
            self._say(f"prefill {runs[0].prompt_tokens} tokens: TTFT {out[-1].time_s * 1e3:.1f} ms")
        for ctx in self.plan.contexts:
            for batch in self.plan.batches:
                samples = decode.get((ctx, batch), [])
                if not samples:
                    self.skipped.append(f"decode batch {batch} @ {ctx}: the streams never all decoded at once")
                    continue
                # The median step of the rounds, at their mean context (they differ by a few tokens).
                context = round(statistics.mean(c for _, c in samples))
                out.append(self._median("decode", (decode_step(batch, context),), [t for t, _ in samples]))
                self._say(f"decode batch {batch} @ {ctx} tokens: step {out[-1].time_s * 1e3:.2f} ms")
        for (ctx, batch, n), steps in mixed.items():
            # The median of the rounds, at their mean decode context (it differs with when the chunk landed).
            context = round(statistics.mean(s.decode_context_tokens for s, _ in steps))
            shape = dataclasses.replace(steps[0][0], decode_context_tokens=context)
            out.append(self._median("mixed", (shape,), [t for _, t in steps]))
            self._say(f"mixed: {n}-token chunk after {ctx} cached while {batch} decode: step {out[-1].time_s * 1e3:.2f} ms")
        for ctx in self.plan.contexts:
            for batch in self.plan.mixed_batches if self.plan.mixed_tails else ():
                for n in self.plan.mixed_tails:
                    if (ctx, batch, n) not in mixed:
                        self.skipped.append(f"mixed {n} @ {ctx} with {batch} decoding: never landed while all decoded")
        # The shared contexts' cold prefills, and single streams' prefills after them (cached).
        return out + [self._median("prefill", steps, times) for steps, times in seen.items()]

    async def _mixed(self, opener: Opener, ctx: int, batch: int, chunk: int | None) -> dict[int, tuple[StepShape, float]]:
        """Each of the plan's ``mixed_tails`` sent alone after a cached ``ctx``-token context while
        ``batch`` streams decode on it: ``{tail: (the mixed step, its seconds)}``. The chunk arrives
        at a random moment of a decode step (after a random pause) and waits for it to end, half a
        step on average, as a request does in the simulator, which models that wait itself: the
        mixed step is its TTFT less half the streams' median gap. The server's own work on the
        chunk stays in, as in a prefill probe's TTFT (the fit's per-chunk term carries it). Not
        the wait measured off the streams' tokens: the server's intake of the chunk overlaps that
        wait, and taking it out would leave that work out. Chunks that did not land while every
        stream decoded are left out."""
        prefix = self.prompts.text(ctx)
        await self._send(opener, prefix, 1)  # caches the shared context (a prefill the decode probes measure)
        streams = [asyncio.ensure_future(self._send(opener, prefix + self.prompts.tail(SUFFIX_TOKENS),
                                                    MIXED_DECODE_FACTOR * self.plan.decode_tokens))
                   for _ in range(batch)]
        chunks = []
        try:
            await asyncio.sleep(MIXED_SETTLE_S)
            for n in self.plan.mixed_tails:
                await asyncio.sleep(float(self._jitter.uniform(0.0, MIXED_JITTER_S)))
                chunks.append((n, await self._send(opener, prefix + self.prompts.tail(n), 1)))
        finally:
            outs = await asyncio.gather(*streams)
        found: dict[int, tuple[StepShape, float]] = {}
        for n, c in chunks:
            sent, first = c.sent_s, c.token_times_s[0]
            steps = self._prefill(c, chunk)
            if c.cached_tokens <= 0 or len(steps) != 1 or any(
                    o.token_times_s[0] >= sent or o.token_times_s[-1] <= first for o in outs):
                continue  # not one chunk after the cached context, landed while every stream decoded
            gap = statistics.median(b - a for o in outs for a, b in zip(o.token_times_s, o.token_times_s[1:], strict=False))
            context = sum(int(o.prompt_tokens or 0) + sum(1 for t in o.token_times_s if t <= first) for o in outs)
            time_s = first - sent - gap / 2
            if time_s > 0:
                found[n] = (mixed_step(steps[0], batch, context), time_s)
        return found

    async def _itl_totals(self, metrics: httpx.AsyncClient) -> tuple[float, float] | None:
        try:
            resp = await metrics.get(self.metrics_url)
        except httpx.HTTPError:
            return None
        return histogram_totals(resp.text, ITL_HISTOGRAM) if resp.status_code == 200 else None

    async def _engine_step_s(self, metrics: httpx.AsyncClient, before: tuple[float, float] | None,
                             gaps: int) -> float | None:
        """Mean of the ``gaps`` inter-token gaps the engine recorded since ``before``; None when it
        exports no histogram or counted other gaps (the probe was not alone)."""
        if before is None or gaps < 1:
            return None
        for _ in range(ITL_SETTLE_TRIES):
            after = await self._itl_totals(metrics)
            if after is None:
                return None
            total, count = after[0] - before[0], round(after[1] - before[1])
            if count == gaps and total > 0:
                return total / count * self.time_scale
            if count > gaps:
                return None
            await asyncio.sleep(0.02)
        return None

    async def _decode(self, opener: Opener, metrics: httpx.AsyncClient, ctx: int, batch: int, chunk: int | None
                      ) -> tuple[list[Measurement], tuple[float, int] | None]:
        """Prefill measurements (the shared context's cold prefill; with ``batch`` 1, the stream's own
        prefill after that cached context) and ``(step seconds, context tokens)`` of ``batch`` streams
        decoding on the context (None when they never all decoded at once)."""
        prefix = self.prompts.text(ctx)
        first = await self._send(opener, prefix, 1)  # caches the shared context
        found = [Measurement("prefill", self._prefill(first, chunk), first.token_times_s[0] - first.sent_s)]
        before = await self._itl_totals(metrics)
        outs = await asyncio.gather(*(self._send(opener, prefix + self.prompts.tail(SUFFIX_TOKENS),
                                                 self.plan.decode_tokens) for _ in range(batch)))
        if batch == 1 and outs[0].cached_tokens > 0:
            alone = outs[0]
            found.append(Measurement("prefill", self._prefill(alone, chunk), alone.token_times_s[0] - alone.sent_s))
            for n in self.plan.cached_tails:  # the context is still cached: a chunk after it, alone
                tail = await self._send(opener, prefix + self.prompts.tail(n), 1)
                if tail.cached_tokens > 0:
                    found.append(Measurement("prefill", self._prefill(tail, chunk), tail.token_times_s[0] - tail.sent_s))
        made = [int(o.completion_tokens or len(o.token_times_s)) for o in outs]
        step = await self._engine_step_s(metrics, before, sum(n - 1 for n in made))
        if step is not None:
            # Every gap of every stream: the context each holds halfway through its answer.
            self.decode_timing["engine"] += 1
            return found, (step, sum(int(o.prompt_tokens or 0) + n // 2 for o, n in zip(outs, made, strict=True)))
        steady = _steady_step_s(outs)
        if steady is None:
            return found, None
        self.decode_timing["client"] += 1
        step, _, mid = steady
        # Context each sequence holds at the window's midpoint: its prompt and the tokens streamed by then.
        context = sum(int(o.prompt_tokens or 0) + sum(1 for t in o.token_times_s if t <= mid) for o in outs)
        return found, (step, context)


def profile(target: str, plan: ProfilePlan, *, model: str, api_key: str | None = None, seed: int | None = None,
            on_progress: Callable[[str], None] | None = None) -> EngineCalibration:
    """Measure ``target`` per ``plan`` and fit; raises RuntimeError when a probe request fails."""
    base = BenchConfig(targets=(target,), model=model).targets[0]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=10.0, headers=headers) as client:
        limits = read_engine_limits(base, client, max_num_batched_tokens=plan.max_num_batched_tokens,
                                    max_num_seqs=plan.max_num_seqs)
        time_scale = time_scale_of(base, client)
    tok = probe_remote(base, model=model, api_key=api_key)
    sizing = PromptSizing()
    if tok is not None:
        try:
            sizing = measure_sizing(tok, "completions")
        except ValueError:
            pass  # built-in sizing: the probes' lengths drift, the usage counts stay exact
        finally:
            tok.close()
    profiler = Profiler(base, model, plan, sizing, api_key=api_key, seed=seed, on_progress=on_progress,
                        time_scale=time_scale)
    with asyncio.Runner() as runner:
        measurements = runner.run(profiler.run(limits.max_num_batched_tokens))
    fit = fit_steps(measurements)
    # How far a probe's repeats lay apart (median over probes): a busy machine's noise, which no fit removes.
    spread = statistics.median(profiler.spreads) if profiler.spreads else None
    summary: dict[str, Any] = {**fit.summary(), "repeat_spread": spread, "prompt_sizing": sizing.source,
                               "decode_timing": profiler.decode_timing}
    if profiler.skipped:
        summary["skipped"] = profiler.skipped
    return EngineCalibration(step=fit.coefficients, engine=limits, target=base, model=model, fit=summary,
                             measurements=tuple(measurements))
