"""Priority admission: under overload the lowest priority is shed first, slots go to the best waiter."""

from __future__ import annotations

import asyncio

import pytest

from helpers.ops_factory import add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admission import AdmissionConfig, AdmissionSignals, PriorityAdmission
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.tenancy import NodeLimits


async def spin(turns: int = 20) -> None:
    """Let every ready task run (loop turns, no time passes)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def sig(priority: int, budget: float = 1.0, rate: float = 0.0) -> AdmissionSignals:
    return AdmissionSignals(priority, budget, rate)


def test_score_orders_by_priority_then_budget_left_then_consumption():
    adm = PriorityAdmission(AdmissionConfig())
    assert adm.score(sig(2, budget=0.0)) > adm.score(sig(1, budget=1.0))
    assert adm.score(sig(1, budget=0.9)) > adm.score(sig(1, budget=0.1))
    assert adm.score(sig(1, rate=10.0)) > adm.score(sig(1, rate=5000.0))


def test_overload_sheds_low_priority_first_and_grants_by_score():
    async def main():
        adm = PriorityAdmission(AdmissionConfig(max_in_flight=1, max_queue_depth=2, retry_after_s=3))
        running = await adm.enter("m", sig(5))
        order: list[str] = []
        outcomes: dict[str, str] = {}

        async def client(name: str, priority: int):
            try:
                ticket = await adm.enter("m", sig(priority))
            except GatewayError as err:
                outcomes[name] = f"{err.status} {err.code} {err.headers['retry-after']}"
                return
            order.append(name)
            outcomes[name] = "served"
            adm.leave(ticket)

        tasks = [asyncio.create_task(client(n, p)) for n, p in (("low", 1), ("mid", 5), ("high", 9))]
        await spin()
        assert adm.signals("default").queue_depth == 2
        # the queue was full when "high" came: "low" (lowest score) was shed to make room
        assert outcomes == {"low": "503 overloaded 3"}
        late_low = asyncio.create_task(client("late-low", 0))
        await spin()
        assert outcomes["late-low"] == "503 overloaded 3"  # queue full of better requests: shed at once
        adm.leave(running)
        await asyncio.gather(*tasks, late_low)
        assert order == ["high", "mid"]
        assert adm.signals("default").in_flight == 0

    asyncio.run(main())


def test_queue_timeout_sheds_with_503():
    async def main():
        adm = PriorityAdmission(AdmissionConfig(max_in_flight=1, queue_timeout_s=0.01))
        await adm.enter("m", sig(1))
        with pytest.raises(GatewayError) as err:
            await adm.enter("m", sig(1))
        assert err.value.status == 503
        assert adm.signals("default").queue_depth == 0

    asyncio.run(main())


def test_pools_are_separate():
    async def main():
        adm = PriorityAdmission(AdmissionConfig(max_in_flight=1, max_queue_depth=0, pools={"big": ("m70b",)}))
        await adm.enter("m70b", sig(1))
        await adm.enter("m8b", sig(1))  # a different pool ("default") still has room
        with pytest.raises(GatewayError):
            await adm.enter("m70b", sig(9))

    asyncio.run(main())


def test_guard_undoes_every_charge_of_a_shed_request(tmp_path):
    guard = make_guard(tmp_path, admission={"max_in_flight": 1, "max_queue_depth": 0})
    raw_hi, key_hi = add_key(guard, key=NodeLimits(priority=9, budget_usd=1.0, rpm=100), org_name="hi")

    async def main():
        first = await guard.admit(request(raw_hi, "a"))
        with pytest.raises(GatewayError) as err:
            await guard.admit(request(raw_hi, "b", session="s"))
        assert err.value.code == "overloaded"
        charge = (key_hi, period_key("month", guard.clock()))
        assert (await guard.budget_usage([charge]))[charge][1] == pytest.approx(first.reserved_cost_usd)
        await guard.settle(first, SettledUsage(100, 1, 0, 1e-4))
        await guard.admit(request(raw_hi, "b", session="s"))

    asyncio.run(main())
