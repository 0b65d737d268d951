"""Bench results reduced by the ``metrics`` package: the same RequestRecords the simulator
builds, the same :func:`~tokenomy.metrics.summarize`, plus what only a live run has (errors by
status, how far the sent prompts were from the workload's sizes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenomy.bench.config import BenchConfig
from tokenomy.bench.runner import TurnResult
from tokenomy.core import RequestRecord, TokenUsage
from tokenomy.metrics import Summary, summarize
from tokenomy.metrics.window import busy_window_s, span_s


def _usage(result: TurnResult, prompt: int, output: int, cached: int) -> TokenUsage:
    """Token classes of one request. The target reports only prompt, output and cached counts;
    the origin split (new input / incremental prefill / history) scales the workload's split to
    the prompt the target counted, so both partitions of :class:`TokenUsage` stay exact."""
    turn = result.turn
    history = min(prompt, round(turn.history_tokens * prompt / turn.prompt_tokens))
    new = prompt - history
    return TokenUsage(
        input_tokens=new if result.index == 0 else 0,
        incremental_prefill_tokens=new if result.index > 0 else 0,
        history_tokens=history,
        output_tokens=output,
        cache_hit_tokens=cached,
        recomputed_tokens=prompt - cached,
    )


def to_record(result: TurnResult, t0: float) -> RequestRecord:
    """The RequestRecord of one sent turn, times relative to the run's start ``t0``.

    A successful request takes its token counts from the target's ``usage`` (falling back to
    the workload's prompt size and the number of streamed chunks when the target sent none).
    A failed one is unfinished: it counts against SLO attainment, as a cut-off request does in
    the simulator. A turn the client retried after a refusal is one record whose arrival is its
    first attempt's send: its TTFT is what the user waited, refusals and retry-after included.
    """
    out = result.outcome
    times = out.token_times_s
    first = times[0] - t0 if times else None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    prompt = out.prompt_tokens if out.prompt_tokens is not None else result.turn.prompt_tokens
    output = out.completion_tokens if out.completion_tokens is not None else len(times)
    cached = out.cached_tokens if out.ok else 0
    return RequestRecord(
        request_id=f"{result.session_id}:{result.index}",
        arrival_s=result.sent_s - t0,
        first_token_s=first,
        finish_s=out.finish_s - t0 if out.ok and out.finish_s is not None else None,
        prompt_tokens=prompt,
        output_tokens=output,
        session_id=result.session_id,
        turn=result.index,
        tenant=result.tenant,
        tier=result.tier,
        usage=_usage(result, prompt, output, cached) if out.ok else TokenUsage(),
        max_itl_s=max(gaps, default=0.0),
        finished=out.ok,
        decode_instance=result.target,
    )


@dataclass
class BenchReport:
    """A run's Summary and the live-only figures that go next to it in the JSON."""

    summary: Summary
    records: list[RequestRecord]
    errors_by_status: dict[str, int]
    extras: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """The deployment entry of ``--json``: every Summary field plus the extras."""
        return {**self.summary.to_dict(), "errors_by_status": dict(self.errors_by_status), **self.extras}


def _prompt_size_error(results: Sequence[TurnResult]) -> dict[str, Any]:
    sent = [(r.outcome.prompt_tokens, r.turn.prompt_tokens) for r in results
            if r.outcome.ok and r.outcome.prompt_tokens is not None]
    out = [(r.outcome.completion_tokens, r.turn.output_tokens) for r in results
           if r.outcome.ok and r.outcome.completion_tokens is not None]
    rel = [abs(s - w) / w for s, w in sent]
    return {
        "prompt_tokens_sent": sum(s for s, _ in sent),
        "prompt_tokens_workload": sum(w for _, w in sent),
        "prompt_tokens_mean_abs_rel_error": sum(rel) / len(rel) if rel else None,
        "output_tokens_received": sum(s for s, _ in out),
        "output_tokens_workload": sum(w for _, w in out),
    }


def report(results: Sequence[TurnResult], t0: float, config: BenchConfig, wall_s: float) -> BenchReport:
    """Summarise ``results`` of a run that started at ``t0`` on the bench clock.

    The window is the busy window (time with a request in flight, as the simulator's:
    closed-loop think time does not dilute rates and costs), ``span_s`` first send to last
    finish; ITL pools every gap between consecutive streamed chunks of every request (vLLM
    bench's definition).
    """
    records = [to_record(r, t0) for r in results]
    itl = [b - a for r in results if r.outcome.ok
           for a, b in zip(r.outcome.token_times_s, r.outcome.token_times_s[1:], strict=False)]
    end = max((rec.finish_s for rec in records if rec.finish_s is not None), default=0.0)
    end = max(end, max((rec.arrival_s for rec in records), default=0.0), 1e-9)
    # A turn refused past its retries (429, 503) is a failed request, still a record (unfinished):
    # counted per tenant as refused, inside its requests; the refused attempts that were sent again
    # are counted as retried. Deferrals are not visible to a client (None).
    refusals = Counter((r.tenant, r.tier) for r in results if r.abandoned)
    retries: Counter[tuple[str, str]] = Counter()
    for r in results:
        retries[(r.tenant, r.tier)] += len(r.retried)
    summary = summarize(
        records,
        slo=config.slo,
        duration_s=max(busy_window_s(records, end), 1e-9) if records else end,
        span_s=span_s(records, end),
        num_gpus=config.gpus,
        usd_per_gpu_hour=config.usd_per_gpu_hour,
        itl_values=itl or None,
        tenant_refusals=refusals,
        refusals_are_records=True,
        tenant_retries=+retries,
    )
    # every failed answer, the retried refusals included (what the target answered, attempt by attempt)
    errors = Counter(r.outcome.status for r in results if not r.outcome.ok)
    errors.update(s for r in results for s in r.retried)
    examples = {r.outcome.status: r.outcome.message[:300] for r in reversed(results) if not r.outcome.ok}
    prompt = summary.tokens.get("prompt_tokens", 0)
    extras: dict[str, Any] = {
        "cached_fraction": summary.tokens.get("cache_hit_tokens", 0) / prompt if prompt else None,
        "error_examples": dict(sorted(examples.items())),
        "usage_missing": sum(1 for r in results if r.outcome.ok and not r.outcome.usage_reported),
        "sessions": len({r.session_id for r in results}),
        "retries": sum(retries.values()),
        "abandoned_turns": sum(refusals.values()),
        "wall_s": round(wall_s, 3),
        **_prompt_size_error(results),
    }
    return BenchReport(summary, records, dict(sorted(errors.items())), extras)
