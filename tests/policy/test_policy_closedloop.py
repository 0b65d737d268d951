"""The closed loop's admission policies and tier-aware router on hand-built views."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from policy_fakes import FakeView, make_request

from tokenomy.policy.closedloop import (
    ADMISSION_POLICIES,
    Action,
    ArrivalView,
    ClosedLoopConfig,
    DegradeConfig,
    LoadView,
    QueuedView,
    TenantView,
    make_admission_policy,
)
from tokenomy.policy.router import make_router

FULL = LoadView(in_flight=8, max_in_flight=8, queued=0)
FREE = LoadView(in_flight=0, max_in_flight=8, queued=0)


def arrival(rid: str, tenant: str, tier: str | None = None, *, prompt: int = 100, max_tokens: int = 50,
            **view: float | None) -> ArrivalView:
    return ArrivalView(rid, TenantView(tenant, tier or tenant, **view), prompt, max_tokens)  # type: ignore[arg-type]


def test_registry_builds_both_policies_and_names_them_on_a_typo() -> None:
    assert set(ADMISSION_POLICIES.names()) == {"fifo", "tier_wfq"}
    with pytest.raises(ValueError, match="unknown admission policy 'wfq'.*fifo.*tier_wfq"):
        make_admission_policy("wfq")


def _drain(policy_name: str, arrivals: list[ArrivalView], picks: int) -> list[str]:
    """Queue every arrival at t=0, then admit ``picks`` of them one slot at a time."""
    trace: list[dict[str, object]] = []
    policy = make_admission_policy(policy_name, trace=trace.append)
    queue = [QueuedView.of(policy.arrive(a, FULL, 0.0), 0.0) for a in arrivals]
    order = []
    for _ in range(picks):
        d = policy.pick(queue, LoadView(7, 8, len(queue)), 0.0)
        assert d is not None
        order.append(queue.pop(d.index).tenant)
    assert all(e["reason"] for e in trace) and {e["kind"] for e in trace} == {"closed_loop_admission",
                                                                               "closed_loop_admit"}
    return order


def test_backlogged_tiers_share_slots_by_weight() -> None:
    arrivals = [arrival(f"{t}-{i}", t) for i in range(20) for t in ("free", "silver", "gold")]
    order = _drain("tier_wfq", arrivals, 14)
    assert Counter(order) == {"gold": 8, "silver": 4, "free": 2}  # weights 4 : 2 : 1


def test_blind_fifo_admits_oldest_first_whatever_the_tier() -> None:
    arrivals = [arrival(f"{t}-{i}", t) for i in range(3) for t in ("free", "gold")]
    assert _drain("fifo", arrivals, 6) == ["free", "gold"] * 3


def test_shed_entries_leave_their_tenant_no_debt() -> None:
    policy = make_admission_policy("tier_wfq")
    free = [QueuedView.of(policy.arrive(arrival(f"f{i}", "free"), FULL, 0.0), 0.0) for i in range(10)]
    for e in free:
        d = policy.shed(e, e.deadline_s)
        assert d.action is Action.REFUSE and "deadline" in d.reason
    # after ten shed entries, a free request competes with a gold one from the same virtual time
    queue = [QueuedView.of(policy.arrive(arrival("f", "free"), FULL, 2.0), 2.0),
             QueuedView.of(policy.arrive(arrival("g", "gold"), FULL, 2.0), 2.0)]
    first = policy.pick(queue, LoadView(7, 8, 2), 2.0)
    assert first is not None and first.tenant == "free"  # equal start tags: the older entry


def test_a_tenant_running_out_of_budget_is_slowed_before_it_is_refused() -> None:
    policy = make_admission_policy("tier_wfq")
    steps = []
    for left in (0.5, 0.15, 0.05, 0.01, 0.0):
        d = policy.arrive(arrival(f"r{left}", "gold", budget_left_fraction=left, request_budget_fraction=0.005),
                          FREE, 10.0)
        steps.append((d.action, round(d.eligible_s - 10.0, 3), d.weight))
    assert steps[0] == (Action.QUEUE, 0.0, 4.0)  # plenty left: no pacing
    paced = steps[1:4]
    assert all(a is Action.QUEUE for a, _, _ in paced)
    assert [p for _, p, _ in paced] == sorted(p for _, p, _ in paced) and paced[0][1] > 0  # slower as it runs out
    assert paced[-1][2] < paced[0][2] < 4.0  # and its share of slots shrinks
    assert steps[4][0] is Action.REFUSE  # cut only when nothing is left


def test_a_request_the_budget_cannot_pay_for_is_refused_with_its_reason() -> None:
    d = make_admission_policy("tier_wfq").arrive(
        arrival("big", "gold", budget_left_fraction=0.1, request_budget_fraction=0.2), FREE, 0.0)
    assert d.action is Action.REFUSE and "budget exhausted" in d.reason


def test_a_tenant_over_its_rate_limit_is_paced() -> None:
    policy = make_admission_policy("tier_wfq", ClosedLoopConfig(rate_window_s=60.0))
    within = policy.arrive(arrival("a", "free", tokens_per_s=90.0, rate_limit_tokens_per_s=100.0), FREE, 0.0)
    over = policy.arrive(arrival("b", "free", tokens_per_s=150.0, rate_limit_tokens_per_s=100.0), FREE, 0.0)
    assert within.eligible_s == 0.0
    assert over.eligible_s == pytest.approx(30.0)  # 50 tokens/s too many over a 60 s window, at 100/s
    assert "rate limit" in over.reason and over.deadline_s == pytest.approx(31.0)  # still deferred, not refused


def test_degradation_caps_and_holds_only_lower_tiers_under_load() -> None:
    cfg = ClosedLoopConfig(degrade=DegradeConfig(load_fraction=0.5, max_tokens_cap=64, long_prompt_tokens=1000))
    policy = make_admission_policy("tier_wfq", cfg)
    loaded = LoadView(in_flight=6, max_in_flight=8, queued=0)
    gold = policy.arrive(arrival("g", "gold", prompt=5000, max_tokens=500), loaded, 0.0)
    free = policy.arrive(arrival("f", "free", prompt=5000, max_tokens=500), loaded, 0.0)
    idle = policy.arrive(arrival("i", "free", prompt=5000, max_tokens=500), FREE, 0.0)
    assert (gold.max_tokens, gold.hold_under_load) == (500, False)
    assert (free.max_tokens, free.hold_under_load) == (64, True) and "degraded" in free.reason
    assert (idle.max_tokens, idle.hold_under_load) == (500, False)
    queue = [QueuedView.of(free, 0.0)]
    assert policy.pick(queue, loaded, 0.1) is None  # held while loaded
    assert policy.pick(queue, LoadView(2, 8, 1), 0.1) is not None


def test_tier_aware_router_biases_only_under_load() -> None:
    router = make_router("tier_aware", base="least_loaded", busy_waiting_tokens=100, reserve_fraction=0.34)
    calm = [FakeView("a", num_waiting_tokens=0), FakeView("b", num_waiting_tokens=50), FakeView("c", num_waiting_tokens=60)]
    busy = [FakeView("a", num_waiting_tokens=300, cached_tokens=0), FakeView("b", num_waiting_tokens=800, cached_tokens=4000),
            FakeView("c", num_waiting_tokens=500)]
    gold, free = make_request(prompt_tokens=4000), make_request(prompt_tokens=4000)
    gold.tier, free.tier = "gold", "free"
    assert router.choose(free, calm, 0.0) == "a"  # not loaded: the base router for everyone
    assert router.choose(gold, busy, 0.0) == "b"  # its prefix is cached on b
    assert router.choose(free, busy, 0.0) == "c"  # a, the least loaded, is kept for the top tier


def test_a_retry_waits_behind_its_tenants_first_attempts_but_keeps_the_tenants_share() -> None:
    trace: list[dict[str, object]] = []
    policy = make_admission_policy("tier_wfq", trace=trace.append)
    retry = dataclasses.replace(arrival("f-old", "free"), retries=1)
    queue = [QueuedView.of(policy.arrive(retry, FULL, 0.0), 0.0),  # older, but its TTFT is already lost
             QueuedView.of(policy.arrive(arrival("f-new", "free"), FULL, 0.5), 0.5),
             QueuedView.of(policy.arrive(arrival("g", "gold"), FULL, 0.6), 0.6)]
    assert queue[0].retry_last and "retry 1" in str(trace[0]["reason"])
    order = []
    for t in (1.0, 1.1, 1.2):
        d = policy.pick(queue, LoadView(7, 8, len(queue)), t)
        assert d is not None
        order.append(queue.pop(d.index).request_id)
    # equal start tags across tenants: the older head (free's first attempt) first, then gold,
    # and the retry once no first attempt of its tenant waits: deferred, never refused for it
    assert order == ["f-new", "g", "f-old"]


def test_without_retries_last_a_tenants_queue_is_oldest_first() -> None:
    policy = make_admission_policy("tier_wfq", ClosedLoopConfig(retries_last=False))
    queue = [QueuedView.of(policy.arrive(dataclasses.replace(arrival("old", "free"), retries=2), FULL, 0.0), 0.0),
             QueuedView.of(policy.arrive(arrival("new", "free"), FULL, 0.5), 0.5)]
    assert not queue[0].retry_last
    d = policy.pick(queue, LoadView(7, 8, 2), 1.0)
    assert d is not None and d.request_id == "old"


def test_the_blind_baseline_ignores_retries() -> None:
    policy = make_admission_policy("fifo")
    queue = [QueuedView.of(policy.arrive(dataclasses.replace(arrival("old", "free"), retries=1), FULL, 0.0), 0.0),
             QueuedView.of(policy.arrive(arrival("new", "free"), FULL, 0.5), 0.5)]
    d = policy.pick(queue, LoadView(7, 8, 2), 1.0)
    assert d is not None and d.request_id == "old"
