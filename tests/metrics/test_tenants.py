"""Per-tenant and per-tier results, computed by hand."""

from __future__ import annotations

import pytest

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics import summarize


def rec(rid: str, tenant: str, tier: str, ttft: float, finished: bool = True) -> RequestRecord:
    return RequestRecord(rid, 0.0, ttft if finished else None, ttft + 1.0 if finished else None, 10, 11,
                         tenant=tenant, tier=tier, finished=finished)


def test_attainment_goodput_refusals_and_deferrals_by_tenant_and_tier() -> None:
    records = [rec("a", "acme", "gold", 0.5), rec("b", "acme", "gold", 3.0), rec("c", "bob", "gold", 0.2),
               rec("d", "zed", "free", 0.1), rec("e", "zed", "free", 0.1, finished=False)]
    s = summarize(records, slo=SLO(ttft_s=2.0, tpot_s=0.2), duration_s=10.0, num_gpus=1, usd_per_gpu_hour=0.0,
                  rejected={"admission": 3}, tenant_refusals={("zed", "free"): 2, ("bob", "gold"): 1},
                  tenant_deferrals={("acme", "gold"): 4})
    gold, free = s.by_tier["gold"], s.by_tier["free"]
    assert (gold["requests"], gold["slo_met"], gold["refused"], gold["deferred"]) == (4, 2, 1, 4)
    assert gold["attainment"] == pytest.approx(0.5) and gold["goodput_rps"] == pytest.approx(0.2)
    assert (free["requests"], free["slo_met"], free["refused"]) == (4, 1, 2)
    assert free["attainment"] == pytest.approx(0.25)
    assert s.by_tenant["acme"]["ttft_p50_s"] == pytest.approx(1.75) and s.by_tenant["acme"]["refused"] == 0
    assert s.by_tenant["bob"]["deferred"] == 0
    assert sum(g["requests"] for g in s.by_tier.values()) == s.requests == 8


def test_no_breakdown_without_tenants_and_unknown_deferrals_stay_unknown() -> None:
    plain = summarize([rec("a", "default", "", 0.5)], slo=SLO(), duration_s=1.0, num_gpus=1, usd_per_gpu_hour=0.0)
    assert plain.by_tenant == {} and plain.by_tier == {}
    seen = summarize([rec("a", "acme", "gold", 0.5), rec("b", "acme", "gold", 0.5, finished=False)], slo=SLO(),
                     duration_s=1.0, num_gpus=1, usd_per_gpu_hour=0.0, tenant_refusals={("acme", "gold"): 1},
                     refusals_are_records=True)
    assert seen.by_tier["gold"]["requests"] == 2 and seen.by_tier["gold"]["refused"] == 1
    assert seen.by_tier["gold"]["deferred"] is None  # a client cannot see deferrals
