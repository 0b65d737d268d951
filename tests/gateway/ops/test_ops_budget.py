"""Budgets: atomic worst-case reservations, settle/release, the 200-request race, crash recovery."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from helpers.ops_factory import FakeClock, add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.tenancy import BudgetTier, NodeLimits
from tokenomy.gateway.stores.reservations import Hold
from tokenomy.gateway.stores.reservations_sql import SqlReservations
from tokenomy.gateway.stores.tenancy_sql import sqlite_engine

# prompt 100 at $1/M + max_tokens 100 at $2/M
WORST_USD = 100e-6 + 200e-6


def usage(output_tokens: int, prompt: int = 100) -> SettledUsage:
    return SettledUsage(prompt, output_tokens, 0, (prompt * 1.0 + output_tokens * 2.0) / 1e6)


def spent(guard, node_id: str) -> tuple[float, float]:
    charge = (node_id, period_key("month", guard.clock()))
    return asyncio.run(guard.budget_usage([charge]))[charge]


@pytest.mark.parametrize("reservations", ["memory", "sql"])
def test_budget_race_200_concurrent_requests_never_overspend(tmp_path, reservations):
    """200 tasks on a key whose budget fits ~50 worst cases: spend <= budget, every request served or
    refused with budget_exceeded, and the recorded spend equals the sum of settled usage."""
    budget = 50 * WORST_USD
    guard = make_guard(tmp_path, reservations=reservations)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=budget))
    rng = random.Random(7)
    outputs = [rng.randint(1, 100) for _ in range(200)]
    served: list[float] = []
    refused: list[str] = []

    async def one(i: int) -> None:
        try:
            adm = await guard.admit(request(raw, f"r{i}"))
        except GatewayError as err:
            refused.append(err.code or "")
            return
        for _ in range(rng.randint(0, 5)):  # the backend answers after a few loop turns
            await asyncio.sleep(0)
        u = usage(outputs[i])
        served.append(u.cost_usd)
        await guard.settle(adm, u)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(main())
    assert len(served) + len(refused) == 200
    assert set(refused) == {"budget_exceeded"}
    assert 50 <= len(served) < 200
    total, held = spent(guard, key_id)
    assert sum(served) <= budget + 1e-12
    assert total == pytest.approx(sum(served), abs=1e-12)
    assert held == pytest.approx(0.0, abs=1e-12)


def test_team_budget_caps_the_sum_of_its_keys(tmp_path):
    guard = make_guard(tmp_path)
    raw_a, key_a = add_key(guard, team=NodeLimits(budget_usd=3 * WORST_USD))
    team = guard.store.tree.get(key_a).parent_id
    _, raw_b = guard.store.create_key(team, "b")
    admitted = []
    for i, raw in enumerate([raw_a, raw_b, raw_a, raw_b]):
        try:
            admitted.append(asyncio.run(guard.admit(request(raw, f"r{i}"))))
        except GatewayError as err:
            assert err.code == "budget_exceeded" and err.headers["retry-after"] == "1"
    assert len(admitted) == 3


def test_settle_charges_actual_cost_release_returns_the_hold_both_idempotent(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=1.0))
    a = asyncio.run(guard.admit(request(raw, "a")))
    b = asyncio.run(guard.admit(request(raw, "b")))
    assert spent(guard, key_id) == pytest.approx((0.0, 2 * WORST_USD))
    for _ in range(2):
        asyncio.run(guard.settle(a, usage(10)))
        asyncio.run(guard.release(b, "upstream failed"))
    asyncio.run(guard.release(a, "late"))  # settled already: nothing to release
    assert spent(guard, key_id) == pytest.approx((120e-6, 0.0))


def test_refusal_for_spent_budget_says_when_to_retry(tmp_path):
    guard = make_guard(tmp_path)
    raw, _ = add_key(guard, key=NodeLimits(budget_usd=WORST_USD, budget_period="day"))
    asyncio.run(guard.settle(asyncio.run(guard.admit(request(raw, "a"))), usage(100)))
    with pytest.raises(GatewayError) as err:
        asyncio.run(guard.admit(request(raw, "b")))
    e = err.value
    assert (e.status, e.type, e.code) == (429, "insufficient_quota", "budget_exceeded")
    assert e.headers["x-should-retry"] == "false" and 0 < int(e.headers["retry-after"]) <= 86400


def test_a_new_period_starts_from_zero(tmp_path):
    clock = FakeClock()
    guard = make_guard(tmp_path, clock)
    raw, _ = add_key(guard, key=NodeLimits(budget_usd=WORST_USD, budget_period="day"))
    asyncio.run(guard.settle(asyncio.run(guard.admit(request(raw, "a"))), usage(100)))
    clock.advance(86400.0)
    asyncio.run(guard.admit(request(raw, "b")))


def test_threshold_alerts_fire_once_at_50_80_100_percent(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=10 * WORST_USD))
    for i in range(12):
        with contextlib.suppress(GatewayError):
            asyncio.run(guard.settle(asyncio.run(guard.admit(request(raw, f"r{i}"))), usage(100)))
    got = [(a.subject, a.data["threshold"]) for a in guard.alerter.recent if a.kind == "budget_threshold"]
    assert got == [(key_id, 0.5), (key_id, 0.8), (key_id, 1.0)]


def test_budget_tiers_lower_priority_as_spend_grows(tmp_path):
    guard = make_guard(tmp_path)
    tiers = (BudgetTier(at_fraction=0.5, priority=2),)
    raw, _ = add_key(guard, key=NodeLimits(budget_usd=4 * WORST_USD, priority=9, budget_tiers=tiers))
    first = asyncio.run(guard.admit(request(raw, "a")))
    assert first.priority == 9
    asyncio.run(guard.settle(first, usage(100)))
    asyncio.run(guard.settle(asyncio.run(guard.admit(request(raw, "b"))), usage(100)))
    assert asyncio.run(guard.admit(request(raw, "c"))).priority == 2


def test_holds_of_a_crashed_process_are_settled_from_the_ledger_or_released(tmp_path):
    """No reservation is left held after a restart: the new process reconciles the old holds."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    crashed = SqlReservations(sqlite_engine(url), owner="old")
    charges = (("key_1", "2026-11"),)
    budgets = {charges[0]: 1.0}
    assert crashed.reserve(Hold("done", charges, 0.3, 1e12), budgets) is None
    assert crashed.reserve(Hold("lost", charges, 0.3, 1e12), budgets) is None
    assert crashed.usage(charges[0]) == pytest.approx((0.0, 0.6))
    # ... SIGKILL: the process is gone; its holds stay in the file. A new process starts:
    fresh = SqlReservations(sqlite_engine(url), owner="new")
    ledger = {"done": 0.1}
    assert fresh.reconcile(0.0, ledger.get) == {"settled": 1, "released": 1}
    assert fresh.holds() == []
    assert fresh.usage(charges[0]) == pytest.approx((0.1, 0.0))


