"""One deployment's run reduced to the whitepaper's metrics (MISSION.md section 1.4).

Definitions (the same ones ``vllm bench serve`` uses, so numbers compare):

* TTFT: first token minus arrival, over every request that produced a first token.
  ``ttft_p99_tpot_met_s``: its P99 over the finished requests that met the TPOT bound (one-token
  answers included), so a deployment that spends TPOT to shorten its TTFT tail is judged on the
  requests it still serves within TPOT (the AMPD grid's tail rule, docs/ampd-results.md).
* TPOT: (E2E - TTFT) / (output_tokens - 1), excluding the first token, over finished requests
  with more than one output token (a one-token answer has no TPOT to report).
* ITL: pooled inter-token gaps when the caller has them (step gaps weighted by the tokens they
  delayed); otherwise the per-request TPOT stands in.
* E2E: finish minus arrival, over finished requests.
* SLO attainment: requests that finished *and* met both the TTFT and TPOT bounds, divided by
  ALL requests; unfinished and rejected requests count as misses (fast but late is not done).
* rejected: requests refused at the door (e.g. larger than any instance's KV), counted by
  reason. They are misses, but add no tokens and no time: rates, costs and the window never
  see them.
* window (``duration_s``): what the caller passes; the simulator passes the busy window
  (``metrics/window.py``: time with at least one request in the system), so idle think time of
  closed-loop sessions does not dilute rates and costs. ``span_s`` is first arrival to last
  finish, for reference. With a zero window (nothing ran) every rate and cost is 0.
* goodput: SLO-meeting finished requests per second of the window.
* RPM: finished requests per minute; TPM: prompt + output tokens per minute (all requests,
  since a cut-off request still consumed its tokens).
* cost: GPUs x $/GPU-hour over the window, per million prompt+output tokens and per million
  output tokens; None ("n/a") when no price was given (``usd_per_gpu_hour`` 0).
* MFU: useful FLOPs / (window x peak FLOP/s of all the GPUs together); None ("n/a") when the
  peak is not known (``peak_flops_per_s`` 0, e.g. ``tokenomy bench``, which sees no hardware).
* ``by_tenant`` / ``by_tier``: the same figures per tenant and per tier, with refusals and
  deferrals (``metrics/tenants.py``); empty when the run has no tenants.

Undefined values (a percentile of no samples, a cost per token with no tokens) are None, so
the JSON form never holds NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenomy.core import SLO, RequestRecord, TokenUsage
from tokenomy.metrics.percentiles import percentile, weighted_mean, weighted_percentiles
from tokenomy.metrics.tenants import GroupKey, tenant_breakdown

Samples = Sequence[float] | npt.NDArray[np.float64]
"""Latency samples or weights: a sequence, or a float vector used as is."""

_SECONDS_PER_HOUR = 3600.0
_PER_MILLION = 1e6


@dataclass(frozen=True, slots=True)
class Summary:
    """Metrics of one run. Latencies in seconds, rates per second unless named per minute."""

    requests: int = 0
    finished: int = 0
    rejected: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    slo_met: int = 0
    num_gpus: int = 0
    duration_s: float = 0.0
    span_s: float = 0.0
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_mean_s: float | None = None
    ttft_p99_tpot_met_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None
    tpot_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_mean_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    e2e_mean_s: float | None = None
    slo_attainment: float = 0.0
    goodput_rps: float = 0.0
    goodput_per_gpu_rps: float = 0.0
    rpm: float = 0.0
    tpm: float = 0.0
    output_tps: float = 0.0
    cost_usd: float = 0.0
    cost_per_mtok_usd: float | None = None
    cost_per_mtok_output_usd: float | None = None
    mfu: float | None = None
    tokens: dict[str, int] = field(default_factory=lambda: TokenUsage().to_dict())
    by_tenant: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_tier: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field; any non-finite float becomes None."""
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _pcts(values: Sequence[float]) -> tuple[float | None, float | None, float | None, float | None]:
    """(p50, p90, p99, mean), all None for no samples."""
    if not values:
        return None, None, None, None
    return (
        percentile(values, 50),
        percentile(values, 90),
        percentile(values, 99),
        math.fsum(values) / len(values),
    )


