"""Three replicas' ``OpsGuard`` over ``RedisState`` on one real redis-server and one PostgreSQL ledger: budgets and
limits hold across them, and a Redis outage does what ``ops.shared.on_outage`` says."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from test_pg_ledger import event

from helpers.ops_factory import SECRET, FakeClock, FakeConfig
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.fleet import replica_guard
from tokenomy.gateway.ops.guard import AdmitRequest, SettledUsage
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.stores.pg_ledger import PgLedger
from tokenomy.gateway.stores.redis_store import redis_client
from tokenomy.gateway.stores.servers import PostgresServer, RedisServer
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine

pytestmark = pytest.mark.integration
def request(key: str, rid: str, prompt: int = 100, max_tokens: int = 100) -> AdmitRequest:
    return AdmitRequest(rid, key, "m", prompt, max_tokens)


def fleet(tmp_path: Path, redis_srv: RedisServer, pg_srv: PostgresServer, body: Callable[..., Awaitable[Any]],
          replicas: int = 3, **shared: Any) -> Any:
    """Run ``body(guards, keys, ledger, clock)`` with ``replicas`` replicas' guards sharing one tenant
    database, one Redis (flushed first) and one PostgreSQL ledger."""
    clock = FakeClock()
    store_url = f"sqlite:///{tmp_path / 'tenants.db'}"
    setup = TenantStore(sqlite_engine(store_url), SECRET.encode())
    org = setup.create_node(NodeKind.ORG, "acme", None)
    team = setup.create_node(NodeKind.TEAM, "team", org.id)
    keys = {"budgeted": setup.create_key(team.id, "budgeted", NodeLimits(budget_usd=0.015))[1],
            "free": setup.create_key(team.id, "free", NodeLimits(rpm=1000))[1]}
    cfg = SharedStoresConfig(redis_url=redis_srv.url, postgres_url=pg_srv.url, lease_s=2.0, timeout_s=5.0, **shared)

    async def main() -> Any:
        flush = Redis.from_url(redis_srv.url)
        await flush.flushdb()
        await flush.aclose()
        ledger = await PgLedger(pg_srv.url).start()
        clients = [redis_client(cfg) for _ in range(replicas)]
        guards = [replica_guard(FakeConfig({"server_secret": SECRET}), TenantStore(sqlite_engine(store_url),
                                SECRET.encode()), c, ledger, cfg, clock=clock) for c in clients]
        try:
            for g in guards:
                await g.start()
            return await body(guards, keys, ledger, clock)
        finally:
            for g in guards:
                await g.aclose()
            for c in clients:
                await c.aclose()
            await ledger.aclose()

    return asyncio.run(main())


def test_200_concurrent_requests_over_3_replicas_on_a_50_request_budget(tmp_path: Path, redis_srv: RedisServer,
                                                                         pg_srv: PostgresServer) -> None:
    # each request: 100 prompt tokens at $1/M + 100 output tokens at $2/M = $0.0003 worst case,
    # and it costs that much: a $0.015 budget pays for exactly 50
    async def body(guards: list[OpsGuard], keys: dict[str, str], ledger: PgLedger, clock: FakeClock) -> None:
        tag = secrets.token_hex(3)
        served: list[str] = []

        async def one(i: int) -> None:
            g = guards[i % 3]
            rid = f"{tag}-{i}"
            try:
                adm = await g.admit(request(keys["budgeted"], rid))
            except GatewayError as e:
                assert e.code == "budget_exceeded"
                return
            await asyncio.sleep(0)  # let the other requests race for the budget meanwhile
            await ledger.record(event(rid, adm.key_id, 0.0003))
            await g.settle(adm, SettledUsage(100, 100, 0, 0.0003))
            served.append(rid)

        await asyncio.gather(*(one(i) for i in range(200)))
        assert len(served) == 50
        key_id = guards[0].store.authenticate(keys["budgeted"]).id  # type: ignore[union-attr]
        ledger_sum = (await ledger.spend_by_key(0.0))[key_id]
        charge = guards[0].budgets.plan(guards[0].store.tree.path_nodes(key_id), clock())[0][-1]
        [(spent, reserved)] = await guards[1].state.usage([charge])
        assert round(ledger_sum, 9) == round(spent, 9) == 0.015 and reserved == 0.0

    fleet(tmp_path, redis_srv, pg_srv, body)


def test_an_admission_is_one_step_that_a_refusal_leaves_no_trace_of(tmp_path: Path, redis_srv: RedisServer,
                                                                    pg_srv: PostgresServer) -> None:
    # one script checks the breakers, limits and budget and only then charges them all: a request
    # the budget refuses takes no concurrency slot and no hold, and a request id in flight on one
    # replica is refused on another (it would otherwise be served twice on one hold)
    async def body(guards: list[OpsGuard], keys: dict[str, str], ledger: PgLedger, clock: FakeClock) -> None:
        a, b = guards[0], guards[1]
        key_id = a.store.authenticate(keys["budgeted"]).id  # type: ignore[union-attr]
        adm = await a.admit(request(keys["budgeted"], "one"))
        with pytest.raises(GatewayError) as dup:
            await b.admit(request(keys["budgeted"], "one"))
        assert dup.value.status == 409 and dup.value.code == "duplicate_request_id"
        with pytest.raises(GatewayError) as over:  # $0.0201 worst case > the $0.015 budget
            await b.admit(request(keys["budgeted"], "two", max_tokens=10_000))
        assert over.value.code == "budget_exceeded"
        charge = a.budgets.plan(a.store.tree.path_nodes(key_id), clock())[0][-1]
        assert await b.state.usage([charge]) == [(0.0, adm.reserved_cost_usd)]  # one hold: the first
        await ledger.record(event("one", key_id, 0.0002))
        await a.settle(adm, SettledUsage(100, 50, 0, 0.0002))
        assert await b.state.usage([charge]) == [(0.0002, 0.0)]

    fleet(tmp_path, redis_srv, pg_srv, body, replicas=2)


def test_redis_down_fails_budgeted_keys_closed_and_serves_unbudgeted_locally_then_recovers(
        tmp_path: Path, redis_srv: RedisServer, pg_srv: PostgresServer) -> None:
    async def body(guards: list[OpsGuard], keys: dict[str, str], ledger: PgLedger, clock: FakeClock) -> None:
        g = guards[0]
        tag = secrets.token_hex(3)
        adm = await g.admit(request(keys["budgeted"], f"{tag}-1", max_tokens=6000))  # worst $0.0121
        await ledger.record(event(f"{tag}-1", adm.key_id, 0.012))
        await g.settle(adm, SettledUsage(100, 6000, 0, 0.012))
        redis_srv.kill()
        try:
            with pytest.raises(GatewayError) as e:
                await g.admit(request(keys["budgeted"], f"{tag}-2"))
            assert (e.value.status, e.value.code, e.value.headers["retry-after"]) == (503, "store_unavailable", "2")
            local = await g.admit(request(keys["free"], f"{tag}-3"))  # unbudgeted: this replica's own limits
            await g.settle(local, SettledUsage(100, 100, 0, 0.0003))
        finally:
            redis_srv.start()  # comes back empty
        # spend is rebuilt from the ledger: $0.012 of $0.015 is gone; a $0.0021 request fits,
        # a $0.0121 one does not
        adm = await g.admit(request(keys["budgeted"], f"{tag}-4", max_tokens=1000))
        await g.release(adm, "test")
        with pytest.raises(GatewayError) as e:
            await guards[2].admit(request(keys["budgeted"], f"{tag}-5", max_tokens=6000))
        assert e.value.code == "budget_exceeded"

    fleet(tmp_path, redis_srv, pg_srv, body)


def test_a_dead_replicas_holds_are_reclaimed_within_the_lease(tmp_path: Path, redis_srv: RedisServer,
                                                              pg_srv: PostgresServer) -> None:
    async def body(guards: list[OpsGuard], keys: dict[str, str], ledger: PgLedger, clock: FakeClock) -> None:
        dead, live = guards[0], guards[1]
        tag = secrets.token_hex(3)
        done = await dead.admit(request(keys["free"], f"{tag}-done", max_tokens=10_000))
        await dead.admit(request(keys["free"], f"{tag}-lost", max_tokens=10_000))
        await ledger.record(event(f"{tag}-done", done.key_id, 0.002))  # it completed, then the replica died
        dead.state.mine.clear()  # type: ignore[attr-defined]  # a dead replica renews nothing
        clock.advance(2.5)  # past the 2 s lease
        assert await live.heartbeat() == {"settled": 1, "released": 1}
        key_id = done.key_id
        charge = live.budgets.plan(live.store.tree.path_nodes(key_id), clock())[0][-1]
        assert await live.state.usage([charge]) == [(0.002, 0.0)]

    fleet(tmp_path, redis_srv, pg_srv, body)
