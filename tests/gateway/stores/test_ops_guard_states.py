"""One Guard, two states: the same ``OpsGuard`` scenarios over the embedded ``LocalState`` and a
fleet's ``RedisState`` (a real redis-server) give the same answers: refusals, output caps, alerts,
and a shed request's charges returned (its RPM aside: it was a request)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from test_guard_state import NoLedger

from helpers.ops_factory import SECRET, FakeClock, FakeConfig, add_key, make_guard
from helpers.ops_factory import request as admit_request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.fleet import replica_guard
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine

STATES = ["local", "redis"]
WORST_USD = 100e-6 + 200e-6  # prompt 100 at $1/M + max_tokens 100 at $2/M


def run(kind: str, req: pytest.FixtureRequest, tmp_path: Path, body: Callable[[OpsGuard], Awaitable[Any]],
        **ops: Any) -> Any:
    """``body(guard)`` with an ``OpsGuard`` over ``kind``'s state, tenants in SQLite, a fake clock."""
    async def main() -> Any:
        if kind == "local":
            return await body(make_guard(tmp_path, FakeClock(), **ops))
        url = req.getfixturevalue("redis_srv").url
        client = Redis.from_url(url)
        shared = SharedStoresConfig(redis_url=url, postgres_url="postgresql://unused", token_flush=1)
        store = TenantStore(sqlite_engine(f"sqlite:///{tmp_path / 'ops.db'}"), SECRET.encode())
        guard = replica_guard(FakeConfig({"server_secret": SECRET, **ops}), store, client, NoLedger(), shared,
                              clock=FakeClock(), prefix=f"t{secrets.token_hex(4)}:")
        try:
            return await body(await guard.start())
        finally:
            await guard.aclose()
            await client.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("kind", STATES)
def test_a_session_budget_caps_the_output_cuts_the_stream_and_refuses_the_next_turn(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # $1/M input, $2/M output: prompt 100 = $0.0001; a $0.0011 session budget leaves 500 output tokens
    async def body(guard: OpsGuard) -> None:
        raw, _ = add_key(guard)
        adm = await guard.admit(admit_request(raw, "r1", session="s", prompt=100, max_tokens=4000))
        assert adm.output_token_cap == 500
        n = 0
        while guard.on_tokens(adm, 1):
            n += 1
        assert n == 500
        await guard.settle(adm, SettledUsage(100, 500, 0, 0.0011))
        with pytest.raises(GatewayError) as err:
            await guard.admit(admit_request(raw, "r2", session="s"))
        assert err.value.code == "breaker_session_budget"

    run(kind, request, tmp_path, body, breaker={"session_budget_usd": 0.0011})


@pytest.mark.parametrize("kind", STATES)
def test_budget_alerts_fire_once_per_threshold_and_the_refusal_once(kind: str, request: pytest.FixtureRequest,
                                                                    tmp_path: Path) -> None:
    async def body(guard: OpsGuard) -> None:
        raw, key_id = add_key(guard, key=NodeLimits(budget_usd=10 * WORST_USD))
        codes = []
        for i in range(12):
            try:
                adm = await guard.admit(admit_request(raw, f"r{i}"))
            except GatewayError as e:
                codes.append(e.code)
                continue
            await guard.settle(adm, SettledUsage(100, 100, 0, WORST_USD))
        assert codes == ["budget_exceeded"] * 2
        alerts = [(a.kind, a.subject, a.data.get("threshold")) for a in guard.alerter.recent]
        assert alerts == [("budget_threshold", key_id, 0.5), ("budget_threshold", key_id, 0.8),
                          ("budget_threshold", key_id, 1.0), ("budget_refusal", key_id, None)]

    run(kind, request, tmp_path, body)


@pytest.mark.parametrize("kind", STATES)
def test_a_request_shed_from_the_queue_gets_every_charge_back(kind: str, request: pytest.FixtureRequest,
                                                              tmp_path: Path) -> None:
    async def body(guard: OpsGuard) -> None:
        raw, key_id = add_key(guard, key=NodeLimits(priority=9, budget_usd=1.0, rpm=100))
        charge = (key_id, period_key("month", guard.clock()))
        first = await guard.admit(admit_request(raw, "a"))
        with pytest.raises(GatewayError) as err:
            await guard.admit(admit_request(raw, "b", session="s"))
        assert err.value.code == "overloaded"
        assert (await guard.budget_usage([charge]))[charge] == (0.0, pytest.approx(first.reserved_cost_usd))
        await guard.settle(first, SettledUsage(100, 1, 0, 1e-4))
        again = await guard.admit(admit_request(raw, "b", session="s"))  # the shed turn did not count
        assert again.headers["x-ratelimit-remaining-requests"] == "97"  # a shed request was still a request

    run(kind, request, tmp_path, body, admission={"max_in_flight": 1, "max_queue_depth": 0},
        breaker={"max_turns_per_session": 1})
