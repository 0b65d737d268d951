"""Stored Responses answers on a real PostgreSQL server shared by replicas: replicas starting together
create the table once (none fails on a ``DuplicateTable`` race) and a turn saved by one loads on another."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tokenomy.gateway.stores.answers_sql import SqlAnswers
from tokenomy.gateway.stores.pg_tenancy import pg_engine
from tokenomy.gateway.stores.servers import PostgresServer

pytestmark = pytest.mark.integration
REPLICAS = 6


def test_replicas_starting_together_create_the_table_once_and_share_answers(pg_srv: PostgresServer) -> None:
    start = threading.Barrier(REPLICAS)
    made: list[SqlAnswers] = []
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            engine = pg_engine(pg_srv.url)
            start.wait(timeout=30)
            made.append(SqlAnswers(engine, ttl_s=3600.0))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=replica) for _ in range(REPLICAS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(made) == REPLICAS

    async def chain() -> None:
        await made[0].save("resp_1", "org-a", [{"role": "user", "content": "hi"}], [{"type": "message"}])
        got = await made[-1].load("resp_1")
        assert got is not None and got.owner == "org-a" and got.input == [{"role": "user", "content": "hi"}]
        assert await made[-1].load("resp_missing") is None

    asyncio.run(chain())
