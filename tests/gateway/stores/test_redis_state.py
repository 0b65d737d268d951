"""What only the shared store promises, on a real redis-server with several replicas (separate
clients, one key prefix): limits, budgets and breakers hold across replicas exactly however their
requests race; a dead replica's slots and holds end with their lease; an empty Redis admits nothing
until its spend is rebuilt from the ledger. The rules themselves are the contract's
(``test_guard_state.py``). Simulated times; nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from test_guard_state import T0, admitted, end, path, refused, step

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.breaker import BreakerConfig
from tokenomy.gateway.ops.tenancy import Node, NodeKind, NodeLimits, TenantTree
from tokenomy.gateway.stores.guard_state import Admitted, Finished, StoreUnavailable
from tokenomy.gateway.stores.redis_state import RedisState
from tokenomy.gateway.stores.reservations import Refusal
from tokenomy.gateway.stores.servers import RedisServer
from tokenomy.gateway.stores.shared_config import SharedStoresConfig

pytestmark = pytest.mark.integration
KEY = ("key", "2027-01")


class Ledger:
    """What the ledger recorded: each request's cost, each key's spend this period."""

    def __init__(self, costs: dict[str, float] | None = None, spend: dict[str, float] | None = None) -> None:
        self.costs = costs or {}
        self.spend = spend or {}

    async def cost(self, request_id: str) -> float | None:
        return self.costs.get(request_id)

    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]:
        return {p: dict(self.spend) for p in since_s}, "1:1:"

    def pop_xid(self, request_id: str) -> int | None:
        return None


def one_key_tree() -> TenantTree:
    return TenantTree([Node("org", NodeKind.ORG, "o", None, NodeLimits()),
                       Node("team", NodeKind.TEAM, "t", "org", NodeLimits()),
                       Node("key", NodeKind.KEY, "k", "team", NodeLimits(budget_period="month"))])


def replicas(redis_srv: RedisServer, body: Callable[..., Awaitable[Any]], n: int = 3,
             breaker: BreakerConfig | None = None, ledger: Ledger | None = None, start: bool = True) -> Any:
    """Run ``body(*states)`` with ``n`` RedisStates on their own clients and one fresh key prefix."""
    prefix = f"t{secrets.token_hex(4)}:"
    shared = SharedStoresConfig(redis_url=redis_srv.url, postgres_url="postgresql://unused", lease_s=2.0, token_flush=1)
    cfg = breaker or BreakerConfig(max_turns_per_session=None, repeat_limit=None)

    async def main() -> Any:
        clients = [Redis.from_url(redis_srv.url) for _ in range(n)]
        states = [RedisState(c, shared, cfg, ledger or Ledger(), one_key_tree, prefix=prefix) for c in clients]
        try:
            if start:
                await states[0].start(T0)
            return await body(*states)
        finally:
            for s, c in zip(states, clients, strict=True):
                await s.aclose()
                await c.aclose()

    return asyncio.run(main())


def test_limits_hold_across_replicas_however_requests_race(redis_srv: RedisServer) -> None:
    async def body(*states: RedisState) -> None:
        p = path(max_concurrent=5)

        async def one(i: int) -> bool:
            try:
                await states[i % 3].admit(step(f"r{i}", p))
                return True
            except GatewayError as e:
                assert e.code == "concurrency_limit"
                return False

        assert sum(await asyncio.gather(*(one(i) for i in range(60)))) == 5
        assert (await refused(states[1], step("one-more", p))).code == "concurrency_limit"  # 5 slots held
        rpm = (("team", NodeLimits(rpm=3)),)
        for i, s in enumerate((states[0], states[1], states[2])):  # the team's 3 a minute, over three replicas
            await admitted(s, step(f"m{i}", rpm))
        assert (await refused(states[0], step("m3", rpm))).code == "rate_limit_rpm"
        await admitted(states[1], step("m4", rpm, now=T0 + 20))  # one request refills in 20 s, on any replica

    replicas(redis_srv, body)


def test_a_budget_holds_across_replicas(redis_srv: RedisServer) -> None:
    async def body(*states: RedisState) -> None:
        budgets = {KEY: 0.5}

        async def one(i: int) -> bool:
            return isinstance(await states[i % 3].admit(step(f"r{i}", usd=0.01, budgets=budgets)), Admitted)

        accepted = await asyncio.gather(*(one(i) for i in range(200)))
        assert sum(accepted) == 50
        for i, ok in enumerate(accepted):  # settled on another replica than admitted, at less than the hold
            if ok:
                assert (await states[(i + 1) % 3].finish(end(step(f"r{i}", usd=0.01), 0.004))).hold is not None
        assert [(round(s, 9), round(r, 9)) for s, r in await states[0].usage([KEY])] == [(0.2, 0.0)]

    replicas(redis_srv, body)


def test_a_runaway_agent_is_cut_at_the_same_turn_over_three_replicas_as_through_one(redis_srv: RedisServer) -> None:
    cfg = BreakerConfig(max_turns_per_session=7, repeat_limit=4)

    def cut_at(n: int, fingerprint: Callable[[int], str]) -> tuple[int, str]:
        async def body(*states: RedisState) -> tuple[int, str]:
            for turn in range(1, 50):
                try:
                    await states[turn % n].admit(step(f"t{turn}", session="s1", fingerprint=fingerprint(turn),
                                                      now=T0 + turn))
                except GatewayError as e:
                    return turn, str(e.code)
            raise AssertionError("never cut")

        return replicas(redis_srv, body, n=n, breaker=cfg)  # type: ignore[no-any-return]

    assert cut_at(1, lambda t: f"fp{t}") == cut_at(3, lambda t: f"fp{t}") == (8, "breaker_turn_cap")
    assert cut_at(1, lambda t: "same") == cut_at(3, lambda t: "same") == (4, "breaker_repetition")


def test_racing_turns_of_one_session_never_pass_the_cap_and_trip_once(redis_srv: RedisServer) -> None:
    async def body(*states: RedisState) -> None:
        async def one(i: int) -> bool:
            try:
                await states[i % 3].admit(step(f"r{i}", session="s1", fingerprint=f"fp{i}"))
                return True
            except GatewayError as e:
                assert e.code == "breaker_turn_cap"
                return False

        assert sum(await asyncio.gather(*(one(i) for i in range(30)))) == 5
        e = await refused(states[2], step("late", session="s1", now=T0 + 59.0))  # the cooldown holds everywhere
        assert e.headers["retry-after"] == "1"
        assert sum(len(s.drain_trips()) for s in states) == 1  # one trip, one alert

    replicas(redis_srv, body, breaker=BreakerConfig(max_turns_per_session=5))


def test_a_dead_replicas_slots_and_holds_end_with_their_lease(redis_srv: RedisServer) -> None:
    async def body(dead: RedisState, live: RedisState) -> None:
        p = path(max_concurrent=4)
        budgets = {KEY: 1.0}
        await admitted(dead, step("done", p, usd=0.4, budgets=budgets))  # reached the ledger at $0.1
        await admitted(dead, step("lost", p, usd=0.4, budgets=budgets))  # never completed
        await admitted(live, step("running", p, usd=0.2, budgets=budgets))
        assert isinstance(await live.admit(step("more", p, usd=0.1, budgets=budgets)), Refusal)  # all held
        assert (await live.heartbeat(T0 + 1.5)).reclaimed == {"settled": 0, "released": 0}  # renews "running"
        dead.mine.clear()  # a dead replica renews nothing
        assert (await live.heartbeat(T0 + 2.5)).reclaimed == {"settled": 1, "released": 1}
        assert [(round(s, 9), round(r, 9)) for s, r in await live.usage([KEY])] == [(0.1, 0.2)]
        for i in range(3):  # the dead replica's two slots lapsed; the live one's renewed slot counts
            await admitted(live, step(f"new{i}", p, now=T0 + 2.5))
        assert (await refused(live, step("new3", p, now=T0 + 2.5))).code == "concurrency_limit"
        assert (await dead.heartbeat(T0 + 2.5)).reclaimed == {"settled": 0, "released": 0}  # once only

    replicas(redis_srv, body, n=2, ledger=Ledger({"done": 0.1}))


def test_a_slow_replica_whose_hold_was_reclaimed_still_charges_once(redis_srv: RedisServer) -> None:
    async def body(slow: RedisState, other: RedisState) -> None:
        s = step("r1", usd=0.4, budgets={KEY: 1.0}, session="s")
        await admitted(slow, s)
        slow.mine.clear()  # a pause: no renewal
        assert (await other.heartbeat(T0 + 3.0)).reclaimed == {"settled": 0, "released": 1}
        done = await slow.finish(end(s, 0.25))  # the request did complete after all
        assert done.hold is not None
        assert await slow.finish(end(s, 0.25)) == Finished(None)
        assert await other.usage([KEY]) == [(0.25, 0.0)]
        assert await other.session_spend_usd("key", "s") == pytest.approx(0.25)  # its worst case moved to cost

    replicas(redis_srv, body, n=2)


def test_an_empty_redis_is_seeded_from_the_ledger_before_it_admits(redis_srv: RedisServer) -> None:
    async def body(a: RedisState, b: RedisState) -> None:
        refusal = await b.admit(step("r1", usd=0.1, budgets={KEY: 1.0}))  # seeds, then admits
        assert isinstance(refusal, Refusal) and refusal.spent_usd == 0.95
        assert not await a.seed(T0)  # seeded once per data set

    replicas(redis_srv, body, n=2, ledger=Ledger(spend={"key": 0.95}), start=False)


def test_after_redis_lost_its_data_a_settle_counts_exactly_what_the_rebuilt_spend_missed(
        redis_srv: RedisServer) -> None:
    async def body(a: RedisState) -> None:
        # spend rebuilt from a ledger snapshot that saw transactions < 100 and 100..104 but 102
        assert await a.holds.seed({KEY: 1.0}, "100:105:102")
        charges = (KEY, ("team", "2027-01"))
        assert (await a.holds.settle("seen", 0.1, 99, charges))[0] is None  # counted by the seed
        assert (await a.holds.settle("in-progress", 0.2, 102, charges))[0] is not None
        assert (await a.holds.settle("later", 0.4, 106, charges))[0] is not None
        assert (await a.holds.settle("later", 0.4, 106, charges))[0] is None  # once
        assert (await a.holds.settle("no-xid", 0.8, None, charges))[0] is None  # unknown: never guessed
        assert [round(s, 9) for s, _ in await a.usage([KEY, ("team", "2027-01")])] == [1.6, 0.6]

    replicas(redis_srv, body, n=1, start=False)


def test_a_settle_whose_call_failed_is_retried_by_the_heartbeat_once(redis_srv: RedisServer) -> None:
    async def body(a: RedisState) -> None:
        s = step("r1", usd=0.4, budgets={KEY: 1.0})
        await admitted(a, s)
        finish = a.scripts.finish

        async def down(*args: Any) -> Any:
            raise RedisConnectionError("Redis went away")

        a.scripts.finish = down  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            await a.finish(end(s, 0.25))
        a.scripts.finish = finish  # type: ignore[method-assign]
        upkeep = await a.heartbeat(T0 + 1)
        assert [(done.hold.request_id if done.hold else None, cost) for done, cost in upkeep.settled] == [("r1", 0.25)]
        assert (await a.heartbeat(T0 + 1)).settled == ()
        assert [(round(x, 9), round(y, 9)) for x, y in await a.usage([KEY])] == [(0.25, 0.0)]

    replicas(redis_srv, body, n=1)
