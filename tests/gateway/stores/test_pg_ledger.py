"""The ledger on a real PostgreSQL server, written by two "replicas" at once: every request id is
stored exactly once, ``record`` returns only once the event is committed, and a commit that fails
(the server is down) fails its requests instead of dropping their events."""

from __future__ import annotations

import asyncio
import secrets

import pytest
import sqlalchemy as sa

from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.stores.ledger_sql import usage_events
from tokenomy.gateway.stores.pg_ledger import PgLedger, async_pg_url
from tokenomy.gateway.stores.servers import PostgresServer

pytestmark = pytest.mark.integration


def event(rid: str, key: str, cost: float, ts: float = 1_800_000_000.0, session: str = "", turn: int = 0) -> UsageEvent:
    return UsageEvent(rid, ts, f"org/team/{key}", key, "m", "b1", "chat", False, 200, "ok", session, turn,
                      100, 100, 0, 0, 10, 0, 100, cost * 0.5, 0.0, cost * 0.5, cost, 0.0, 0.01, 0.001, 0.1)


def test_two_replicas_record_each_request_once_and_durably(pg_srv: PostgresServer) -> None:
    key = f"k{secrets.token_hex(3)}"

    async def main() -> None:
        a, b = await PgLedger(pg_srv.url).start(), await PgLedger(pg_srv.url).start()
        try:
            # 100 requests, each recorded by one replica and retried by the other (a client retry)
            await asyncio.gather(*(lg.record(event(f"{key}-{i}", key, 0.01))
                                   for i in range(100) for lg in (a, b)))
            # what record acknowledged is visible to any other connection at once
            assert await b.cost(f"{key}-99") == 0.01
            spend = await a.spend_by_key(0.0)
            assert round(spend[key], 9) == 1.0  # 100 x $0.01: no request counted twice
            rows = await b.fetch(UsageFilter(key_id=key))
            assert sorted(r.request_id for r in rows) == sorted(f"{key}-{i}" for i in range(100))
            assert await a.exists(f"{key}-0") and not await a.exists(f"{key}-100")
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_session_state_is_the_last_ok_turn(pg_srv: PostgresServer) -> None:
    key = f"k{secrets.token_hex(3)}"

    async def main() -> None:
        lg = await PgLedger(pg_srv.url).start()
        try:
            for turn in range(3):
                await lg.record(event(f"{key}-t{turn}", key, 0.01, session="s1", turn=turn))
            state = await lg.session_state(key, "s1")
            assert state is not None and state.turn == 2
            assert await lg.session_state(key, "other") is None
        finally:
            await lg.aclose()

    asyncio.run(main())


def test_a_commit_that_fails_fails_its_requests_and_the_ledger_recovers(pg_srv: PostgresServer) -> None:
    key = f"k{secrets.token_hex(3)}"

    async def main() -> None:
        lg = await PgLedger(pg_srv.url, timeout_s=2.0).start()
        try:
            await lg.record(event(f"{key}-before", key, 0.01))
            pg_srv.stop(remove=False)
            try:
                with pytest.raises(Exception):  # noqa: B017 - any driver error: the point is it is not swallowed
                    await lg.record(event(f"{key}-down", key, 0.01))
            finally:
                pg_srv.start()
            await lg.record(event(f"{key}-after", key, 0.01))  # the pool reconnects
            assert await lg.cost(f"{key}-down") is None  # a failed request left no event
            assert await lg.cost(f"{key}-after") == 0.01
        finally:
            await lg.aclose()

    asyncio.run(main())


def test_url_forms() -> None:
    assert async_pg_url("postgresql://u@h:5/db") == "postgresql+asyncpg://u@h:5/db"
    assert async_pg_url("postgres://u@h/db") == "postgresql+asyncpg://u@h/db"
    with pytest.raises(ValueError):
        async_pg_url("sqlite:///x.db")
    assert usage_events.name == "usage_events" and isinstance(usage_events.c.request_id.type, sa.String)
