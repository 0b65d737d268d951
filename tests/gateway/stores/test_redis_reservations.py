"""Budget holds in a real redis-server shared by several "replicas" (separate clients): spend never
passes a budget however requests interleave, settle/release count once, a dead replica's holds
are reclaimed after their lease, and an empty (restarted) Redis admits nothing until seeded.
Times are simulated; nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from tokenomy.gateway.stores.redis_reservations import RedisReservations, Unseeded
from tokenomy.gateway.stores.reservations import Hold
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration
T0 = 1_800_000_000.0
KEY, TEAM = ("key", "2027-01"), ("team", "2027-01")


def run_with(redis_srv: RedisServer, body: Callable[..., Awaitable[Any]], replicas: int = 1,
             seed: bool = True) -> Any:
    prefix = f"t{secrets.token_hex(4)}:"

    async def main() -> Any:
        clients = [Redis.from_url(redis_srv.url) for _ in range(replicas)]
        stores = [RedisReservations(c, lease_s=2.0, prefix=prefix) for c in clients]
        try:
            if seed:
                assert await stores[0].seed({}, "test")
            return await body(*stores)
        finally:
            for c in clients:
                await c.aclose()

    return asyncio.run(main())


def hold(rid: str, usd: float, charges: tuple[tuple[str, str], ...] = (KEY, TEAM)) -> Hold:
    return Hold(rid, charges, usd, 0.0)


def test_200_concurrent_holds_over_3_replicas_fit_a_50_request_budget_exactly(redis_srv: RedisServer) -> None:
    async def body(*replicas: RedisReservations) -> None:
        budgets = {KEY: 0.5}  # 50 requests of $0.01

        async def one(i: int) -> bool:
            return await replicas[i % 3].reserve(hold(f"r{i}", 0.01), budgets, T0) is None

        accepted = await asyncio.gather(*(one(i) for i in range(200)))
        assert sum(accepted) == 50
        spent, reserved = await replicas[1].usage(KEY)
        assert (spent, round(reserved, 9)) == (0.0, 0.5)
        assert len(await replicas[2].holds()) == 50
        # the team, without a budget, is counted but never refused
        assert round((await replicas[0].usage(TEAM))[1], 9) == 0.5
        # settling at a lower actual cost frees room for more
        for i, ok in enumerate(accepted):
            if ok:
                assert await replicas[(i + 1) % 3].settle(f"r{i}", 0.004) is not None
        spent, reserved = await replicas[0].usage(KEY)
        assert (round(spent, 9), round(reserved, 9)) == (0.2, 0.0)

    run_with(redis_srv, body, replicas=3)


def test_a_refusal_charges_no_node_and_settle_release_count_once(redis_srv: RedisServer) -> None:
    async def body(a: RedisReservations, b: RedisReservations) -> None:
        refusal = await a.reserve(hold("big", 2.0), {KEY: 5.0, TEAM: 1.0}, T0)
        assert refusal is not None and refusal.charge == TEAM and refusal.budget_usd == 1.0
        assert await a.usage(KEY) == (0.0, 0.0)  # the key's budget had room but was not charged
        assert await a.reserve(hold("r1", 0.5), {KEY: 5.0, TEAM: 1.0}, T0) is None
        assert await b.reserve(hold("r1", 0.5), {KEY: 5.0, TEAM: 1.0}, T0) is None  # same id: no second charge
        assert await a.usage(TEAM) == (0.0, 0.5)
        settled = await b.settle("r1", 0.3)
        assert settled is not None and settled.charges == (KEY, TEAM) and settled.amount_usd == 0.5
        assert await a.settle("r1", 0.3) is None  # a retry on another replica charges nothing
        assert await a.release("r1") is None
        assert await a.usage(TEAM) == (0.3, 0.0)
        assert await a.reserve(hold("r2", 0.5), {TEAM: 1.0}, T0) is None
        assert await b.release("r2") is not None
        assert await a.release("r2") is None
        assert await b.usage(TEAM) == (0.3, 0.0)

    run_with(redis_srv, body, replicas=2)


def test_a_dead_replicas_holds_are_reclaimed_after_their_lease(redis_srv: RedisServer) -> None:
    async def body(dead: RedisReservations, live: RedisReservations) -> None:
        budgets = {KEY: 1.0}
        assert await dead.reserve(hold("done", 0.4), budgets, T0) is None  # reached the ledger at $0.1
        assert await dead.reserve(hold("lost", 0.4), budgets, T0) is None  # never completed
        assert await live.reserve(hold("running", 0.2), budgets, T0) is None
        assert await live.reserve(hold("more", 0.1), budgets, T0) is not None  # budget fully held
        ledger = {"done": 0.1}

        async def cost(rid: str) -> float | None:
            return ledger.get(rid)

        assert await live.reclaim(T0 + 1.5, cost) == {"settled": 0, "released": 0}  # within the lease
        await live.renew(["running"], T0 + 1.5)  # the live replica's heartbeat
        assert await live.reclaim(T0 + 2.5, cost) == {"settled": 1, "released": 1}
        spent, reserved = await live.usage(KEY)
        assert (round(spent, 9), round(reserved, 9)) == (0.1, 0.2)  # only the live hold is left
        assert [h.request_id for h in await live.holds()] == ["running"]
        assert await dead.reclaim(T0 + 2.5, cost) == {"settled": 0, "released": 0}  # once only

    run_with(redis_srv, body, replicas=2)


def test_a_slow_replica_whose_hold_was_reclaimed_still_charges_once(redis_srv: RedisServer) -> None:
    async def body(slow: RedisReservations, other: RedisReservations) -> None:
        assert await slow.reserve(hold("r1", 0.4), {KEY: 1.0}, T0) is None

        async def not_in_ledger(rid: str) -> float | None:
            return None

        assert await other.reclaim(T0 + 3.0, not_in_ledger) == {"settled": 0, "released": 1}
        assert await slow.settle("r1", 0.25) is not None  # the request did complete after all
        assert await slow.settle("r1", 0.25) is None
        assert await other.usage(KEY) == (0.25, 0.0)

    run_with(redis_srv, body, replicas=2)


def test_an_unseeded_redis_admits_nothing_until_seeded_once(redis_srv: RedisServer) -> None:
    async def body(a: RedisReservations, b: RedisReservations) -> None:
        with pytest.raises(Unseeded):
            await a.reserve(hold("r1", 0.1), {KEY: 1.0}, T0)
        assert await a.seed({KEY: 0.95}, "1:1:")  # spend from the ledger
        assert not await b.seed({KEY: 0.0}, "2:2:")  # a second seed changes nothing
        refusal = await b.reserve(hold("r1", 0.1), {KEY: 1.0}, T0)
        assert refusal is not None and refusal.spent_usd == 0.95

    run_with(redis_srv, body, replicas=2, seed=False)


def test_after_redis_lost_its_data_a_settle_counts_exactly_what_the_rebuilt_spend_missed(redis_srv: RedisServer) -> None:
    async def body(a: RedisReservations) -> None:
        # spend rebuilt from a ledger snapshot that saw transactions < 100 and 100..104 but 102
        assert await a.seed({KEY: 1.0}, "100:105:102")
        charges = (KEY, TEAM)
        assert await a.settle("seen", 0.1, ledger_xid=99, charges=charges) is None  # counted by the seed
        assert await a.settle("in-progress", 0.2, ledger_xid=102, charges=charges) is not None
        assert await a.settle("later", 0.4, ledger_xid=106, charges=charges) is not None
        assert await a.settle("later", 0.4, ledger_xid=106, charges=charges) is None  # once
        assert await a.settle("no-xid", 0.8, charges=charges) is None  # unknown: never guessed
        spent, _ = await a.usage(KEY)
        assert round(spent, 9) == 1.6
        assert round((await a.usage(TEAM))[0], 9) == 0.6

    run_with(redis_srv, body, seed=False)