def _check_args(num_gpus: int, duration_s: float, usd_per_gpu_hour: float, total_flops: float,
                peak_flops_per_s: float, has_records: bool) -> None:
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be at least 1, got {num_gpus}")
    for name, value in (("duration_s", duration_s), ("usd_per_gpu_hour", usd_per_gpu_hour),
                        ("total_flops", total_flops), ("peak_flops_per_s", peak_flops_per_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite non-negative number, got {value}")
    if has_records and duration_s <= 0:
        raise ValueError(f"duration_s must be positive when there are requests, got {duration_s}")


def _itl(
    itl_values: Samples | None, itl_weights: Samples | None, tpots: Sequence[float]
) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, mean) of pooled ITL samples if given, else of per-request TPOT."""
    if itl_values is None or len(itl_values) == 0:
        if itl_weights is not None and len(itl_weights) > 0:
            raise ValueError("itl_weights given without itl_values")
        p50, _, p99, mean = _pcts(tpots)
        return p50, p99, mean
    values = np.asarray(itl_values, dtype=np.float64)  # converted once, not per statistic
    weights = np.ones(len(values)) if itl_weights is None else np.asarray(itl_weights, dtype=np.float64)
    if len(weights) != len(values):
        raise ValueError(f"{len(values)} itl_values but {len(weights)} itl_weights")
    p50, p99 = weighted_percentiles(values, weights, (50, 99))
    return p50, p99, weighted_mean(values, weights)


def summarize(
    records: Iterable[RequestRecord],
    *,
    slo: SLO,
    duration_s: float,
    num_gpus: int,
    usd_per_gpu_hour: float,
    total_flops: float = 0.0,
    peak_flops_per_s: float = 0.0,
    itl_values: Samples | None = None,
    itl_weights: Samples | None = None,
    rejected: Mapping[str, int] | None = None,
    span_s: float = 0.0,
    tenant_refusals: Mapping[GroupKey, int] | None = None,
    tenant_deferrals: Mapping[GroupKey, int] | None = None,
    refusals_are_records: bool = False,
    tenant_retries: Mapping[GroupKey, int] | None = None,
) -> Summary:
    """Reduce ``records`` of a window of ``duration_s`` seconds on ``num_gpus`` GPUs to a Summary.

    ``peak_flops_per_s`` is the peak of ALL ``num_gpus`` GPUs together (per-GPU peak x GPUs);
    MFU is None when it is 0 (not known), and costs per token are None when ``usd_per_gpu_hour``
    is 0 (no price given). ``rejected`` counts requests refused before running, by reason
    (not in ``records``): they count in ``requests`` and as SLO misses, nowhere else. Empty
    ``records`` give a Summary of zeros and None percentiles; a zero window gives zero rates
    and costs. Raises ValueError on negative or non-finite arguments, ``num_gpus < 1``, or a
    zero window with records in it. ``tenant_refusals`` / ``tenant_deferrals`` count, per
    ``(tenant, tier)``, requests admission refused (also in ``rejected``) and requests it made
    wait (None: not known); they feed ``by_tenant`` and ``by_tier``. ``refusals_are_records``: the
    refused requests are also (unfinished) records, as a client sees them (``bench``).
    ``tenant_retries``: per ``(tenant, tier)``, refused attempts a client sent again (a retried
    request is one request; its record's arrival is its first attempt's).
    """
    recs = list(records)
    refused = {k: int(v) for k, v in (rejected or {}).items() if v}
    if any(v < 0 for v in refused.values()):
        raise ValueError(f"rejected counts must be >= 0, got {refused}")
    n_rejected = sum(refused.values())
    _check_args(num_gpus, duration_s, usd_per_gpu_hour, total_flops, peak_flops_per_s, bool(recs))

    # One pass, each record's latencies computed once (a simulation summarises tens of thousands).
    finished: list[RequestRecord] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    ttfts_tpot_met: list[float] = []  # TTFT of the finished requests that met their TPOT SLO
    met = 0
    for r in recs:
        req_ttft = r.ttft_s
        if req_ttft is None:
            continue
        ttfts.append(req_ttft)
        if not r.finished or r.finish_s is None:
            continue
        finished.append(r)
        req_tpot = r.tpot_s or 0.0  # (a float: the request has a first token and a finish)
        # One-token answers have no inter-token time: vLLM leaves them out of TPOT, so do we.
        if r.output_tokens > 1:
            tpots.append(req_tpot)
        e2es.append(r.finish_s - r.arrival_s)
        if slo.met(req_ttft, req_tpot):
            met += 1
        if req_tpot <= slo.tpot_s:
            ttfts_tpot_met.append(req_ttft)

    usage = TokenUsage()
    for r in recs:
        usage.add(r.usage)
    prompt_tokens = sum(r.prompt_tokens for r in recs)
    output_tokens = sum(r.output_tokens for r in recs)
    total_tokens = prompt_tokens + output_tokens

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    cost_usd = num_gpus * usd_per_gpu_hour * duration_s / _SECONDS_PER_HOUR
    priced = usd_per_gpu_hour > 0  # no price given: cost per token is unknown, not free
    peak_work = duration_s * peak_flops_per_s
    ttft = _pcts(ttfts)
    tpot = _pcts(tpots)
    itl = _itl(itl_values, itl_weights, tpots)
    e2e = _pcts(e2es)
    by_tenant, by_tier = tenant_breakdown(recs, slo=slo, duration_s=duration_s, refusals=tenant_refusals,
                                          deferrals=tenant_deferrals, refusals_are_records=refusals_are_records,
                                          retries=tenant_retries)
    return Summary(
        requests=len(recs) + n_rejected,
        finished=len(finished),
        rejected=n_rejected,
        rejected_reasons=refused,
        slo_met=met,
        num_gpus=num_gpus,
        duration_s=duration_s,
        span_s=span_s,
        ttft_p50_s=ttft[0], ttft_p90_s=ttft[1], ttft_p99_s=ttft[2], ttft_mean_s=ttft[3],
        ttft_p99_tpot_met_s=percentile(ttfts_tpot_met, 99) if ttfts_tpot_met else None,
        tpot_p50_s=tpot[0], tpot_p90_s=tpot[1], tpot_p99_s=tpot[2], tpot_mean_s=tpot[3],
        itl_p50_s=itl[0], itl_p99_s=itl[1], itl_mean_s=itl[2],
        e2e_p50_s=e2e[0], e2e_p99_s=e2e[2], e2e_mean_s=e2e[3],
        slo_attainment=met / (len(recs) + n_rejected) if recs or n_rejected else 0.0,
        goodput_rps=per_s(met),
        goodput_per_gpu_rps=per_s(met) / num_gpus,
        rpm=per_s(len(finished)) * 60.0,
        tpm=per_s(total_tokens) * 60.0,
        output_tps=per_s(output_tokens),
        cost_usd=cost_usd,
        cost_per_mtok_usd=cost_usd / total_tokens * _PER_MILLION if total_tokens and priced else None,
        cost_per_mtok_output_usd=cost_usd / output_tokens * _PER_MILLION if output_tokens and priced else None,
        mfu=(total_flops / peak_work if peak_work > 0 else 0.0) if peak_flops_per_s > 0 else None,
        tokens=usage.to_dict(),
        by_tenant=by_tenant,
        by_tier=by_tier,
    )
