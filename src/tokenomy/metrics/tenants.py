"""Per-tenant and per-tier results: who got the service under overload.

For each tenant (and each tier) of a run: requests offered (records plus requests refused at
the door), finished, SLO-met, attainment (met / offered, refusals count as misses), goodput
(met per second of the run's window), TTFT and TPOT P50/P99 (``summary.py``'s definitions), and
the requests refused (or shed) and deferred by admission, and the refused attempts a client sent
again (``retried``: a retried turn is one request, its TTFT counted from its first attempt; only
a turn refused past its retries is ``refused``). A record's tier is ``""`` when the
workload gave none; a run whose records all belong to tenant ``"default"`` without a tier and
that refused or deferred nothing has no breakdown (empty dicts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics.percentiles import percentile

GroupKey = tuple[str, str]
"""``(tenant, tier)``."""


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _group(records: list[RequestRecord], refused: int, deferred: int | None, retried: int, slo: SLO,
           duration_s: float, refusals_are_records: bool) -> dict[str, Any]:
    finished = [r for r in records if r.finished and r.finish_s is not None and r.first_token_s is not None]
    met = sum(1 for r in finished if slo.met(r.ttft_s or 0.0, r.tpot_s or 0.0))
    ttfts = [t for r in records if (t := r.ttft_s) is not None]
    tpots = [t for r in finished if r.output_tokens > 1 and (t := r.tpot_s) is not None]
    offered = len(records) + (0 if refusals_are_records else refused)
    return {
        "requests": offered,
        "finished": len(finished),
        "slo_met": met,
        "attainment": met / offered if offered else 0.0,
        "goodput_rps": met / duration_s if duration_s > 0 else 0.0,
        "ttft_p50_s": _p(ttfts, 50), "ttft_p99_s": _p(ttfts, 99),
        "tpot_p50_s": _p(tpots, 50), "tpot_p99_s": _p(tpots, 99),
        "refused": refused,
        "deferred": deferred,
        "retried": retried,
    }


def tenant_breakdown(
    records: Iterable[RequestRecord],
    *,
    slo: SLO,
    duration_s: float,
    refusals: Mapping[GroupKey, int] | None = None,
    deferrals: Mapping[GroupKey, int] | None = None,
    refusals_are_records: bool = False,
    retries: Mapping[GroupKey, int] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(by_tenant, by_tier)`` (module docstring). ``deferrals`` None: not known (a client
    cannot see them), reported as None rather than 0. ``refusals_are_records``: the refused
    requests are among ``records`` already (a client's view), so they are not added again.
    ``retries``: refused attempts sent again, per group (not requests, not refusals)."""
    recs = list(records)
    refusals = dict(refusals or {})
    retries = dict(retries or {})
    keys: set[GroupKey] = {(r.tenant, r.tier) for r in recs} | set(refusals) | set(deferrals or {}) | set(retries)
    if not refusals and not deferrals and not retries and keys <= {("default", "")}:
        return {}, {}
    out: list[dict[str, dict[str, Any]]] = []
    for pos in (0, 1):  # 0: by tenant, 1: by tier
        groups: dict[str, list[RequestRecord]] = {}
        for r in recs:
            groups.setdefault((r.tenant, r.tier)[pos], []).append(r)
        names = sorted({k[pos] for k in keys})
        out.append({
            name: _group(groups.get(name, []), sum(v for k, v in refusals.items() if k[pos] == name),
                         None if deferrals is None else sum(v for k, v in deferrals.items() if k[pos] == name),
                         sum(v for k, v in retries.items() if k[pos] == name), slo, duration_s, refusals_are_records)
            for name in names
        })
    return out[0], out[1]
