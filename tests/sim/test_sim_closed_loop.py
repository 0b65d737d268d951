"""The closed loop in the simulator: the admission gate applies the policy, budgets slow a tenant
before cutting it, and no tier starves under the benchmark's overload."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from tokenomy.core import SLO, Session
from tokenomy.policy.closedloop import RetryPolicy
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.admission_options import AdmissionOptions
from tokenomy.workload import StreamKeys
from tokenomy.workload.build import grow_turns

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _sessions(n: int, tenant: str, tier: str, *, gap_s: float = 0.5, budget: int | None = None) -> list[Session]:
    keys = StreamKeys()
    sys_key = keys.new()
    return [Session(f"{tenant}-{i}", i * gap_s, grow_turns(sys_key, 500, keys.new(), [400] * 4, [60] * 4, [1.0] * 4),
                    tenant=tenant, tier=tier, budget_tokens=budget) for i in range(n)]


def test_a_tenant_near_the_end_of_its_budget_is_deferred_before_it_is_refused() -> None:
    # 8 sessions of ~4 turns of ~1.5-2.5k tokens each: ~65k tokens wanted, 30k of budget
    sessions = _sessions(8, "acme", "silver", budget=30_000)
    trace: list[dict[str, Any]] = []
    cfg = SimConfig(instances=1, admission=AdmissionOptions("tier_wfq", max_in_flight=64))
    res = simulate(sessions, cfg, SLO(), decision_trace=trace.append)
    gate = [e for e in trace if e["kind"] == "closed_loop_admission" and e["tenant"] == "acme"]
    slowed = [i for i, e in enumerate(gate) if e["action"] == "queue" and "budget low" in e["reason"]]
    refused = [i for i, e in enumerate(gate) if e["action"] == "refuse"]
    assert slowed and refused, [e["reason"] for e in gate]
    assert slowed[0] < refused[0]  # slowed first, cut later
    assert all("budget exhausted" in gate[i]["reason"] for i in refused)
    assert any(e["eligible_s"] > e["t_s"] for e in gate[: refused[0]] if "budget low" in e["reason"])
    acme = res.summary.by_tenant["acme"]
    assert acme["refused"] == len(refused) and acme["deferred"] >= 1


def test_every_request_is_served_or_refused_and_refusals_end_their_session() -> None:
    sessions = _sessions(30, "gold", "gold", gap_s=0.05) + _sessions(30, "free", "free", gap_s=0.05)
    cfg = SimConfig(instances=1, admission=AdmissionOptions("tier_wfq", max_in_flight=4))
    res = simulate(sessions, cfg, SLO(ttft_s=0.5))
    s = res.summary
    refused = sum(g["refused"] for g in s.by_tier.values())
    assert refused == s.rejected > 0
    assert s.requests == len(res.records) + refused
    by_session: dict[str, list[int]] = {}
    for r in res.records:
        by_session.setdefault(r.session_id, []).append(r.turn)
    assert all(sorted(t) == list(range(len(t))) for t in by_session.values())  # no turn after a gap
    assert s.by_tier["gold"]["attainment"] > s.by_tier["free"]["attainment"]


def test_a_shed_request_comes_back_after_its_retry_after_keeping_its_first_arrival() -> None:
    sessions = _sessions(6, "free", "free", gap_s=0.0)  # six at once through one slot: some wait past 1 s
    trace: list[dict[str, Any]] = []
    opts = AdmissionOptions("tier_wfq", max_in_flight=1, retry_after_s=2, retry=RetryPolicy(max_retries=20))
    res = simulate(sessions, SimConfig(instances=1, admission=opts), SLO(ttft_s=30.0), decision_trace=trace.append)
    shed: dict[str, list[float]] = {}
    for e in trace:
        if e["kind"] == "closed_loop_admission" and "shed" in e["reason"]:
            shed.setdefault(e["request_id"], []).append(e["t_s"])
    admitted = {e["request_id"]: e["t_s"] for e in trace if e["kind"] == "closed_loop_admit"}
    assert shed and set(shed) <= set(admitted)  # every shed request was served on a retry
    queued = [e for e in trace if e["kind"] == "closed_loop_admission" and e["action"] == "queue"]
    for e in queued:  # the gate tells the policy which attempts are retries: they wait behind first attempts
        assert e["retry_last"] == (e["request_id"] in shed and e["t_s"] > shed[e["request_id"]][0])
    records = {r.request_id: r for r in res.records}
    for rid, times in shed.items():
        assert admitted[rid] >= times[-1] + 2.0  # not before its retry-after
        rec = records[rid]
        assert rec.finished and rec.arrival_s <= times[0] - 1.0  # its TTFT counts from the first attempt
        assert rec.ttft_s is not None and rec.ttft_s >= 1.0 + 2.0 * len(times)
    s = res.summary
    assert s.by_tier["free"]["retried"] == sum(map(len, shed.values())) and s.by_tier["free"]["refused"] == s.rejected == 0
    assert s.requests == len(res.records) == sum(len(x.turns) for x in sessions)  # no session was cut

    once = simulate(sessions, SimConfig(instances=1, admission=dataclasses.replace(opts, retry=RetryPolicy(0))),
                    SLO(ttft_s=30.0))
    assert once.summary.by_tier["free"]["retried"] == 0
    assert once.summary.rejected > 0 and len(once.records) < len(res.records)  # without retries a shed ends a session


@pytest.fixture(scope="module")
def overload() -> dict[str, Any]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import closed_loop as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    spec = bench.OverloadSpec()
    return bench.simulated(spec, spec.sessions(spec.rate_per_s))


def test_no_tier_starves_under_the_benchmarks_overload(overload: dict[str, Any]) -> None:
    closed = overload["closed"]["attainment_by_tier"]
    assert set(closed) == {"gold", "silver", "free"}
    assert closed["free"] > 0.3
    assert closed["gold"] >= 0.95
    assert closed["gold"] > overload["blind"]["attainment_by_tier"]["gold"]
    assert overload["closed"]["refused_by_tier"]["free"] > overload["closed"]["refused_by_tier"]["gold"]
