"""The gateway's admission step applies the closed-loop policy: tiers from key priorities, weighted
fair slots, deferral before shedding, degradation as an output cap, the tier handed to routing."""

from __future__ import annotations

import asyncio

import pytest

from helpers.ops_factory import add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.closed_loop_settings import ClosedLoopSettings, closed_loop_config
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.tenancy import NodeLimits


async def spin(turns: int = 30) -> None:
    """Let every ready task run (loop turns, no time passes)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def closed_guard(tmp_path, **closed_loop):  # type: ignore[no-untyped-def]
    closed_loop.setdefault("tiers", [{"name": "gold", "min_priority": 20}, {"name": "free", "min_priority": 0}])
    return make_guard(tmp_path, admission={"max_in_flight": 1, "closed_loop": closed_loop})


def test_a_freed_slot_goes_to_the_top_tier_and_the_tier_reaches_the_admission(tmp_path) -> None:  # type: ignore[no-untyped-def]
    guard = closed_guard(tmp_path)
    gold, _ = add_key(guard, org=NodeLimits(priority=20), org_name="gold-org")
    free, _ = add_key(guard, org=NodeLimits(priority=0), org_name="free-org")

    async def main() -> list[str]:
        first = await guard.admit(request(free, "f0"))
        assert first.tier == "free"
        order: list[str] = []

        async def client(key: str, rid: str) -> None:
            adm = await guard.admit(request(key, rid))
            order.append(f"{rid}:{adm.tier}")
            await guard.settle(adm, SettledUsage(100, 10, 0, 0.0))

        tasks = [asyncio.create_task(client(free, "f1")), asyncio.create_task(client(gold, "g1"))]
        await spin()
        assert guard.closed is not None and guard.closed.queue_depth("default") == 2
        await guard.settle(first, SettledUsage(100, 10, 0, 0.0))
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == ["g1:gold", "f1:free"]  # the later gold request was admitted first
    text = guard.metrics.registry.get_sample_value("tokenomy_gateway_admission_deferred_total", {"tier": "gold"})
    assert text == 1.0


def test_a_freed_slot_goes_to_a_first_attempt_before_an_older_retry_of_the_same_tier(tmp_path) -> None:  # type: ignore[no-untyped-def]
    guard = closed_guard(tmp_path)
    free, _ = add_key(guard, org=NodeLimits(priority=0), org_name="free-org")

    async def main() -> list[str]:
        first = await guard.admit(request(free, "f0"))
        order: list[str] = []

        async def client(rid: str, retries: int) -> None:
            adm = await guard.admit(request(free, rid, retries=retries))
            order.append(rid)
            await guard.settle(adm, SettledUsage(100, 10, 0, 0.0))

        retry = asyncio.create_task(client("sent-again", 1))  # queued first: the SDK's second attempt
        await spin()
        fresh = asyncio.create_task(client("first-try", 0))
        await spin()
        await guard.settle(first, SettledUsage(100, 10, 0, 0.0))
        await asyncio.gather(retry, fresh)
        return order

    assert asyncio.run(main()) == ["first-try", "sent-again"]
    assert closed_loop_config(ClosedLoopSettings(retries_last=False)).retries_last is False  # and it can be turned off


def test_a_request_whose_tier_may_not_wait_is_shed_with_503_after_being_queued(tmp_path) -> None:  # type: ignore[no-untyped-def]
    guard = closed_guard(tmp_path, tiers=[{"name": "gold", "min_priority": 20},
                                          {"name": "free", "min_priority": 0, "max_defer_s": 0.0}])
    free, _ = add_key(guard, org=NodeLimits(priority=0))

    async def main() -> GatewayError:
        await guard.admit(request(free, "a"))
        with pytest.raises(GatewayError) as err:
            await guard.admit(request(free, "b"))
        return err.value

    err = asyncio.run(main())
    assert (err.status, err.code, err.headers["retry-after"]) == (503, "overloaded", "1")
    assert "free tier" in str(err.message)
    assert guard.metrics.registry.get_sample_value("tokenomy_gateway_admission_refused_total", {"tier": "free"}) == 1.0
    assert guard.closed is not None and guard.closed.queue_depth("default") == 0  # nothing left behind


def test_degradation_caps_the_output_of_a_lower_tier_under_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    guard = make_guard(tmp_path, admission={"max_in_flight": 4, "closed_loop": {
        "tiers": [{"name": "gold", "min_priority": 20}, {"name": "free", "min_priority": 0}],
        "degrade": {"load_fraction": 0.5, "max_tokens_cap": 32}}})
    gold, _ = add_key(guard, org=NodeLimits(priority=20), org_name="g")
    free, _ = add_key(guard, org=NodeLimits(priority=0), org_name="f")

    async def main() -> tuple[int | None, int | None, int | None]:
        calm = await guard.admit(request(free, "f0", max_tokens=100))
        await guard.admit(request(gold, "g0"))
        loaded_gold = await guard.admit(request(gold, "g1", max_tokens=100))
        loaded_free = await guard.admit(request(free, "f1", max_tokens=100))
        return calm.output_token_cap, loaded_gold.output_token_cap, loaded_free.output_token_cap

    assert asyncio.run(main()) == (None, None, 32)


def test_an_unknown_policy_is_refused_with_the_known_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown admission policy 'wfq'.*tier_wfq"):
        make_guard(tmp_path, admission={"max_in_flight": 2, "closed_loop": {"policy": "wfq"}})
    with pytest.raises(ValueError, match="needs ops.admission.max_in_flight"):
        make_guard(tmp_path, admission={"closed_loop": {"policy": "fifo"}})


def test_a_budget_refusal_tells_the_client_not_to_retry() -> None:
    from tokenomy.gateway.ops.closed_loop import ClosedLoopPools
    from tokenomy.policy.closedloop import ClosedLoopConfig

    pools = ClosedLoopPools("tier_wfq", ClosedLoopConfig(), max_in_flight=2, pool_of={}, tier_min_priority={"free": 0})

    async def main() -> GatewayError:
        with pytest.raises(GatewayError) as err:
            await pools.enter("m", request_id="r", tenant="t", priority=0, tokens_per_s=0.0,
                              budget_left_fraction=0.0, prompt_tokens=10, max_tokens=10)
        return err.value

    err = asyncio.run(main())
    assert (err.status, err.code, err.headers) == (429, "budget_exceeded", {"x-should-retry": "false"})