def test_build_guard_reconciles_at_start_up(tmp_path):
    guard = make_guard(tmp_path)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=1.0))
    asyncio.run(guard.admit(request(raw, "held")))
    assert spent(guard, key_id)[1] > 0
    restarted = make_guard(tmp_path)  # same database, a new owner: the old hold is orphaned
    assert restarted.state.reservations.holds() == []
    assert spent(restarted, key_id) == (0.0, 0.0)


def test_expired_holds_are_reclaimed(tmp_path):
    store = SqlReservations(sqlite_engine(f"sqlite:///{tmp_path / 'x.db'}"))
    store.reserve(Hold("r", (("k", "p"),), 0.5, expires_at_s=100.0), {})
    assert store.reconcile(99.0, lambda _r: None) == {"settled": 0, "released": 0}
    assert store.reconcile(100.0, lambda _r: None) == {"settled": 0, "released": 1}


def test_prompt_reserve_factor_scales_the_prompt_part_of_the_hold(tmp_path):
    guard = make_guard(tmp_path, prompt_reserve_factor=4.0)
    raw, _ = add_key(guard)
    adm = asyncio.run(guard.admit(request(raw, "r", prompt=100, max_tokens=100)))
    assert adm.reserved_cost_usd == pytest.approx((400 * 1.0 + 100 * 2.0) / 1e6)


def test_a_request_never_settled_is_released_after_the_hold_ttl(tmp_path):
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, hold_ttl_s=600)
    raw, key_id = add_key(guard, key=NodeLimits(budget_usd=WORST_USD, max_concurrent=1))
    asyncio.run(guard.admit(request(raw, "leaked")))  # the request path loses it
    clock.advance(599.0)
    with pytest.raises(GatewayError):
        asyncio.run(guard.admit(request(raw, "b")))
    clock.advance(60.0)  # past the TTL, and the once-a-minute sweep is due
    asyncio.run(guard.admit(request(raw, "b")))  # the sweep returned the budget and the slot
    assert spent(guard, key_id) == pytest.approx((0.0, WORST_USD))


def test_a_bad_ops_section_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^ops\.breaker\.repeat_limit: "):
        make_guard(tmp_path, breaker={"repeat_limit": 0})


def test_two_processes_reserving_against_one_budget_never_overspend(tmp_path):
    """Two stores on one SQLite file (as two gateway processes would be), racing from two threads."""
    import threading

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    stores = [SqlReservations(sqlite_engine(url), owner=f"p{i}") for i in range(2)]
    charge = ("key_x", "2026-11")
    granted: list[int] = [0, 0]

    def worker(i: int) -> None:
        for j in range(60):
            if stores[i].reserve(Hold(f"p{i}-{j}", (charge,), 1.0, 1e12), {charge: 50.0}) is None:
                granted[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(granted) == 50
    assert stores[0]._read(charge) == (0.0, 50.0)


def _event(rid: str, key_id: str, cost: float, ts_s: float):
    from tokenomy.gateway.metering.ledger import UsageEvent

    return UsageEvent(request_id=rid, ts_s=ts_s, tenant_path="", key_id=key_id, model="m", backend="b",
                      endpoint="chat", stream=False, status=200, outcome="ok", session_id="", turn=0,
                      prompt_tokens=1, input_tokens=1, incremental_prefill_tokens=0, history_tokens=0,
                      output_tokens=1, cached_tokens=0, recomputed_tokens=1, cost_recomputed_usd=cost,
                      cost_cached_usd=0.0, cost_output_usd=0.0, cost_usd=cost, cache_savings_usd=0.0,
                      ttft_s=None, tpot_s=None, e2e_s=0.1)


def test_memory_store_rebuilds_spend_from_the_ledger_at_start_up(tmp_path):
    """In-process reservations after a restart: spend is what the ledger holds, nothing is held."""
    from tokenomy.gateway.stores.ledger_sql import SqlLedger

    clock = FakeClock()
    guard = make_guard(tmp_path, clock, reservations="memory")
    raw, key_id = add_key(guard, team=NodeLimits(budget_usd=1.0),
                          key=NodeLimits(budget_usd=3 * WORST_USD, budget_period="day"))
    ledger = SqlLedger(f"sqlite:///{tmp_path / 'ops.db'}")
    try:
        ledger.record_sync([_event("old", key_id, 5.0, clock.t - 40 * 86400),  # another month
                            _event("yesterday", key_id, 1e-4, clock.t - 86400),
                            _event("today", key_id, 2e-4, clock.t - 60)])
    finally:
        ledger.close()
    restarted = make_guard(tmp_path, clock, reservations="memory")
    team_id = restarted.store.tree.get(key_id).parent_id
    store = restarted.state.reservations
    assert store.usage((key_id, period_key("day", clock.t))) == pytest.approx((2e-4, 0.0))
    assert store.usage((team_id, period_key("month", clock.t))) == pytest.approx((3e-4, 0.0))
    asyncio.run(restarted.admit(request(raw, "a")))  # today 2e-4, + 3e-4 held
    asyncio.run(restarted.admit(request(raw, "b")))  # 8e-4 of the key's 9e-4 a day
    with pytest.raises(GatewayError):
        asyncio.run(restarted.admit(request(raw, "c")))
